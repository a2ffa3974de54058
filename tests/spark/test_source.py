"""The topic source against a real server and a real local Spark session."""

from __future__ import annotations

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


def test_tombstone_fails_with_the_gap_named_or_is_skipped_into_the_gaps_topic(
    spark: Any, server: Any, http: Any, topics: Any, run: Any, topic: str, tmp_path: Path
) -> None:
    http.put(f"/v0/topics/{topic}", json={"cap_records": 50}).raise_for_status()
    topics.write(topic, list(range(20)))
    checkpoint = str(tmp_path / "checkpoint")

    def query(**options: Any) -> Any:
        # The memory sink cannot restart from a checkpoint; the waymark sink can.
        stream = _stream(spark, server, topic, gapsTopic=f"{topic}-gaps", **options)
        writer = (
            stream.select("data").writeStream.format("waymark").option("url", server.url)
            .option("topic", f"{topic}-out").option("writerId", f"{topic}-out")
        )  # fmt: skip
        return run(writer.option("checkpointLocation", checkpoint))

    query()
    topics.write(topic, list(range(20, 120)))  # cap 50: seqs 21..70 are evicted unread
    with pytest.raises(StreamingQueryException) as failed:
        query()
    message = str(failed.value)
    assert f"waymark topic '{topic}' lost records [21, 70] (reason: cap)" in message
    query(onDataLoss="skip")
    assert [r["data"] for r in topics.read(f"{topic}-out")] == [*range(20), *range(70, 120)]
    gaps = [r["data"] for r in topics.read(f"{topic}-gaps")]
    assert [(g["topic"], g["gap_from"], g["gap_to"], g["reason"]) for g in gaps] == [
        (topic, 21, 70, "cap")
    ]


def test_recreated_topic_is_detected(
    spark: Any, server: Any, http: Any, topics: Any, run: Any, topic: str, tmp_path: Path
) -> None:
    topics.write(topic, list(range(5)))
    checkpoint = str(tmp_path / "checkpoint")

    def query(**options: Any) -> Any:
        # The memory sink cannot restart from a checkpoint; the waymark sink can.
        stream = _stream(spark, server, topic, gapsTopic=f"{topic}-gaps", **options)
        writer = (
            stream.select("data").writeStream.format("waymark").option("url", server.url)
            .option("topic", f"{topic}-out").option("writerId", f"{topic}-out")
        )  # fmt: skip
        return run(writer.option("checkpointLocation", checkpoint))

    query()
    http.delete(f"/v0/topics/{topic}").raise_for_status()
    topics.write(topic, ["new-1", "new-2", "new-3"])  # new instance: seqs restart at 1
    with pytest.raises(StreamingQueryException, match=r"lost records \[6, its end\] "
                       r"\(reason: recreated\)"):  # fmt: skip
        query()
    query(onDataLoss="skip")
    out = [r["data"] for r in topics.read(f"{topic}-out")]
    assert out == [0, 1, 2, 3, 4, "new-1", "new-2", "new-3"]
    gaps = [r["data"] for r in topics.read(f"{topic}-gaps")]
    assert [(g["gap_from"], g["reason"]) for g in gaps] == [(6, "recreated")]
