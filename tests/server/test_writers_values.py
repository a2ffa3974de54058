"""A stage may carry records that hold data alone as their data values, with each
value's length as the sender joined it (``data`` + ``lengths``, docs/http-api.md, "Sink
stages"): the Spark sink sends its rows so and never parses them. What such a stage
keeps is byte for byte what the same records sent as ``{"data":..}`` objects and
staged one by one keep; a joined array that does not split into the sender's values —
a row that is two values, two rows that make one — is refused and keeps nothing. Each
guard broken on purpose (a mutant) is caught.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.server.test_writers_plain import (
    LIMITS,
    MUTANT,
    SETTINGS,
    _data,
    _one_by_one,
    _stage_body,
    _staged,
)

from waymark.client import ApiError, Client
from waymark.log import records as records_module
from waymark.log.errors import TopicError
from waymark.log.records import PlainRecords
from waymark.protocol import ErrorCode, StagedPart
from waymark.server import writers as server_writers
from waymark.server.writers import decode_stage

_HEAD = b'{"writer":"w","epoch":1,"batch_id":0,"partition":0,"attempt":0,'
# Half test_writers_plain's examples: the data it draws from is the same, checked there.
VALUES = settings(SETTINGS, max_examples=100)


def _values_body(values: list[bytes], lengths: list[int] | None = None) -> bytes:
    sent = [len(v) for v in values] if lengths is None else lengths
    packed = base64.b64encode(struct.pack(f"<{len(sent)}I", *sent))
    return _HEAD + b'"data":[' + b",".join(values) + b'],"lengths":"' + packed + b'"}'


def _as_records(values: list[bytes]) -> bytes:
    return _stage_body([b'{"data":' + v + b"}" for v in values])


def _bulk(body: bytes) -> object:
    return decode_stage(body, LIMITS)


@example(values=[b'{"id":"1e5f3a","n":7}', b'"9E"', b'{"1e5":"2e"}'])
@example(values=[b'"9e"', b"1e999"])
@example(values=[b'{"data":1}', b"[]", b'""'])
@given(values=st.lists(_data, min_size=1, max_size=12))
@VALUES
def test_values_are_kept_as_their_records_one_by_one(values: list[bytes]) -> None:
    """Compact, spaced, escaped, infinite, too large, bad UTF-8: kept or refused as the
    records ``{"data":value}`` are."""
    assert _staged(_values_body(values), _bulk) == _staged(_as_records(values), _one_by_one)


# What a careless or hostile producer may put in a row: not one JSON value but a
# fragment, which joined beside another can make a valid array of other values.
_fragments = st.sampled_from([b"[1", b"2]", b"1,2", b"{", b"}", b'"a', b'b"', b"", b'{"a":1',
                              b'"x":2}', b"3,", b",4", b"]", b"["])  # fmt: skip
_rows = st.lists(st.one_of(_data, _fragments, _fragments), min_size=1, max_size=8)


def _one_value(row: bytes) -> bool:
    try:
        msgspec.json.decode(row, type=msgspec.Raw)  # one value (if maybe not readable)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return False
    return True


@example(rows=[b"[1", b"2]", b"3,4"])  # one row too few, then one too many: as many values
@example(rows=[b'"a', b'b"'])
@example(rows=[b"1,2", b"3"])
@given(rows=_rows)
@VALUES
def test_rows_that_do_not_split_into_one_value_each_are_refused(rows: list[bytes]) -> None:
    """Rows joined as sent, each with its own length: a stage either keeps each row as
    one record, the row as it was, or is refused whole."""
    outcome = _staged(_values_body(rows), _bulk)
    if all(map(_one_value, rows)):
        assert outcome == _staged(_as_records(rows), _one_by_one)
    else:
        assert outcome in (ErrorCode.INVALID_REQUEST, "undecodable"), outcome


def test_the_sink_s_values_take_the_bulk_path() -> None:
    values = [b'{"user":"u-%d","page":"/p/%d","ok":true}' % (i, i) for i in range(500)]
    _, records = decode_stage(_values_body(values), LIMITS)
    assert isinstance(records, PlainRecords)
    assert records.joined() == b"".join(b',"data":%b}' % v for v in values)
    assert records.sizes().tolist() == list(map(len, values))


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (_values_body([b"1", b"2"], [1]), "holds 2 values where 'lengths' gives 1"),
        (_values_body([b"[1,2]"], [2, 2]), "holds 1 values where 'lengths' gives 2"),
        (_values_body([b"12", b"3"], [1, 2]), "data value 0 is 2 bytes as parsed"),
        (_HEAD + b'"data":[1],"lengths":"AQA="}', "not base64 of little-endian uint32s"),
        (_HEAD + b'"data":[1],"lengths":"**"}', "not base64 of little-endian uint32s"),
        (_HEAD + b'"data":[1]}', "'lengths' goes with 'data'"),
        (_HEAD + b'"records":[],"lengths":"AQAAAA=="}', "'lengths' goes with 'data'"),
        (_HEAD + b'"records":[{"data":1}],"data":[1],"lengths":"AQAAAA=="}', "exactly one"),
        (_HEAD + b'"chunk":0}', "exactly one"),
    ],
)
def test_a_malformed_values_stage_is_refused(body: bytes, says: str) -> None:
    with pytest.raises(TopicError, match=says) as refused:
        decode_stage(body, LIMITS)
    assert refused.value.code is ErrorCode.INVALID_REQUEST


def _lengths_unchecked(measured: Any, lengths: str) -> None:
    return None


def _bodies_from_the_last_byte(array: bytes, lengths: Any) -> bytes:
    """Each value cut one byte late: the comma after it kept, its first byte lost."""
    out, at = [], 1
    for n in lengths.tolist():
        out.append(b',"data":' + array[at + 1 : at + n + 1] + b"}")
        at += n + 1
    return b"".join(out)


@pytest.mark.parametrize("mutant", ["lengths", "canonical", "readable", "bodies"])
def test_each_broken_guard_is_caught(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mutant == "lengths":  # the values as parsed trusted, whatever the sender joined
        monkeypatch.setattr(server_writers, "_check_split", _lengths_unchecked)
    elif mutant == "bodies":
        monkeypatch.setattr(records_module, "_bodies_of_values", _bodies_from_the_last_byte)
    else:
        monkeypatch.setattr(records_module, f"_{mutant}", lambda *_: True)

    @example(rows=[b"[1", b"2]", b"3,4"])
    @example(rows=[b'{"a": 1}', b"2"])
    @given(rows=_rows)
    @MUTANT
    def same(rows: list[bytes]) -> None:
        test_rows_that_do_not_split_into_one_value_each_are_refused.hypothesis.inner_test(rows)  # type: ignore[attr-defined]

    with pytest.raises(AssertionError):
        same()


def test_values_staged_through_the_client_publish_as_the_rows(waymark_server: Any) -> None:
    """The shipped client's ``stage_data``, a real server: published, the records read
    back are the rows; a stage whose rows do not split so is refused and keeps nothing."""
    with Client(waymark_server.url) as client:
        _stage_and_publish(client, "values-through-the-client")


def _stage_and_publish(client: Client, topic: str) -> None:
    rows = [b'{"n":%d,"s":"a,b"}' % i for i in range(300)] + [b"[1,2]", b'"x"', b"3"]
    epoch = client.open_writer(f"values-{topic}").epoch
    head = {"writer": f"values-{topic}", "epoch": epoch, "batch_id": 0, "attempt": 0}
    staged = client.stage_data(topic, b",".join(rows), [len(r) for r in rows], partition=0,
                               **head)  # fmt: skip
    assert staged.staged == len(rows) and staged.accepted
    forged = [b"[1", b"2]", b"3,4"]
    with pytest.raises(ApiError) as refused:
        client.stage_data(topic, b",".join(forged), [len(r) for r in forged], partition=1,
                          **head)  # fmt: skip
    assert refused.value.code is ErrorCode.INVALID_REQUEST
    assert "does not split" in str(refused.value)
    (state,) = [w for w in client.list_writers() if w.writer == head["writer"]]
    assert [t.staged_parts for t in state.topics] == [1]  # the refused part kept nothing
    published = client.publish(topic, writer=head["writer"], epoch=epoch, batch_id=0,
                               parts=[StagedPart(0, 0, 1)])  # fmt: skip
    assert published.count == len(rows)
    read = client.diff(topic, published.first_seq - 1, limit=len(rows))
    assert [r.data for r in read.records] == [msgspec.json.decode(r) for r in rows]
