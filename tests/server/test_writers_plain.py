"""A stage body whose records carry data alone (the Spark sink's) is read and checked in
bulk, as columnar ``PlainRecords`` (docs/http-api.md, "Sink speed"): what the bulk path
stages is byte for byte what decoding the body record by record and ``encode_batch``
stage, and anything it cannot prove — whitespace, escapes, a number maybe infinite, bad
UTF-8, a record over the limit, another field — goes the record-by-record way, which
refuses it with the same error. Each guard broken on purpose (a mutant) is caught.
"""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from waymark.log import records as records_module
from waymark.log.errors import TopicError
from waymark.log.records import PlainRecords, encode_batch
from waymark.protocol import Limits
from waymark.server import writers as server_writers
from waymark.server.writers import decode_stage

LIMITS = Limits(max_record_bytes=200)
SETTINGS = settings(max_examples=200, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
# A mutant only needs to be found, not shrunk: the hunt stops at the first failure.
MUTANT = settings(SETTINGS, max_examples=400, phases=[Phase.explicit, Phase.generate])

# Text that looks like what the bulk path cuts at or must refuse.
_tricky = st.sampled_from(['},{"data":', "},{", " ", "\t", "\\", '\\"', "é", "\U0001f600",
                           "\\ud800", "1e5", "x"])  # fmt: skip
_text = st.lists(st.one_of(_tricky, st.text(max_size=4)), max_size=4).map("".join)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | _text
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=3)
    | st.lists(st.dictionaries(st.sampled_from(["data", "a"]), inner, max_size=2), max_size=3),
    max_leaves=10,
)  # fmt: skip
# Data JSON text as a client may send it: compact, spaced, or with what a reader cannot
# decode (an infinite number, a lone surrogate, invalid UTF-8) or that is over the limit.
_data = st.one_of(
    _json.map(lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode()),
    _json.map(lambda v: json.dumps(v).encode()),
    _json.map(lambda v: json.dumps(v, separators=(",", ":")).encode()),
    st.sampled_from([b"1e999", b"-1E400", b"9" * 309, b"1" * 250, b'"\\ud800"', b'"\xff"',
                     b'"' + b"a" * 199 + b'"', b"12", b'{"data":1}']),
)  # fmt: skip


def _record(data: bytes, shape: str) -> bytes:
    if shape == "spaced":
        return b'{ "data": ' + data + b" }"
    if shape == "tagged":
        return b'{"data":' + data + b',"tag":"t"}'
    if shape == "escaped key":
        return b'{"d\\u0061ta":' + data + b"}"
    return b'{"data":' + data + b"}"


def _stage_body(records: list[bytes]) -> bytes:
    head = b'{"writer":"w","epoch":1,"batch_id":0,"partition":0,"attempt":0,"records":'
    return head + b"[" + b",".join(records) + b"]}"


@st.composite
def stage_bodies(draw: st.DrawFn) -> bytes:
    datas = draw(st.lists(_data, min_size=1, max_size=12))
    shapes = ["plain"] * 6 + ["spaced", "tagged", "escaped key"]
    return _stage_body([_record(d, draw(st.sampled_from(shapes))) for d in datas])


def _staged(body: bytes, decode: object) -> object:
    """What a stage of ``body`` keeps (its records' bodies, sizes, node, tag, id) or the
    code it is refused with."""
    try:
        _, records = decode(body)  # type: ignore[operator]
        if isinstance(records, PlainRecords):
            encoded = list(records)
        else:
            encoded = encode_batch(records, LIMITS)
    except TopicError as refused:
        return refused.code
    except (msgspec.DecodeError, UnicodeDecodeError):
        return "undecodable"
    return [(r.body, r.size, r.node, r.tag, r.id) for r in encoded]


def _one_by_one(body: bytes) -> object:
    decoded = server_writers._stage.decode(body)  # noqa: SLF001 -- the record-by-record way
    return decoded, decoded.records


def _bulk(body: bytes) -> object:
    return decode_stage(body, LIMITS)


# The key given twice, and data holding the separator the bulk path cuts at, just enough
# of it for the array's length to come out as if it were bare: only the length check
# (_bare) and the array's head (where the first record's data is) tell this from 21
# plain records.
_TWICE = (b'{"writer":"w","epoch":1,"batch_id":0,"partition":0,"attempt":0,"records":[{"data":'
          b'0,"data":[' + b",".join([b'{"data":0}'] * 10) + b"]}]}")  # fmt: skip
# The key given twice in a later record: only the length check tells where it is cut.
_TWICE_LATER = (b'{"writer":"w","epoch":1,"batch_id":0,"partition":0,"attempt":0,"records":'
                b'[{"data":1},{"data":2,"data":3},{"data":4}]}')  # fmt: skip


# Hex ids (a digit before an "e" in a string: no exponent) beside numbers with one,
# infinite or not, at the top, in arrays, as values of hex keys, after a record's string.
_HEX_IDS = _stage_body(
    [_record(d, "plain") for d in (b'{"id":"1e5f3a","n":7}', b'"9E"', b'{"1e5":"2e"}')]
)
_HEX_AND_EXPONENTS = [
    _stage_body([_record(d, "plain") for d in datas])
    for datas in ([b'"9e"', b"1e999"], [b'["1e5f",-1E400]'], [b'{"1e5":2E400}'],
                  [b'{"id":"3e","n":1e5}', b'"0e"'])
]  # fmt: skip


@example(body=_TWICE)
@example(body=_TWICE_LATER)
@example(body=_HEX_IDS)
@example(body=_HEX_AND_EXPONENTS[0])
@example(body=_HEX_AND_EXPONENTS[1])
@example(body=_HEX_AND_EXPONENTS[2])
@example(body=_HEX_AND_EXPONENTS[3])
@given(body=stage_bodies())
@SETTINGS
def test_a_stage_is_kept_in_bulk_as_record_by_record(body: bytes) -> None:
    assert _staged(body, _bulk) == _staged(body, _one_by_one)


def test_the_sink_s_records_take_the_bulk_path() -> None:
    """Compact data without escapes or exponents, as the sink sends them: no object per
    record is staged."""
    datas = [b'{"user":"u-%d","page":"/p/%d","ok":true}' % (i, i) for i in range(500)]
    body = (b'{"writer":"w","epoch":1,"batch_id":0,"partition":0,"attempt":0,"records":['
            + b",".join(b'{"data":%b}' % d for d in datas) + b"]}")  # fmt: skip
    _, records = decode_stage(body, LIMITS)
    assert isinstance(records, PlainRecords)
    assert records.joined() == b"".join(b',"data":%b}' % d for d in datas)
    assert records.sizes().tolist() == list(map(len, datas))
    assert list(records[10:12]) == list(records)[10:12]


def test_hex_ids_in_strings_take_the_bulk_path() -> None:
    """A digit before an "e" inside a string is no exponent: nothing to parse."""
    _, records = decode_stage(_HEX_IDS, LIMITS)
    assert isinstance(records, PlainRecords)


def _no_cut_check(array: bytes, bounds: np.ndarray) -> bytes | None:
    return b"," + array[2:-1].replace(b'},{"data":', b'},"data":')


@pytest.mark.parametrize("mutant", ["bare", "canonical", "readable", "cut", "limit"])
def test_each_broken_guard_is_caught(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mutant == "cut":  # a separator inside data cut as if it were a record's start
        monkeypatch.setattr(records_module, "_cut", _no_cut_check)
    elif mutant == "limit":  # records over max_record_bytes kept
        monkeypatch.setattr(server_writers, "decode_stage",
                            lambda body, limits: decode_stage(body, Limits()))  # fmt: skip
    else:
        monkeypatch.setattr(records_module, f"_{mutant}", lambda *_: True)

    @example(body=_TWICE)
    @example(body=_TWICE_LATER)
    @given(body=stage_bodies())
    @MUTANT
    def same(body: bytes) -> None:
        bulk = _staged(body, lambda b: server_writers.decode_stage(b, LIMITS))
        assert bulk == _staged(body, _one_by_one)

    with pytest.raises(AssertionError):
        same()
