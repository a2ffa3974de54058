"""A large append's body decoded a piece of records at a time gives exactly what decoding
it whole gives (docs/security.md, Limits): the same records, the same other fields, the
same refusal. The decoder is cut to pieces of a few dozen bytes here, so every body is
many pieces and every cut guess (inside strings, inside nested arrays of objects) is met.

Each guard broken on purpose (a mutant) makes the equivalence fail.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from waymark.protocol import AppendRequest, RecordIn
from waymark.protocol.errors import WaymarkError
from waymark.server import pieces
from waymark.server.http import BodyDecoder
from waymark.server.pieces import AppendDecoder

SETTINGS = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
# A mutant only needs to be found, not shrunk: the hunt stops at the first failure.
MUTANT = settings(SETTINGS, max_examples=300, phases=[Phase.generate])
PIECE = 48  # bytes: a body of a few hundred bytes is many pieces

# Text that looks like the cuts the decoder guesses: a record boundary, an array end.
_tricky = st.sampled_from(['},{"', '},{"data":1}', "]", '"]}', "\\", "é", "\U0001f600", "x"])
_text = st.lists(st.one_of(_tricky, st.text(max_size=5)), max_size=4).map("".join)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=3)
    | st.lists(st.dictionaries(st.sampled_from(["data", "a"]), inner, max_size=2), max_size=3),
    max_leaves=12,
)  # fmt: skip
_record = st.fixed_dictionaries(
    {"data": _json},
    optional={"tag": _text, "id": st.text("abc", min_size=1, max_size=4),
              "meta": st.dictionaries(st.sampled_from(["k", "v"]), _text, max_size=2)},
)  # fmt: skip
# What may follow the records array: other fields, again "records" (the last one wins),
# an escaped "records", whitespace, and what does not parse.
_tail = st.sampled_from([
    "}", "}\n", ' ,"create":true}', ',"config":{"ttl_ms":5}}', ',"create":false,"config":{}}',
    ',"records":[{"data":"later"}]}', ',"rec\\u006frds":[{"data":2}]}', ',"records":[]}',
    ',"config":{"ttl_ms":-1}}', ',"other":1}', "", "]}", ',"create":true',
])  # fmt: skip


@st.composite
def append_bodies(draw: st.DrawFn) -> bytes:
    records = draw(st.lists(_record, min_size=1, max_size=12))
    separator = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    array = json.dumps(records, separators=separator, ensure_ascii=draw(st.booleans()))
    return b'{"records":' + array[:-1].encode() + b"]" + draw(_tail).encode()


def _where(body: bytes, data: st.DataObject) -> int:
    """A byte of ``body`` to change: often the comma between two records."""
    commas = [m.start() + 1 for m in re.finditer(rb"\},\{", body)]
    if commas and data.draw(st.booleans()):
        return data.draw(st.sampled_from(commas))
    return data.draw(st.integers(0, len(body) - 1))


def _outcome(decode: Callable[[bytes], AppendRequest], body: bytes) -> tuple[str, Any]:
    try:
        return "ok", msgspec.json.encode(decode(body))
    except WaymarkError as error:
        return "refused", (error.code, str(error))
    except msgspec.DecodeError as error:
        return "refused", str(error)


def _check_same(decoder: AppendDecoder, body: bytes) -> None:
    whole = BodyDecoder(AppendRequest)
    assert _outcome(decoder.decode, body) == _outcome(whole.decode, body), body


def test_a_body_decoded_in_pieces_is_the_body_decoded_whole() -> None:
    decoder = AppendDecoder(piece_bytes=PIECE)
    cut = [0]

    @given(append_bodies(), st.data())
    @SETTINGS
    def same(body: bytes, data: st.DataObject) -> None:
        _check_same(decoder, body)
        if decoder._in_pieces(body) is not None:
            cut[0] += 1
        # Any byte changed: a refused body is refused with the same error.
        at = _where(body, data)
        byte = data.draw(st.sampled_from([b"}", b"]", b",", b'"', b"\xff", b" ", b"{", b"[",
                                          b"],[", b'],"records":[']))  # fmt: skip
        _check_same(decoder, body[:at] + byte + body[at + 1 :])

    same()
    assert cut[0] > 30, cut  # most bodies really were decoded in pieces


def test_a_large_body_is_decoded_a_mebibyte_at_a_time() -> None:
    """Each msgspec call holds the GIL throughout: a 5 MB body is decoded in calls over
    about a MiB each, never in one call over the whole (the event loop waited through
    that one: 60-130 ms for 50 MB)."""
    record = b'{"data":{"k":"%b"},"tag":"t"}' % (b"x" * 5_000)
    body = b'{"records":[' + b",".join([record] * 1_000) + b'],"create":true}'
    decoder = AppendDecoder()
    sizes: list[int] = []
    for name in ("_whole", "_piece", "_rest"):
        setattr(decoder, name, _Measured(getattr(decoder, name), sizes))
    decoded = decoder.decode(body)
    assert msgspec.json.encode(decoded) == msgspec.json.encode(
        BodyDecoder(AppendRequest).decode(body)
    )
    assert decoded.create is True and len(decoded.records) == 1_000
    assert len(sizes) >= 4 and max(sizes) < pieces.PIECE_BYTES + 2 * len(record), sizes


class _Measured:
    """A decoder that notes the size of every body it is given."""

    def __init__(self, decoder: Any, sizes: list[int]) -> None:
        self.decoder, self.sizes = decoder, sizes

    def decode(self, body: bytes) -> Any:
        self.sizes.append(len(body))
        return self.decoder.decode(body)


def _skip_a_failed_piece(self: AppendDecoder, body: bytes) -> AppendRequest | None:
    """A mutant cut loop: a piece that does not decode is left out, not retried."""
    found = self._tail(body)
    if found is None:
        return None
    end, rest = found
    records: list[Any] = []
    start = len(pieces.HEAD)
    while start < end:
        cut = body.find(pieces._CUT, start + self.piece_bytes, end)
        stop = end if cut < 0 else cut + 1
        with contextlib.suppress(*pieces._REFUSED):
            records += self._records(body, start, stop)
        start = end if cut < 0 else cut + 2
    return msgspec.structs.replace(rest, records=records)


@pytest.mark.parametrize("mutant", ["tail_ignored", "failed_piece_skipped", "arrays_not_counted"])
def test_each_broken_guard_is_caught(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = AppendDecoder(piece_bytes=PIECE)
    if mutant == "arrays_not_counted":  # a piece holding "],[" taken as its first array
        piece = msgspec.json.Decoder(list[list[RecordIn]])
        monkeypatch.setattr(decoder, "_piece", _FirstArray(piece))
    elif mutant == "tail_ignored":  # the fields after the array not decoded
        real_tail = AppendDecoder._tail

        def tail(self: AppendDecoder, body: bytes) -> tuple[int, AppendRequest] | None:
            found = real_tail(self, body)
            return None if found is None else (found[0], AppendRequest([]))

        monkeypatch.setattr(AppendDecoder, "_tail", tail)
    elif mutant == "failed_piece_skipped":
        monkeypatch.setattr(AppendDecoder, "_in_pieces", _skip_a_failed_piece)

    @given(append_bodies(), st.data())
    @MUTANT
    def same(body: bytes, data: st.DataObject) -> None:
        _check_same(decoder, body)
        at = _where(body, data)
        _check_same(decoder, body[:at] + b"],[" + body[at + 1 :])

    with pytest.raises(AssertionError):
        same()


class _FirstArray:
    """A mutant piece decoder: a piece that holds more than one array gives its first."""

    def __init__(self, decoder: msgspec.json.Decoder[list[list[RecordIn]]]) -> None:
        self.decoder = decoder

    def decode(self, body: bytes) -> list[list[RecordIn]]:
        return self.decoder.decode(body)[:1]
