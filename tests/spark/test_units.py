"""The Spark part's pure logic and the server-side staging, without a Spark session."""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.streaming.datasource import ReadAllAvailable

from waymark.clock import ManualClock
from waymark.log import Engine, ErrorCode, RecordIn, TopicError
from waymark.log.writers import PartKey
from waymark.spark import encoding
from waymark.spark.encoding import encode_batch, encode_data, joined_values
from waymark.spark.offsets import (
    EARLIEST,
    LATEST,
    FromSeq,
    Positions,
    TopicOffset,
    admit,
    parse_positions,
)
from waymark.spark.options import (
    BATCH_SOURCE,
    STREAM_SINK,
    STREAM_SOURCE,
    duration_ms,
    flag,
    resolve,
)
from waymark.spark.partitions import ReadSettings, Recreated, split

SETTINGS = ReadSettings("http://x", None, "fail", "gaps", 10_000)


def test_starting_offsets_forms() -> None:
    def parse(text: str | None, topics: tuple[str, ...] = ("a", "b", "c")) -> Positions:
        return parse_positions("startingOffsets", text, EARLIEST, topics.__contains__)

    assert parse(None).of("a") == EARLIEST
    assert parse("LATEST").of("b") == LATEST
    given = parse('{"a": {"epoch": 3, "seq": 7}, "b": -1, "c": 23}')
    assert [given.of(t) for t in "abc"] == [TopicOffset(3, 7), LATEST, FromSeq(23)]
    assert parse('{"a": -1}').of("new-topic") == EARLIEST  # unnamed: the default
    with pytest.raises(ValueError, match="does not subscribe to"):
        parse('{"zz": -2}', ("a",))
    for bad in ('{"a": 0}', '{"a": {"seq": 5}}', '{"a": true}', "[1]"):
        with pytest.raises(ValueError, match="startingOffsets"):
            parse(bad)


def test_options_are_strict_case_insensitive_and_name_close_matches() -> None:
    """An option the query does not take fails it, naming what was probably meant;
    names match whatever their case (Spark hands them over lower-cased); the older
    names are aliases whose values read as the new option's (docs/spark.md, "Options")."""
    spark_given = CaseInsensitiveDict({"URL": "u", "subscribe": "t", "maxoffsetspertrigger": "5"})
    assert resolve(spark_given, STREAM_SOURCE) == {
        "url": "u", "subscribe": "t", "maxOffsetsPerTrigger": "5"
    }  # fmt: skip
    old = {"topics": "t", "maxRecordsPerTrigger": "5", "onDataLoss": "skip"}
    assert resolve(old, STREAM_SOURCE) == {
        "subscribe": "t", "maxOffsetsPerTrigger": "5", "failOnDataLoss": "false"
    }  # fmt: skip
    cases = [
        ({"maxOffsetPerTrigger": "5"}, STREAM_SOURCE, "did you mean 'maxOffsetsPerTrigger'"),
        ({"failOnDatalos": "x"}, STREAM_SOURCE, "did you mean 'failOnDataLoss'"),
        ({"subscrbe": "t"}, BATCH_SOURCE, "did you mean 'subscribe'"),
        ({"maxOffsetsPerTrigger": "5"}, BATCH_SOURCE, "applies to streaming queries"),
        ({"endingOffsets": "latest"}, STREAM_SOURCE, "applies to batch queries"),
        ({"assign": "{}"}, STREAM_SOURCE, "Kafka connector has no waymark counterpart"),
        ({"topic": "t"}, STREAM_SOURCE, "unknown option 'topic'"),
        ({"batchId": "1"}, STREAM_SINK, "unknown option 'batchId'.*it takes: caFile"),
        ({"topics": "a", "subscribe": "b"}, STREAM_SOURCE, "given twice with two values"),
        ({"onDataLoss": "skip", "failOnDataLoss": "true"}, STREAM_SOURCE, "given twice"),
    ]
    for options, allowed, message in cases:
        with pytest.raises(ValueError, match=message):
            resolve(options, allowed)
    assert resolve({"topics": "a", "subscribe": "a"}, STREAM_SOURCE) == {"subscribe": "a"}
    assert duration_ms({"d": "15m"}, "d", 0) == 900_000
    assert duration_ms({"d": "250"}, "d", 0) == 250  # a bare number: ms, as Kafka's
    assert duration_ms({}, "d", 7) == 7
    for bad in ("5 parsecs", "-1s", "1.5s"):
        with pytest.raises(ValueError, match="is a duration"):
            duration_ms({"d": bad}, "d", 0)
    with pytest.raises(ValueError, match="true or false"):
        flag({"f": "yes"}, "f", True)


def test_the_data_source_refuses_unknown_options_when_spark_creates_a_reader() -> None:
    """Through the data source, as Spark calls it (lower-cased keys), before any I/O."""
    from pyspark.sql.types import StringType, StructField, StructType

    from waymark.spark.datasource import WaymarkDataSource

    schema = StructType([StructField("data", StringType())])
    source = WaymarkDataSource(
        CaseInsensitiveDict(
            {"url": "http://127.0.0.1:9", "subscribe": "t", "maxofsetspertrigger": "5"}
        )
    )
    with pytest.raises(
        ValueError, match=r"'maxofsetspertrigger'.*did you mean 'maxOffsetsPerTrigger'"
    ):
        source.streamReader(schema)
    with pytest.raises(ValueError, match="applies to streaming queries"):
        WaymarkDataSource(
            CaseInsensitiveDict({"url": "u", "subscribe": "t", "maxrecordspertrigger": "5"})
        ).reader(schema)
    sink = WaymarkDataSource(
        CaseInsensitiveDict({"url": "u", "topic": "t", "writerid": "w", "bachid": "1"})
    )
    with pytest.raises(ValueError, match="did you mean 'batchId'"):
        sink.writer(schema, False)
    with pytest.raises(ValueError, match="exactly one of option 'subscribe'"):
        WaymarkDataSource(
            CaseInsensitiveDict({"url": "u", "subscribe": "a", "subscribepattern": "b"})
        ).streamReader(schema)


def test_min_offsets_per_trigger_waits_at_most_max_trigger_delay(
    server: Any, http: httpx.Client, topic: str
) -> None:
    """Kafka's rule, planned against a real server on an injected clock: a micro-batch
    waits until ``minOffsetsPerTrigger`` records are there or ``maxTriggerDelay`` passed
    since the last one; the first is never delayed; availableNow and a trigger that asks
    for everything are not delayed; ``maxOffsetsPerTrigger`` still caps."""
    from pyspark.sql.streaming.datasource import ReadMaxRows, ReadMinRows

    from waymark.spark.source import WaymarkStreamReader

    def write(n: int) -> None:
        records = [{"data": i} for i in range(n)]
        http.post(f"/v0/topics/{topic}/records", json={"records": records}).raise_for_status()

    clock = ManualClock()
    options = {"url": server.url, "subscribe": topic, "minOffsetsPerTrigger": "10",
               "maxTriggerDelay": "30s"}  # fmt: skip
    reader = WaymarkStreamReader(options, clock=clock)
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMinRows(10)
    write(4)
    start = reader.initialOffset()
    end = reader.latestOffset(start, limit)  # the first batch: not delayed
    assert end[topic]["seq"] == 4
    write(3)
    assert reader.latestOffset(end, limit) == end  # 3 < 10, 0 s since: waits
    clock.advance(29_999)
    assert reader.latestOffset(end, limit) == end
    assert reader.latestOffset(end, ReadAllAvailable())[topic]["seq"] == 7  # not delayed
    clock.advance(1)
    end = reader.latestOffset(end, limit)  # 30 s since the last batch
    assert end[topic]["seq"] == 7
    write(10)
    end = reader.latestOffset(end, limit)  # 10 available: at once
    assert end[topic]["seq"] == 17
    capped = WaymarkStreamReader({**options, "maxOffsetsPerTrigger": "12"}, clock=clock)
    assert capped.getDefaultReadLimit() == ReadMaxRows(12)
    assert capped.latestOffset(capped.initialOffset(), ReadMaxRows(12))[topic]["seq"] == 12
    write(2)
    drained = WaymarkStreamReader(options, clock=clock)
    drained.prepareForTriggerAvailableNow()
    first = drained.latestOffset(drained.initialOffset(), limit)
    assert drained.latestOffset(first, limit) == first  # the target reached
    with pytest.raises(ValueError, match="goes with option 'minOffsetsPerTrigger'"):
        WaymarkStreamReader({"url": "u", "subscribe": "t", "maxTriggerDelay": "1s"})
    with pytest.raises(ValueError, match="above 'maxOffsetsPerTrigger'"):
        WaymarkStreamReader({**options, "maxOffsetsPerTrigger": "5"})


def test_admission_shares_the_budget_and_never_exceeds_it() -> None:
    assert admit({"a": 10, "b": 1000, "c": 0}, 100) == {"a": 10, "b": 90, "c": 0}
    assert admit({"a": 500, "b": 500}, 100) == {"a": 50, "b": 50}
    assert sum(admit({"a": 5, "b": 5, "c": 5}, 2).values()) == 2
    assert admit({"a": 7}, None) == {"a": 7}


def test_partitions_cover_the_range_exactly_once() -> None:
    parts = split(
        SETTINGS,
        [("a", 1, 10, 1010, None), ("b", 2, 0, 5, Recreated(1, 40)), ("c", 1, 3, 3, None)],
        min_partitions=4,
        max_per_partition=300,
    )
    a = [(p.lo, p.hi) for p in parts if p.topic == "a"]
    assert a[0][0] == 10 and a[-1][1] == 1010
    assert all(x[1] == y[0] for x, y in itertools.pairwise(a))
    assert all(hi - lo <= 300 for lo, hi in a)
    b = [p for p in parts if p.topic == "b"]
    assert b[0].recreated == Recreated(1, 40) and all(p.recreated is None for p in b[1:])
    assert not [p for p in parts if p.topic == "c"]  # empty, no recreate: no task


@st.composite
def batch_cuts(draw: st.DrawFn) -> tuple[int, int, int]:
    """A span, a core count and a task bound that cut it into at most ~20k tasks:
    the property holds at any scale, and a million ``SeqRange`` objects per example
    only made the test take minutes."""
    span = draw(st.integers(1, 10_000_000))
    min_partitions = draw(st.integers(1, 8))
    max_per_partition = draw(st.integers(max(1, span // 20_000), 1_000_000))
    return span, min_partitions, max_per_partition


@settings(max_examples=200, deadline=None)
@given(cut=batch_cuts())
def test_a_batch_is_cut_into_whole_waves(cut: tuple[int, int, int]) -> None:
    """As few whole waves of ``min_partitions`` tasks as keep every range within
    ``max_per_partition``: no last wave runs one task while the other cores wait."""
    span, min_partitions, max_per_partition = cut
    parts = split(
        SETTINGS, [("a", 1, 5, 5 + span, None)],
        min_partitions=min_partitions, max_per_partition=max_per_partition,
    )  # fmt: skip
    lengths = [p.hi - p.lo for p in parts]
    assert sum(lengths) == span and max(lengths) <= max_per_partition
    assert max(lengths) - min(lengths) <= 1
    if len(parts) < span:  # else every range holds one seq: there is no cutting finer
        assert len(parts) % min_partitions == 0
        waves = len(parts) // min_partitions
        assert waves == 1 or (waves - 1) * min_partitions * max_per_partition < span


def test_the_waves_property_catches_a_last_wave_of_one_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mutant: tasks counted by ``max_per_partition`` alone (1M seqs, 2 cores,
    200k a task: 5 tasks, the last alone)."""
    from waymark.spark import partitions

    monkeypatch.setattr(partitions, "task_count", lambda total, m, most: -(-total // most))
    with pytest.raises(AssertionError):
        test_a_batch_is_cut_into_whole_waves()


def test_sink_data_column_encoding() -> None:
    values = encode_data(pa.array(['{"a":1}', "[1,2]", '"s"'])).to_pylist()
    assert values == [b'{"a":1}', b"[1,2]", b'"s"']
    structs = pa.array([{"x": 1, "y": "z"}], pa.struct([("x", pa.int64()), ("y", pa.string())]))
    assert encode_data(structs).to_pylist() == [b'{"x":1,"y":"z"}']
    with pytest.raises(ValueError, match="row 1: the 'data' column is not valid JSON"):
        encode_data(pa.array(["1", "{nope"]))
    # Two values in one string would shift the record's keys if concatenated blindly.
    with pytest.raises(ValueError, match="not valid JSON"):
        encode_data(pa.array(['1,"tag":"forged"']))
    # A slice of a column (an Arrow batch cut by Spark) is checked over its own values.
    assert encode_data(pa.array(["{nope", "1", "[2]"]).slice(1)).to_pylist() == [b"1", b"[2]"]
    with pytest.raises(ValueError, match="row 0: the 'data' column is not valid JSON"):
        encode_data(pa.array(["1", "{nope", "2"]).slice(1, 1))
    # An empty batch (a partition with no rows) holds nothing to refuse.
    assert encode_data(pa.array([], pa.string())).to_pylist() == []


def _engine() -> tuple[Engine, ManualClock]:
    clock = ManualClock(1_000_000)
    return Engine(clock=clock), clock


def test_publish_is_atomic_contiguous_and_idempotent() -> None:
    engine, _ = _engine()
    staging = engine.writers
    epoch = staging.open_writer("w")
    staging.stage("t", "w", epoch, 0, PartKey(1, 0), [RecordIn.of("b1"), RecordIn.of("b2")])
    staging.stage("t", "w", epoch, 0, PartKey(0, 0), [RecordIn.of("a1")])
    staging.stage("t", "w", epoch, 0, PartKey(0, 1), [RecordIn.of("a1-retry")])
    engine.append("t", [RecordIn.of("other")])  # staged rows stay invisible meanwhile
    assert [r["data"] for r in engine.diff("t", 0).records()] == ["other"]
    first = staging.publish("t", "w", epoch, 0, [(PartKey(0, 1), 1), (PartKey(1, 0), 1)])
    assert (first.first_seq, first.count, first.replayed) == (2, 3, False)
    assert [r["data"] for r in engine.diff("t", 1).records()] == ["a1-retry", "b1", "b2"]
    again = staging.publish("t", "w", epoch, 0, [(PartKey(0, 0), 1)])
    assert (again.first_seq, again.count, again.replayed) == (2, 3, True)
    assert engine.get_topic("t").head_seq == 4
    # A replayed batch's stage is declined, so executors need not ship it again.
    assert not staging.stage("t", "w", epoch, 0, PartKey(0, 2), [RecordIn.of("x")])
    assert staging.staged_parts("t", "w") == 0  # the failed attempt's stage went with it


def test_stale_epoch_is_fenced() -> None:
    engine, _ = _engine()
    staging = engine.writers
    old = staging.open_writer("w")
    staging.stage("t", "w", old, 0, PartKey(0, 0), [RecordIn.of(1)])
    new = staging.open_writer("w")
    for call in (
        lambda: staging.stage("t", "w", old, 0, PartKey(0, 0), [RecordIn.of(1)]),
        lambda: staging.publish("t", "w", old, 0, [(PartKey(0, 0), 1)]),
    ):
        with pytest.raises(TopicError) as refused:
            call()
        assert refused.value.code is ErrorCode.FENCED and refused.value.status == 409
    with pytest.raises(TopicError):
        engine.get_topic("t")  # the zombie appended nothing: the topic was never created
    assert new == old + 1


def test_unpublished_stages_expire_by_the_clock() -> None:
    engine, clock = _engine()
    staging = engine.writers
    epoch = staging.open_writer("w")
    staging.stage("t", "w", epoch, 0, PartKey(0, 0), [RecordIn.of(1)])
    clock.advance(staging.stage_ttl_ms + 1)
    assert staging.staged_parts("t", "w") == 0
    with pytest.raises(TopicError) as refused:
        staging.publish("t", "w", epoch, 0, [(PartKey(0, 0), 1)])
    assert refused.value.code is ErrorCode.NOT_FOUND


def test_http_routes_fence_and_publish(http: httpx.Client, topic: str) -> None:
    old = http.post("/v0/writers", json={"writer": topic}).json()["epoch"]
    head = {"writer": topic, "epoch": old, "batch_id": 0, "partition": 0, "attempt": 0}
    staged = http.post(f"/v0/topics/{topic}/stage", json={**head, "records": [{"data": 1}]})
    assert staged.json() == {"staged": 1, "accepted": True}
    http.post("/v0/writers", json={"writer": topic})
    parts = [{"partition": 0, "attempt": 0, "chunks": 1}]
    body = {"writer": topic, "epoch": old, "batch_id": 0, "parts": parts}
    fenced = http.post(f"/v0/topics/{topic}/publish", json=body)
    assert fenced.status_code == 409 and fenced.json()["error"]["code"] == "fenced"
    spec = http.get("/v0/openapi.json").json()["paths"]
    assert {"/v0/writers", "/v0/topics/{topic}/stage", "/v0/topics/{topic}/publish"} <= set(spec)


def test_an_arrow_page_becomes_source_rows_like_a_row_by_row_build() -> None:
    """The source's rows from an Arrow page (the page's buffers passed on, ts in µs, the
    topic column added, cut at the range's end) equal the obvious row-by-row build,
    multi-byte text and meta included."""
    from waymark.log import pages
    from waymark.protocol.arrow import decode_page
    from waymark.spark.schema import ARROW_SCHEMA
    from waymark.spark.source import to_rows

    engine = Engine(clock=ManualClock(1_790_000_000_123))
    values = [({"u": "é✓", "n": 1}, None, None, None), ([1, "two"], "t", "n1", {"k": "v"}),
              ("plain", None, None, None), (4, None, None, None)]  # fmt: skip
    engine.append("t.x", [RecordIn.of(d, tag=t, node=n, meta=m) for d, t, n, m in values])
    page = decode_page(pages.render(engine.diff("t.x", 0, columns=True)))
    [batch] = page.table.to_batches()
    expected = pa.RecordBatch.from_pylist(
        [
            {"topic": "t.x", "seq": seq, "ts": 1_790_000_000_123_000, "node": n, "tag": t,
             "meta": None if m is None else list(m.items()), "data": orjson.dumps(d).decode()}
            for seq, (d, t, n, m) in enumerate(values[:3], start=1)
        ],
        schema=ARROW_SCHEMA,
    )  # fmt: skip
    assert to_rows("t.x", batch, hi=3).equals(expected)
    assert to_rows("t.x", batch, hi=9).num_rows == 4


def test_edge_packs_become_one_row_per_item_like_a_row_by_row_build() -> None:
    """A Spark stage reading an edge gets one row per item of each pack, with the
    columns a record of one item had: the pack's seq, time, node and tag, the item as
    ``data`` and its generation, event id and birth time in ``meta``
    (docs/semantics/pipeline.md §7); what is not a pack is refused, naming its seq."""
    from waymark.log import pages
    from waymark.pipeline import InFlight
    from waymark.pipeline.edge import EdgeMalformed
    from waymark.protocol.arrow import decode_page
    from waymark.spark.edge import unpack
    from waymark.spark.schema import ARROW_SCHEMA
    from waymark.spark.source import to_rows

    items = InFlight.of(["a", 'q"\\ü', "c"], [b'{"u":"\xc3\xa9"}', b"[1]", b"3"],
                        born_ms=[5, 6, 7]).packed(2)  # fmt: skip
    engine = Engine(clock=ManualClock(1_790_000_000_123))
    body = items.edge_packs(0, 4)
    engine.append("t.x", msgspec.json.decode(b"[" + body + b"]", type=list[RecordIn]))
    page = decode_page(pages.render(engine.diff("t.x", 0, columns=True)))
    [batch] = page.table.to_batches()
    expected = pa.RecordBatch.from_pylist(
        [
            {"topic": "t.x", "seq": seq, "ts": 1_790_000_000_123_000, "node": None,
             "tag": None, "meta": [("wm.gen", "4"), ("wm.event", e), ("wm.t0", str(t0))],
             "data": d}
            for seq, e, t0, d in [(1, "a", 5, '{"u":"é"}'), (1, 'q"\\ü', 6, "[1]"),
                                  (2, "c", 7, "3")]
        ],
        schema=ARROW_SCHEMA,
    )  # fmt: skip
    assert unpack(to_rows("t.x", batch, hi=2)).equals(expected)
    assert unpack(to_rows("t.x", batch, hi=2).slice(1)).equals(expected.slice(2))
    engine.append("t.x", [RecordIn.of({"n": 1}, meta={"wm.gen": "4"})])
    page = decode_page(pages.render(engine.diff("t.x", 2, columns=True)))
    with pytest.raises(EdgeMalformed, match=r"seqs \[3, 3\] of an edge is not a pack"):
        unpack(to_rows("t.x", page.table.to_batches()[0], hi=3))


def test_a_read_counts_the_items_of_the_stale_packs_it_drops() -> None:
    """Stale drops are counted in items, from each pack's meta, as a pipeline
    consumer counts them (docs/semantics/pipeline.md §7.5); a stale record without a
    count is one."""
    from waymark.log import pages
    from waymark.pipeline import InFlight
    from waymark.protocol.arrow import decode_page
    from waymark.spark.edge import accept

    items = InFlight.of([f"e{n}" for n in range(5)], [b"%d" % n for n in range(5)],
                        born_ms=[1] * 5).packed(3)  # fmt: skip
    engine = Engine(clock=ManualClock(1_790_000_000_123))
    for body in (items.edge_packs(0, 3), items.edge_packs(0, 4)):  # 3 + 2 stale, 3 + 2 kept
        engine.append("t.x", msgspec.json.decode(b"[" + body + b"]", type=list[RecordIn]))
    engine.append("t.x", [RecordIn.of({"n": 1}, meta={"wm.gen": "2"})])
    [batch] = decode_page(pages.render(engine.diff("t.x", 0, columns=True))).table.to_batches()
    kept, dropped = accept(batch, 4, hi=5)
    assert kept.column(kept.schema.get_field_index("seq")).to_pylist() == [3, 4]
    assert dropped == 6


# --- the sink's writer id and options ---------------------------------------------------


def test_sink_writer_id_comes_from_the_checkpoint_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One checkpoint directory, however Spark is told it, is one writer; another
    directory is another writer; ``writerId`` overrides the derivation."""
    from waymark.spark.sink import checkpoint_writer_id, writer_id

    monkeypatch.chdir(tmp_path)
    ck = tmp_path / "queries" / "clicks-copy"
    spellings = [str(ck), f"{ck}/", f"{tmp_path}/queries/./clicks-copy", f"file://{ck}",
                 f"file:{ck}/", "queries/clicks-copy"]  # fmt: skip
    ids = {writer_id(CaseInsensitiveDict(checkpointLocation=s), streaming=True) for s in spellings}
    assert ids == {checkpoint_writer_id(str(ck))}
    (only,) = ids
    assert only.startswith("checkpoint:queries/clicks-copy:") and len(only) <= 255
    others = [
        f"{ck}-2",
        str(tmp_path / "other" / "clicks-copy"),
        "s3a://bucket/queries/clicks-copy",
    ]
    assert len({checkpoint_writer_id(o) for o in others} | ids) == 4
    assert checkpoint_writer_id("s3a://bucket/q/ck/") == checkpoint_writer_id("s3a://bucket/q//ck")
    # Spark hands the sink lower-cased keys beside the user's own.
    given = CaseInsensitiveDict({"checkpointlocation": str(ck), "queryname": "q", "writerId": "w"})
    assert writer_id(given, streaming=True) == "w"


def test_sink_options_missing_fail_naming_the_option() -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    from waymark.spark.sink import WaymarkBatchWriter, WaymarkStreamWriter

    schema = StructType([StructField("data", StringType())])
    cases = [
        (WaymarkStreamWriter, {"topic": "t", "checkpointLocation": "/ck"}, "option 'url' must"),
        (WaymarkStreamWriter, {"url": "http://x", "checkpointLocation": "/ck"}, "option 'topic'"),
        (WaymarkStreamWriter, {"url": "http://x", "topic": "t"}, "option 'checkpointLocation'"),
        (WaymarkBatchWriter, {"url": "http://x", "topic": "t", "batchId": "0"}, "'writerId'"),
        (WaymarkBatchWriter, {"url": "http://x", "topic": "t", "writerId": "w"}, "'batchId'"),
    ]
    for writer, options, message in cases:
        with pytest.raises(ValueError, match=message):
            writer(CaseInsensitiveDict(options), schema)


# --- gaps: reported once, whole, with their true count ------------------------------------


def _drain(
    reader: Any, start: dict, race: Any = None, restarted: Any = None
) -> tuple[dict, list[int]]:
    """Spark's micro-batch loop for one source, without Spark: plan a batch, read its
    ranges, repeat until nothing is left. ``race`` runs between the first batch's
    planning and its reads. With ``restarted`` (a new reader: a restarted driver),
    the first batch is planned, then planned again by ``restarted`` from the offsets
    alone, as Spark replays a batch its offset log holds but its commit log does not."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from waymark.spark.source import read_range

    seqs: list[int] = []
    while True:
        end = reader.latestOffset(start, ReadMaxRows(reader.max_rows))
        if end == start:
            return start, seqs
        parts = reader.partitions(start, end)
        if restarted is not None:
            parts = restarted.partitions(start, end)
            restarted = None
        if race is not None:
            race()
            race = None
        for part in parts:
            for batch in read_range(part):
                seqs += batch.column("seq").to_pylist()
        start = end


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cap=st.integers(5, 100),
    first=st.integers(1, 100),
    more=st.integers(0, 300),
    racing=st.integers(0, 150),
    restart=st.booleans(),
    max_rows=st.integers(5, 150),
    min_partitions=st.integers(1, 5),
    max_per_partition=st.integers(10, 200),
    page=st.integers(7, 60),
)
def test_source_reports_each_lost_seq_once_however_batches_are_cut(
    server: Any,
    http: httpx.Client,
    cap: int,
    first: int,
    more: int,
    racing: int,
    restart: bool,
    max_rows: int,
    min_partitions: int,
    max_per_partition: int,
    page: int,
) -> None:
    """A capped topic is read, then ``more`` records evict part of it before the next
    read, and ``racing`` more evict further between that read's planning and its
    tasks; or a restarted driver plans that batch again. Every seq after the first
    read is delivered exactly once or lies in exactly one gaps row; gaps rows add up
    to the records lost; and a gap that was there when the batch was planned is one
    row with its whole range (``onDataLoss=fail`` names the whole range), however
    admission control, partitioning and pages (each read while the next is fetched)
    cut the seqs."""
    from waymark.spark.source import WaymarkDataLoss, WaymarkStreamReader

    topic = f"gap-prop-{uuid.uuid4().hex[:10]}"
    http.put(f"/v0/topics/{topic}", json={"cap_records": cap}).raise_for_status()

    written = [0]

    def write(n: int) -> None:
        written[0] += n
        for i in range(0, n, 5000):
            records = [{"data": j} for j in range(i, min(n, i + 5000))]
            http.post(f"/v0/topics/{topic}/records", json={"records": records}).raise_for_status()

    def reader(on_data_loss: str) -> WaymarkStreamReader:
        made = WaymarkStreamReader({
            "url": server.url, "topics": topic, "onDataLoss": on_data_loss,
            "gapsTopic": f"{topic}-gaps", "maxRecordsPerTrigger": str(max_rows),
            "minPartitions": str(min_partitions), "maxRecordsPerPartition": str(max_per_partition),
        })  # fmt: skip
        made.settings = dataclasses.replace(made.settings, page=page)
        return made

    write(first)
    skip = reader("skip")
    read_to, before = _drain(skip, skip.initialOffset())
    assert before == list(range(max(1, first - cap + 1), first + 1))
    write(more)
    lost_to = http.get(f"/v0/topics/{topic}").json()["earliest_seq"] - 1
    if first < lost_to:
        with pytest.raises(WaymarkDataLoss) as failed:
            reader("fail").latestOffset(read_to, ReadAllAvailable())
        assert (failed.value.gap_from, failed.value.gap_to) == (first + 1, lost_to)

    restarted = reader("skip") if restart else None
    _, after = _drain(skip, read_to, race=lambda: write(racing), restarted=restarted)
    head = written[0]  # the race runs only if a batch was planned
    gaps = [r["data"] for r in _read_all(http, f"{topic}-gaps")]
    covered = [s for g in gaps for s in range(g["gap_from"], g["gap_to"] + 1)]
    assert sorted(after + covered) == list(range(first + 1, head + 1))  # each seq once
    assert sum(g["missed_estimate"] for g in gaps) == len(covered)  # no deletions: all lost
    assert {(g["topic"], g["reason"]) for g in gaps} <= {(topic, "cap")}
    if first < lost_to:  # lost when the batch was planned: one row, whole, its true count
        assert (gaps[0]["gap_from"], gaps[0]["gap_to"]) == (first + 1, lost_to)
        assert gaps[0]["missed_estimate"] == lost_to - first
    if racing == 0:
        assert len(gaps) <= 1


def test_a_range_reads_page_after_page_and_stops_when_abandoned(
    server: Any, http: httpx.Client, topic: str
) -> None:
    """Pages fetched ahead make the same rows as one page; a read Spark abandons (a
    limit, a killed task) stops its fetching thread and closes its connection."""
    from waymark.spark.partitions import SeqRange
    from waymark.spark.source import read_range

    records = [{"data": i, "tag": f"t{i % 3}"} for i in range(500)]
    http.post(f"/v0/topics/{topic}/records", json={"records": records}).raise_for_status()
    epoch = http.get(f"/v0/topics/{topic}").json()["epoch"]
    settings = ReadSettings(server.url, None, "fail", "gaps", 10_000)

    def rows(page: int, lo: int = 0, hi: int = 500) -> pa.Table:
        part = SeqRange(dataclasses.replace(settings, page=page), topic, epoch, lo, hi)
        return pa.Table.from_batches(list(read_range(part)))

    whole = rows(10_000)
    assert whole.column("seq").to_pylist() == list(range(1, 501))
    assert rows(7).equals(whole) and rows(100).equals(whole)
    assert rows(7, 123, 456).equals(whole.slice(123, 333))

    reading = read_range(SeqRange(dataclasses.replace(settings, page=5), topic, epoch, 0, 500))
    assert next(reading).num_rows == 5
    reading.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("waymark-prefetch")]


def _read_all(http: httpx.Client, topic: str) -> list[dict[str, Any]]:
    response = http.post(f"/v0/topics/{topic}/diff", json={"from_seq": 0, "limit": 10000})
    return [] if response.status_code == 404 else response.json()["records"]


_RECORDS = msgspec.json.Decoder(list[RecordIn])
_NAMES = (
    st.none()
    | st.text(max_size=5)
    | st.sampled_from(['a"b', "c\\d", "\n", "é\u2028", '","tag":"x'])
)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(-(2**53), 2**53) | st.text(max_size=4), _NAMES, _NAMES,
                               st.none() | st.dictionaries(_NAMES.filter(bool), st.text(max_size=3),
                                                           max_size=2)),
                     min_size=1, max_size=12),
       topics=st.lists(st.sampled_from(["t1", "t2"]), min_size=12, max_size=12))  # fmt: skip
def test_sink_rows_encode_as_the_records_they_hold(rows, topics) -> None:
    """The column-wise encoding decodes back to each row's data, tag, node and meta,
    grouped by topic in row order: quotes, backslashes and control characters escaped."""
    batch = pa.RecordBatch.from_pydict(
        {
            "data": [orjson.dumps(d).decode() for d, *_ in rows],
            "tag": [t for _, t, _, _ in rows],
            "node": [n for _, _, n, _ in rows],
            "meta": pa.array([None if m is None else list(m.items()) for *_, m in rows],
                             pa.map_(pa.string(), pa.string())),
            "topic": topics[: len(rows)],
        }
    )  # fmt: skip
    encoded = encode_batch(batch, None)
    for topic, records in encoded.items():
        decoded = _RECORDS.decode(b"[" + joined_values(records)[:-1] + b"]")
        expected = [r for r, t in zip(rows, topics, strict=False) if t == topic]
        assert [(orjson.loads(bytes(r.data)), r.tag, r.node, r.meta) for r in decoded] == expected
    assert sum(len(r) for r in encoded.values()) == len(rows)


def test_the_encoding_property_catches_unescaped_quotes(monkeypatch: pytest.MonkeyPatch) -> None:
    def unescaped(column):
        text = column.cast(pa.string())
        return pc.binary_join_element_wise(b'"', text.cast(pa.binary()), b'"', b"")

    monkeypatch.setattr(encoding, "_json_strings", unescaped)
    with pytest.raises((AssertionError, msgspec.DecodeError)):
        test_sink_rows_encode_as_the_records_they_hold()


def test_a_pattern_reads_topics_created_later_from_their_start_and_never_its_gaps_topic(
    server: Any, http: httpx.Client, topic: str
) -> None:
    """``subscribePattern`` plans against the server's topic list before every batch: a
    matching topic created after the query started is read from its first record even
    with ``startingOffsets=latest``, a name that only contains the pattern is not
    read, and the source's own gaps topic is never matched (docs/spark.md, "Options")."""
    from waymark.spark.batch_source import WaymarkBatchReader
    from waymark.spark.source import WaymarkStreamReader

    def write(name: str, n: int) -> None:
        records = [{"data": i} for i in range(n)]
        http.post(f"/v0/topics/{name}/records", json={"records": records}).raise_for_status()

    write(f"{topic}.a", 3)
    reader = WaymarkStreamReader({
        "url": server.url, "subscribePattern": rf"{re.escape(topic)}\..*",
        "startingOffsets": "latest", "gapsTopic": f"{topic}.gaps",
    })  # fmt: skip
    start = reader.initialOffset()
    assert {t: o["seq"] for t, o in start.items()} == {f"{topic}.a": 3}
    write(f"{topic}.b", 2)
    write(f"{topic}.gaps", 1)
    write(f"x{topic}.c", 1)
    end = reader.latestOffset(start, ReadAllAvailable())
    assert {t: o["seq"] for t, o in end.items()} == {f"{topic}.a": 3, f"{topic}.b": 2}

    def spans(ranges: Any) -> dict[str, tuple[int, int]]:  # per topic: (lo, hi] covered
        out: dict[str, tuple[int, int]] = {}
        for r in ranges:
            lo, hi = out.get(r.topic, (r.lo, r.hi))
            out[r.topic] = (min(lo, r.lo), max(hi, r.hi))
        return out

    assert spans(reader.partitions(start, end)) == {f"{topic}.b": (0, 2)}
    batch = WaymarkBatchReader({
        "url": server.url, "subscribePattern": rf"{re.escape(topic)}\.[ab]",
        "endingOffsets": f'{{"{topic}.a": 3}}',
    })  # fmt: skip
    assert spans(batch.partitions()) == {f"{topic}.a": (0, 2), f"{topic}.b": (0, 2)}
    rows = sum(b.num_rows for r in batch.partitions() for b in batch.read(r))
    assert rows == 4
