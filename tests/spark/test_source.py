"""The topic source against a real server and a real local Spark session."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from waymark.spark import with_parsed_data


def _stream(spark: Any, server: Any, topic: str, **options: Any) -> Any:
    reader = spark.readStream.format("waymark").option("url", server.url).option("topics", topic)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def test_restart_reads_neither_twice_nor_past_anything_under_admission_control(
    spark: Any, server: Any, topics: Any, run: Any, topic: str, tmp_path: Path
) -> None:
    """Two availableNow runs from one checkpoint, more records in between: the output
    topic (exactly-once sink) holds every input exactly once, in order; every batch is
    bounded by maxRecordsPerTrigger and each run stops by itself once drained."""
    topics.write(topic, [{"i": i} for i in range(250)])
    out = f"{topic}-out"

    def once() -> Any:
        stream = _stream(spark, server, topic, maxRecordsPerTrigger=100)
        parsed = with_parsed_data(stream, "i INT")
        assert parsed.schema["data"].dataType.simpleString() == "struct<i:int>"
        writer = (
            stream.select("data", "tag").writeStream.format("waymark")
            .option("url", server.url).option("topic", out).option("writerId", out)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
        )  # fmt: skip
        return run(writer)

    first = once()
    assert [p["numInputRows"] for p in first.recentProgress] == [100, 100, 50]
    topics.write(topic, [{"i": i} for i in range(250, 300)], tag="late")
    second = once()
    assert [p["numInputRows"] for p in second.recentProgress] == [50]
    records = topics.read(out)
    assert [r["data"]["i"] for r in records] == list(range(300))
    assert [r["$seq"] for r in records] == list(range(1, 301))
    assert {r.get("$tag") for r in records[250:]} == {"late"}


def test_gaps_fail_with_the_gap_named_or_are_skipped_into_the_gaps_topic(
    spark: Any, server: Any, http: Any, topics: Any, run_all: Any, topic: str, tmp_path: Path
) -> None:
    """Two kinds of gap, each in its own topic and query, run side by side: a cap
    eviction (a tombstone inside the batch's range) and a deleted-and-recreated topic."""
    capped, recreated = f"{topic}-cap", f"{topic}-new"
    http.put(f"/v0/topics/{capped}", json={"cap_records": 50}).raise_for_status()
    topics.write(capped, list(range(20)))
    topics.write(recreated, list(range(5)))

    def query(name: str, **options: Any) -> Any:
        # The memory sink cannot restart from a checkpoint; the waymark sink can.
        stream = _stream(spark, server, name, gapsTopic=f"{name}-gaps", **options)
        writer = (
            stream.select("data").writeStream.format("waymark").option("url", server.url)
            .option("topic", f"{name}-out").option("writerId", f"{name}-out")
        )  # fmt: skip
        return writer.option("checkpointLocation", str(tmp_path / name))

    for outcome in run_all(query(capped), query(recreated)):
        assert not isinstance(outcome, Exception), outcome
    topics.write(capped, list(range(20, 120)))  # cap 50: seqs 21..70 are evicted unread
    http.delete(f"/v0/topics/{recreated}").raise_for_status()
    topics.write(recreated, ["new-1", "new-2", "new-3"])  # new instance: seqs restart at 1

    cap_failed, recreate_failed = run_all(query(capped), query(recreated))
    assert isinstance(cap_failed, StreamingQueryException), cap_failed
    assert f"waymark topic '{capped}' lost records [21, 70] (reason: cap)" in str(cap_failed)
    assert isinstance(recreate_failed, StreamingQueryException), recreate_failed
    assert re.search(r"lost records \[6, its end\] \(reason: recreated\)", str(recreate_failed))

    skips = run_all(query(capped, onDataLoss="skip"), query(recreated, onDataLoss="skip"))
    for outcome in skips:
        assert not isinstance(outcome, Exception), outcome
    assert [r["data"] for r in topics.read(f"{capped}-out")] == [*range(20), *range(70, 120)]
    gaps = [r["data"] for r in topics.read(f"{capped}-gaps")]
    assert [(g["topic"], g["gap_from"], g["gap_to"], g["reason"]) for g in gaps] == [
        (capped, 21, 70, "cap")
    ]
    out = [r["data"] for r in topics.read(f"{recreated}-out")]
    assert out == [0, 1, 2, 3, 4, "new-1", "new-2", "new-3"]
    gaps = [r["data"] for r in topics.read(f"{recreated}-gaps")]
    assert [(g["gap_from"], g["reason"]) for g in gaps] == [(6, "recreated")]


def test_a_gap_is_reported_once_whole_however_the_batches_are_cut(
    spark: Any, server: Any, http: Any, topics: Any, run: Any, topic: str, tmp_path: Path
) -> None:
    """A capped topic evicts seqs 1001..3000 before the query reads them; batches of
    at most 500 records, each read in 3 tasks, cut the range in many places: ``fail``
    names the whole range and ``skip`` writes one gaps row with it and its true count."""
    http.put(f"/v0/topics/{topic}", json={"cap_records": 1000}).raise_for_status()
    topics.write(topic, list(range(1000)))
    out, gaps_topic = f"{topic}-out", f"{topic}-gaps"

    def query(**options: Any) -> Any:
        # Kafka's option names here; the other tests use the older aliases.
        stream = _stream(spark, server, topic, maxOffsetsPerTrigger=500, minPartitions=3,
                         gapsTopic=gaps_topic, **options)  # fmt: skip
        writer = (
            stream.select("data").writeStream.format("waymark").option("url", server.url)
            .option("topic", out).option("checkpointLocation", str(tmp_path / "ck"))
        )  # fmt: skip
        return run(writer)

    query()
    topics.write(topic, list(range(1000, 4000)))  # cap 1000: seqs 1001..3000 are evicted
    with pytest.raises(StreamingQueryException) as failed:
        query()
    assert f"waymark topic '{topic}' lost records [1001, 3000] (reason: cap)" in str(failed.value)
    query(failOnDataLoss="false")
    assert [r["data"] for r in topics.read(out)] == [*range(1000), *range(3000, 4000)]
    gaps = [r["data"] for r in topics.read(gaps_topic)]
    assert [(g["gap_from"], g["gap_to"], g["reason"], g["missed_estimate"]) for g in gaps] == [
        (1001, 3000, "cap", 2000)
    ]
