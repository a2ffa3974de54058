"""The client's own HTTP/1.1 reader against h11 as the oracle (docs/client.md,
"Transport").

``waymark.client.http11.ResponseReader`` is a protocol implementation of our own (it is
faster than httpx, issue 28), so it is checked against one that is not: every
generated response — Content-Length, chunked (sizes, extensions, trailers), read to
the close, interim 1xx, HTTP/1.0, ``Connection: close`` — is fed to both, cut at
every byte boundary and in random pieces, and they must agree: the same status, body
and keep-alive verdict, or both refuse it. Bad framing (a malformed or signed chunk
size, a chunk without its CRLF, a malformed or conflicting Content-Length, a close in
the middle) must be refused by both.
"""

from __future__ import annotations

from dataclasses import dataclass

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waymark.client.errors import ProtocolError
from waymark.client.http11 import ResponseReader

Outcome = tuple[object, ...]  # ("ok", status, body, keep_alive) | ("refused",) | ("incomplete",)


def ours(pieces: list[bytes], eof: bool) -> Outcome:
    """What the client's reader makes of ``pieces``, read as its transports read: until
    the answer is complete, then the close if there is one."""
    reader = ResponseReader()
    try:
        for piece in pieces:
            if reader.complete:
                break
            reader.feed(piece)
        if not reader.complete and eof:
            reader.eof()
    except ProtocolError:
        return ("refused",)
    if not reader.complete:
        return ("incomplete",)
    response = reader.response()
    return ("ok", response.status_code, response.content, reader.keep_alive)


def oracle(pieces: list[bytes], eof: bool) -> Outcome:
    """What h11, as the client of one GET, makes of the same bytes."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "waymark")]))
    conn.send(h11.EndOfMessage())
    status = 0
    body: list[bytes] = []
    closed = False
    try:
        for piece in [*filter(None, pieces), b""] if eof else filter(None, pieces):
            conn.receive_data(piece)  # b"" is the close to h11
            closed = piece == b""
            while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
                if isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body.append(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    # A body read to the close ends with the connection.
                    keep_alive = conn.their_state is h11.DONE and not closed
                    return ("ok", status, b"".join(body), keep_alive)
    except h11.RemoteProtocolError:
        return ("refused",)
    return ("incomplete",)


@dataclass(frozen=True)
class Answer:
    """One generated response: its bytes, and whether the server closes after it."""

    wire: bytes
    close: bool
    bad: str = ""  # the framing fault, if any


BODY = st.binary(max_size=48)
TOKEN = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=8)


@st.composite
def chunked(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` as chunks of drawn sizes, hex in either case with leading zeros,
    extensions and trailers."""
    out = bytearray()
    at = 0
    while at < len(body):
        n = draw(st.integers(1, len(body) - at))
        size = format(n, draw(st.sampled_from(["x", "X"]))).zfill(draw(st.integers(1, 4)))
        ext = draw(st.sampled_from(["", ";x=1", ';name="v"']))
        out += f"{size}{ext}\r\n".encode() + body[at : at + n] + b"\r\n"
        at += n
    out += b"0\r\n"
    for name in draw(st.lists(TOKEN, max_size=2)):
        out += f"x-{name}: t\r\n".encode()
    return bytes(out + b"\r\n")


@st.composite
def answers(draw: st.DrawFn, faults: bool = False) -> Answer:
    version = draw(st.sampled_from(["1.1", "1.1", "1.0"]))
    status = draw(st.sampled_from([200, 201, 204, 304, 400, 404, 409, 500, 503]))
    connection = draw(st.sampled_from(["", "", "close", "keep-alive"]))
    framing = (
        "none" if status in (204, 304) else draw(st.sampled_from(["length", "chunked", "close"]))
    )
    body = b"" if framing == "none" else draw(BODY)
    headers = [f"content-type: {draw(st.sampled_from(['application/json', 'text/event-stream']))}"]
    headers += [
        f"x-{name}: {value}" for name, value in draw(st.lists(st.tuples(TOKEN, TOKEN), max_size=2))
    ]
    if connection:
        headers.append(f"{draw(st.sampled_from(['Connection', 'connection']))}: {connection}")
    payload = body
    bad = ""
    if framing == "length":
        headers.append(
            f"{draw(st.sampled_from(['Content-Length', 'content-length']))}: {len(body)}"
        )
    elif framing == "chunked":
        headers.append(
            f"{draw(st.sampled_from(['Transfer-Encoding', 'transfer-encoding']))}: chunked"
        )
        payload = draw(chunked(body))
    if faults:
        kinds = ["truncated"]
        if framing == "length":
            kinds += ["length-not-digits", "length-signed", "two-lengths"]
        if framing == "chunked" and body:
            kinds += ["size-not-hex", "size-signed", "size-underscore", "no-crlf-after-data"]
        bad = draw(st.sampled_from(kinds))
        if bad == "length-not-digits":
            headers[-1] = "content-length: 1a"
        elif bad == "length-signed":
            headers[-1] = f"content-length: +{len(body)}"
        elif bad == "two-lengths":
            headers.append(f"content-length: {len(body) + 1}")
        elif bad in ("size-not-hex", "size-signed", "size-underscore"):
            first = payload.index(b"\r\n")
            size = {"size-not-hex": b"zz", "size-signed": b"-1", "size-underscore": b"0_1"}[bad]
            payload = size + payload[first:]
        elif bad == "no-crlf-after-data":
            first = payload.index(b"\r\n") + 2
            n = int(payload[:first].split(b";")[0], 16)
            payload = payload[: first + n] + b"XY" + payload[first + n + 2 :]
    head = f"HTTP/{version} {status} Reason\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n"
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" if draw(st.booleans()) and version == "1.1" else b""
    wire = interim + head.encode() + payload
    if bad == "truncated":
        cut = draw(st.integers(0, len(wire) - 1))
        if framing == "close" and cut >= len(interim) + len(head):
            cut = len(interim) + len(head) - 1  # a shorter close-delimited body is a body
        wire = wire[:cut]
    return Answer(wire, close=framing == "close" or bool(bad), bad=bad)


def every_split(answer: Answer) -> list[tuple[list[bytes], Outcome, Outcome]]:
    """Both readers' outcomes for the answer in one piece and cut at every byte."""
    results = []
    for cut in range(len(answer.wire) + 1):
        pieces = [answer.wire[:cut], answer.wire[cut:]]
        results.append((pieces, ours(pieces, answer.close), oracle(pieces, answer.close)))
    return results


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(answers())
def test_well_framed_answers_read_as_h11_reads_them_at_every_cut(answer: Answer) -> None:
    for pieces, got, expected in every_split(answer):
        assert got == expected, (answer.wire, pieces)
        assert got[0] == "ok"


@FAST
@given(answers(), st.data())
def test_answers_in_random_pieces_read_as_in_one(answer: Answer, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(answer.wire)), max_size=8)))
    pieces = [answer.wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer.wire)], strict=True)]
    assert (
        ours(pieces, answer.close)
        == oracle(pieces, answer.close)
        == ours([answer.wire], answer.close)
    )


@FAST
@given(answers(faults=True))
def test_bad_framing_is_refused_by_both_at_every_cut(answer: Answer) -> None:
    for pieces, got, expected in every_split(answer):
        assert got == expected, (answer.bad, answer.wire, pieces)
        assert got[0] == "refused", (answer.bad, answer.wire)


def test_keep_alive_answers_follow_one_another_on_one_connection() -> None:
    # Three answers on one kept connection, each read by a new reader (as the
    # transports do, one per request) and by one h11 connection cycling.
    wires = [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    ]
    conn = h11.Connection(h11.CLIENT)
    for n, wire in enumerate(wires):
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "waymark")]))
        conn.send(h11.EndOfMessage())
        conn.receive_data(wire)
        events = []
        while (event := conn.next_event()) is not h11.NEED_DATA and event is not h11.PAUSED:
            events.append(event)
        body = b"".join(e.data for e in events if isinstance(e, h11.Data))
        keep = conn.their_state is h11.DONE
        assert ours([wire], eof=False) == ("ok", events[0].status_code, body, keep)
        if n < len(wires) - 1:
            conn.start_next_cycle()
    assert not keep  # the last one said close


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0_1\r\nx\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n+1\r\nx\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\naXY1\r\nb\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc",
    ],
    ids=["chunk-size-underscore", "chunk-size-signed", "chunk-without-crlf", "two-lengths"],
)
def test_the_framing_faults_found_against_h11_are_refused(wire: bytes) -> None:
    # What this test found the reader accepting and h11 refusing: each was read as a
    # body ("x", "x", "ab", "ab") the server's framing did not say.
    assert oracle([wire], eof=True) == ("refused",)
    assert ours([wire], eof=True) == ("refused",)
