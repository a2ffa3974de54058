"""The client's own transport (docs/client.md, "Transport"): HTTP/1.1 framing in any
split, kept-alive connections that the server or the network closed, retries that never
send a request twice unless it is idempotent, tokens, and TLS.

Framing and faults the real server does not produce on demand go through the sans-IO
reader and the ``FaultServer`` fault injector; the rest runs against the real server,
through a cuttable proxy (a real network fault) or a TLS-terminating one.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import trustme
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from waymark.client import (
    AsyncClient,
    Client,
    ConnectError,
    RecordEvent,
    RecordIn,
    TombstoneEvent,
    TransportError,
    TransportTimeout,
    http11,
)
from waymark.client import calls as client_calls
from waymark.client import transport as client_transport
from waymark.client.http11 import ResponseReader

from .faults import FaultServer

# --- framing: the sans-IO reader ---------------------------------------------------------

NOISE = [("Server", "uvicorn"), ("x-content-length", "7"), ("X-Transfer-Encoding", "chunked"),
         ("x-connection", "close"), ("Date", "Tue, 24 Nov 2026 07:00:00 GMT")]  # fmt: skip


@st.composite
def answers(draw: st.DrawFn) -> tuple[list[bytes], int, bytes, str]:
    """An answer's bytes cut into pieces anywhere: (pieces, status, body, framing)."""
    status = draw(st.sampled_from([200, 201, 204, 400, 404, 409, 422, 500]))
    body = b"" if status == 204 else draw(st.binary(max_size=600))
    framing = "length" if status == 204 else draw(st.sampled_from(["length", "chunked", "close"]))
    headers = draw(st.lists(st.sampled_from(NOISE), max_size=3))
    name = draw(st.sampled_from(["content-length", "Content-Length", "CONTENT-LENGTH"]))
    wire = body
    if framing == "length":
        headers.append((name, str(len(body))))
    elif framing == "chunked":
        headers.append(("Transfer-Encoding", draw(st.sampled_from(["chunked", "Chunked"]))))
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        wire = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n\r\n"
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    if draw(st.booleans()):
        head = "HTTP/1.1 100 Continue\r\n\r\n" + head
    data = head.encode() + wire
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return pieces, status, body, framing


def read_answer(pieces: list[bytes], status: int, body: bytes, framing: str) -> None:
    reader = ResponseReader()
    for piece in pieces:
        reader.feed(piece)
    if framing == "close":
        assert not reader.complete  # only the close ends it
        reader.eof()
    assert reader.complete
    answer = reader.response()
    assert (answer.status_code, answer.content) == (status, body)
    assert reader.keep_alive == (framing != "close")
    assert answer.headers.get("x-content-length", "7") == "7"


@settings(max_examples=300, deadline=None)
@given(answers())
def test_every_split_of_an_answer_reads_the_same(answer: Any) -> None:
    read_answer(*answer)


def test_a_header_that_merely_ends_with_content_length_is_not_the_framing(
    monkeypatch: pytest.MonkeyPatch, fixed_constants: None
) -> None:
    """Mutant: find a framing header by its name alone, not at a line start."""

    def naive(lower_head: bytes, name: bytes) -> bytes:
        at = lower_head.find(name + b":")
        return b"" if at < 0 else lower_head[at + len(name) + 1 :].split(b"\r\n")[0].strip()

    monkeypatch.setattr(http11, "_value", naive)
    with pytest.raises(AssertionError):
        settings(max_examples=300, deadline=None, derandomize=True, report_multiple_bugs=False)(
            given(answers())(lambda answer: read_answer(*answer))
        )()


def test_bytes_after_an_answer_end_the_connection() -> None:
    reader = ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n")
    assert reader.complete and reader.response().content == b"ok" and not reader.keep_alive


def test_a_close_in_the_middle_of_an_answer_is_an_error() -> None:
    reader = ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")
    with pytest.raises(TransportError, match="middle of the answer"):
        reader.eof()


# --- kept-alive connections and retries: a state machine over the fault injector --------

ACTIONS = ("ok", "ok", "close_idle", "close_header", "drop", "partial")


class Calls:
    """One client, sync or async, called the same way (health is idempotent, append not)."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        if kind == "sync":
            self.client: Any = Client(url, timeout=5)
        else:
            self.loop = asyncio.new_event_loop()
            self.client = AsyncClient(url, timeout=5)

    def __call__(self, idempotent: bool) -> Any:
        call = self.client.health() if idempotent else self.client.append("t", [RecordIn.of(1)])
        return call if self.kind == "sync" else self.loop.run_until_complete(call)

    def close(self) -> None:
        if self.kind == "sync":
            self.client.close()
        else:
            self.loop.run_until_complete(self.client.aclose())
            self.loop.close()


def transport_machine(kind: str) -> type[RuleBasedStateMachine]:
    class Transport(RuleBasedStateMachine):
        """Whatever the server does to a connection, a request the client could not know
        was received is never sent twice unless it is idempotent, a request that met
        only a connection closed while idle still gets its answer, and an answered
        request returns that answer."""

        def __init__(self) -> None:
            super().__init__()
            self.server = FaultServer()
            self.calls = Calls(kind, self.server.url)

        @rule(action=st.sampled_from(ACTIONS), idempotent=st.booleans())
        def request(self, action: str, idempotent: bool) -> None:
            server = self.server
            server.closed.clear()
            server.plan.append(action)
            before = len(server.seen)
            try:
                answer, error = self.calls(idempotent), None
            except TransportError as e:
                answer, error = None, e
            received = len(server.seen) - before
            server.plan.clear()
            if action in ("ok", "close_idle", "close_header"):
                assert error is None and received == 1, (error, received)
                assert answer.status == "ok" if idempotent else answer.seqs == [1]
                if action == "close_idle":  # closed in the client's pool before the next call
                    assert server.closed.wait(5)
            elif action == "partial" or not idempotent:
                assert error is not None and received == 1, (error, received)
            else:  # dropped, idempotent: sent again only on a new connection
                assert (error is None and received == 2) or (error is not None and received == 1)

        def teardown(self) -> None:
            self.calls.close()
            self.server.close()

    return Transport


MACHINE = settings(max_examples=40, stateful_step_count=8, deadline=None)
MUTANT = settings(max_examples=200, stateful_step_count=8, deadline=None, derandomize=True,
                  report_multiple_bugs=False)  # fmt: skip


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_transport_state_machine(kind: str) -> None:
    run_state_machine_as_test(transport_machine(kind), settings=MACHINE)


def idle_check_mutant(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: reuse pooled connections without checking that the server kept them."""
    if kind == "sync":
        monkeypatch.setattr(client_transport, "_readable", lambda sock: False)
    else:
        connection = client_transport._Connection  # noqa: SLF001
        monkeypatch.setattr(connection, "usable", property(lambda self: True))


def retry_after_answer_mutant(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: retry even when part of the answer had arrived."""
    monkeypatch.setattr(ResponseReader, "started", property(lambda self: False))


def retry_anything_mutant(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: treat every request as idempotent (an append could then be sent twice)."""
    route = client_calls._route  # noqa: SLF001
    monkeypatch.setattr(client_calls, "_route", lambda op, path: (*route(op, path)[:2], True))


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    "mutant", [idle_check_mutant, retry_after_answer_mutant, retry_anything_mutant]
)
def test_the_state_machine_catches(
    mutant: Callable[[str, pytest.MonkeyPatch], None],
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    fixed_constants: None,
) -> None:
    mutant(kind, monkeypatch)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(transport_machine(kind), settings=MUTANT)


# --- the real server ----------------------------------------------------------------------


def test_a_connection_the_network_dropped_is_replaced_for_the_next_append(
    proxy: Any, topic: str
) -> None:
    with Client(proxy.url) as client:
        assert client.append(topic, [RecordIn.of(0)]).seqs == [1]
        proxy.cut()  # the pooled connection is gone
        assert client.append(topic, [RecordIn.of(1)]).seqs == [2]
        assert [r.data for r in client.diff(topic, 0).records] == [0, 1]
    assert proxy.connections == 2


async def test_async_a_connection_the_network_dropped_is_replaced(proxy: Any, topic: str) -> None:
    async with AsyncClient(proxy.url) as client:
        assert (await client.append(topic, [RecordIn.of(0)])).seqs == [1]
        proxy.cut()
        await asyncio.sleep(0)  # the event loop learns of the close
        assert (await client.append(topic, [RecordIn.of(1)])).seqs == [2]
    assert proxy.connections == 2


def test_one_client_serves_many_threads(client: Client, topic: str) -> None:
    def write(worker: int) -> list[int]:
        return [client.append(topic, [RecordIn.of([worker, i])]).seqs[0] for i in range(25)]

    with ThreadPoolExecutor(8) as pool:
        seqs = [s for chunk in pool.map(write, range(8)) for s in chunk]
    assert sorted(seqs) == list(range(1, 201))
    page = client.diff(topic, 0, limit=1000)
    assert sorted(tuple(r.data) for r in page.records) == [(w, i) for w in range(8)
                                                            for i in range(25)]  # fmt: skip


# --- tokens -------------------------------------------------------------------------------


@pytest.fixture
def fault_server() -> Iterator[FaultServer]:
    server = FaultServer()
    yield server
    server.close()


def test_token_is_sent_as_a_bearer_header(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WAYMARK_TOKEN", "from-env")
    with Client(fault_server.url, token="s3cret") as client:
        client.health()
    with Client(fault_server.url) as client:
        client.append("t", [RecordIn.of(1)])
    with Client(fault_server.url, token="") as client:  # "": no token, whatever the env
        client.health()
    monkeypatch.delenv("WAYMARK_TOKEN")
    with Client(fault_server.url) as client:
        client.health()
    sent = [seen.headers.get("authorization") for seen in fault_server.seen]
    assert sent == ["Bearer s3cret", "Bearer from-env", None, None]


async def test_async_token_is_sent_as_a_bearer_header(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WAYMARK_TOKEN", "from-env")
    async with AsyncClient(fault_server.url, token="s3cret") as client:
        await client.health()
    async with AsyncClient(fault_server.url) as client:
        await client.health()
    sent = [seen.headers.get("authorization") for seen in fault_server.seen]
    assert sent == ["Bearer s3cret", "Bearer from-env"]


# --- timeouts -----------------------------------------------------------------------------


def test_a_silent_server_times_out(fault_server: FaultServer) -> None:
    fault_server.plan.extend(["ok", "silent"])
    with Client(fault_server.url, timeout=0.3) as client:
        client.health()  # a kept connection, its timeout set
        with pytest.raises(TransportTimeout):
            client.append("t", [RecordIn.of(1)])
        with pytest.raises(TransportTimeout):  # silent from the start, and idempotent
            fault_server.plan.append("silent")
            client.health()
        assert client.health().status == "ok"  # a new connection after the timed out ones
    assert len(fault_server.seen) == 4  # nothing was sent twice


async def test_async_a_silent_server_times_out(fault_server: FaultServer) -> None:
    fault_server.plan.extend(["ok", "silent"])
    async with AsyncClient(fault_server.url, timeout=0.3) as client:
        await client.health()
        with pytest.raises(TransportTimeout):
            await client.append("t", [RecordIn.of(1)])
        assert (await client.health()).status == "ok"
    assert len(fault_server.seen) == 3


# --- TLS ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_proxy(waymark_server: Any, authority: trustme.CA, tmp_path: Any) -> Iterator[Any]:
    """A TLS terminator in front of the real server, with a certificate for localhost
    from a CA the test made; yields (proxy, the CA's PEM file)."""
    from .conftest import CuttableProxy

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    host, port = waymark_server.url.removeprefix("http://").rsplit(":", 1)
    proxy = CuttableProxy((host, int(port)), tls=context)
    yield proxy, str(ca_file)
    proxy.close()


def test_https_with_the_servers_ca_appends_reads_and_watches(tls_proxy: Any, topic: str) -> None:
    proxy, ca_file = tls_proxy
    with Client(proxy.url, ca_file=ca_file) as client:
        assert client.health().status == "ok"
        client.append(topic, [RecordIn.of(i) for i in range(3)])
        assert [r.data for r in client.diff(topic, 0).records] == [0, 1, 2]
        events = client.watch(topic, read_timeout=5)
        assert [next(events).record.seq for _ in range(3)] == [1, 2, 3]
        proxy.cut()  # the watch reconnects, over TLS again
        client.append(topic, [RecordIn.of(3)])
        event = next(events)
        assert isinstance(event, RecordEvent) and event.record.data == 3
        events.close()


def test_https_refuses_a_server_the_store_does_not_trust(tls_proxy: Any) -> None:
    proxy, _ = tls_proxy
    with Client(proxy.url, timeout=5) as client, pytest.raises(ConnectError, match="CERTIFICATE"):
        client.health()


def test_ca_file_is_for_https_only() -> None:
    with pytest.raises(ValueError, match="https"):
        Client("http://localhost:1", ca_file="ca.pem")


async def test_async_https_with_the_servers_ca(tls_proxy: Any, topic: str) -> None:
    proxy, ca_file = tls_proxy
    async with AsyncClient(proxy.url, ca_file=ca_file) as client:
        await client.append(topic, [RecordIn.of(0)], create=True)
        await client.put_topic(topic)
        page = await client.diff(topic, 0)
        assert [r.data for r in page.records] == [0]
        events = client.watch(topic, read_timeout=5)
        first = await anext(events)
        assert not isinstance(first, TombstoneEvent) and first.record.data == 0
        await events.aclose()
    async with AsyncClient(proxy.url, timeout=5) as untrusting:
        with pytest.raises(ConnectError, match="CERTIFICATE"):
            await untrusting.health()


def test_a_large_body_goes_out_whole_after_its_head(client: Client, topic: str) -> None:
    big = ["x" * 100_000 for _ in range(4)]  # a 400 kB body: sent apart from its head
    assert client.append(topic, [RecordIn.of(s) for s in big]).seqs == [1, 2, 3, 4]
    assert [r.data for r in client.diff(topic, 0).records] == big


async def test_async_a_large_body_goes_out_whole(waymark_server: Any, topic: str) -> None:
    big = ["y" * 100_000 for _ in range(4)]
    async with AsyncClient(waymark_server.url) as client:
        assert (await client.append(topic, [RecordIn.of(s) for s in big])).seqs == [1, 2, 3, 4]
        assert [r.data for r in (await client.diff(topic, 0)).records] == big


async def test_async_requests_beyond_the_cap_wait_for_a_connection(proxy: Any, topic: str) -> None:
    async with AsyncClient(proxy.url) as client:
        written = await asyncio.gather(*(client.append(topic, [RecordIn.of(i)])
                                         for i in range(150)))  # fmt: skip
        assert sorted(w.seqs[0] for w in written) == list(range(1, 151))
        assert 1 < proxy.connections <= 100
        again = await asyncio.gather(*(client.get_topic(topic) for _ in range(100)))
        assert {state.head_seq for state in again} == {150}
    assert proxy.connections <= 100  # the second burst reused the kept connections
