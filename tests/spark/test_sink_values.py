"""Rows that carry data alone as JSON text are staged as their data values with their
lengths, unparsed by the task (docs/spark.md, "Exactly-once topic sink"): through the
sink's own stager (``TopicBatchSink``, the foreachBatch helper) against a real server,
they are published as the rows, in row order beside rows staged as records, and a row
that is not exactly one JSON value fails the batch naming the row, with nothing
published.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waymark.client import Client
from waymark.spark import sink
from waymark.spark.encoding import encode_values, value_lengths, values_only
from waymark.spark.sink import TopicBatchSink

# No Spark session here: a group of its own, not a Spark group's worker (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("tests/spark/test_sink_values.py")


def _batch(data: list[str], tags: list[str | None] | None = None, **more: Any) -> pa.RecordBatch:
    columns = {"data": pa.array(data, pa.string())}
    if tags is not None:
        columns["tag"] = pa.array(tags, pa.string())
    columns.update(more)
    return pa.RecordBatch.from_pydict(columns)


def test_which_batches_are_staged_as_values() -> None:
    assert values_only(_batch(['{"a":1}']))
    assert values_only(_batch(["1"], [None]))  # a tag column with no tag in it
    assert not values_only(_batch(["1"], ["t"]))
    meta = pa.array([[("k", "v")]], pa.map_(pa.string(), pa.string()))
    assert not values_only(_batch(["1"], meta=meta))
    assert not values_only(pa.RecordBatch.from_pydict({"data": pa.array([{"x": 1}])}))


@given(st.lists(st.text(max_size=6).map(lambda t: msgspec.json.encode(t).decode()),
                min_size=1, max_size=20))  # fmt: skip
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_values_and_their_lengths_are_the_rows(rows: list[str]) -> None:
    topics = pa.array(["a" if i % 3 else "b" for i in range(len(rows))])
    encoded = encode_values(_batch(rows, topic=topics), None)
    for name, values in encoded.items():
        mine = [r.encode() for r, t in zip(rows, topics.to_pylist(), strict=True) if t == name]
        assert values.to_pylist() == [r + b"," for r in mine]
        assert value_lengths(values) == b"".join(len(r).to_bytes(4, "little") for r in mine)
        assert value_lengths(values.slice(1)) == value_lengths(values)[4:]


def _read(url: str, topic: str) -> list[tuple[Any, str | None]]:
    with Client(url) as client:
        page = client.diff(topic, 0, limit=1000)
    return [(r.data, r.tag) for r in page.records]


def test_rows_keep_their_order_across_values_and_records(waymark_server: Any) -> None:
    """Batches alternately with and without tags: one task's rows in one order."""
    batches = [_batch([f'{{"n":{i}}}' for i in range(k, k + 7)], [None if k % 2 else "t"] * 7)
               for k in range(0, 35, 7)]  # fmt: skip
    table = pa.Table.from_batches(batches)
    sink = TopicBatchSink(waymark_server.url, "values-order", "values-order")
    result = sink.publish(table, 0)
    assert result["values-order"].count == 35
    expected = [({"n": i}, None if (i // 7) % 2 else "t") for i in range(35)]
    assert _read(waymark_server.url, "values-order") == expected


@pytest.mark.parametrize(
    ("rows", "row"),
    [
        (['{"a":1}', "[1", "2]", "3,4"], 1),  # as many values, but not the rows
        (["1", "2", "1,2"], 2),
        (["1", '{"a":'], 1),
    ],
)
def test_a_row_that_is_not_one_json_value_fails_the_batch(
    waymark_server: Any, rows: list[str], row: int
) -> None:
    topic = f"values-refused-{row}-{len(rows)}"
    sink = TopicBatchSink(waymark_server.url, topic, topic)
    with pytest.raises(ValueError, match=f"row {row}: the 'data' column is not valid JSON"):
        sink.publish(pa.Table.from_batches([_batch(rows)]), 0)
    with Client(waymark_server.url) as client:
        assert topic not in [t.name for t in client.list_topics()]


@given(lengths=st.lists(st.integers(1, 40), max_size=60), records=st.integers(1, 6),
       size=st.integers(1, 100))  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_stage_chunks_are_full_and_within_both_limits(
    lengths: list[int], records: int, size: int
) -> None:
    """Every chunk but the rest is as full as the limits let it be: at most ``records``
    records and ``size`` bytes (a record larger than that alone); the rest is neither."""
    values = pa.array([b"x" * n for n in [7, *lengths]], pa.binary()).slice(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sink, "CHUNK_RECORDS", records)
        patch.setattr(sink, "CHUNK_BYTES", size)
        cuts = sink.chunk_cuts(values)
    assert cuts[0] == 0 and cuts == sorted(set(cuts))

    def fits(lo: int, hi: int) -> bool:
        return hi - lo <= records and (hi - lo == 1 or sum(lengths[lo:hi]) <= size)

    for lo, hi in itertools.pairwise(cuts):
        assert fits(lo, hi)
        assert hi - lo == records or sum(lengths[lo:hi]) == size or not fits(lo, hi + 1)
    rest = lengths[cuts[-1] :]
    assert len(rest) < records and sum(rest) < size
