"""The exactly-once topic sink and the fold sink across replays, retries, zombies and
a real SIGKILL of the driver."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark import cloudpickle as spark_cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from waymark.client import ApiError
from waymark.kv.stores.lmdb_store import LmdbStore
from waymark.spark import FoldSink, TopicBatchSink
from waymark.spark.datasource import WaymarkDataSource
from waymark.spark.sink import StagedParts, WaymarkStreamWriter

# The fault-injecting data source below is defined in this test module, which Spark's
# Python workers cannot import: ship its classes by value.
spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

HERE = Path(__file__).parent


def _stream(spark: Any, server: Any, topic: str) -> Any:
    reader = spark.readStream.format("waymark").option("url", server.url).option("topics", topic)
    return reader.option("maxRecordsPerTrigger", "100").load()


def _counts(stream: Any) -> Any:
    return stream.select(F.get_json_object("data", "$.u").alias("key"), F.lit(1).alias("value"))


def _fold_values(path: Path) -> dict[str, Any]:
    store = LmdbStore(path)
    try:
        return {e.key: orjson.loads(e.value) for e in store.range()}
    finally:
        store.close()


def _last_batch(path: Path) -> int | None:
    store = LmdbStore(path)
    try:
        return FoldSink(store).last_batch()
    finally:
        store.close()


def _add(old: Any, new: Any) -> Any:
    return (old or 0) + new


def test_replayed_committed_batch_changes_neither_topic_nor_fold(
    spark: Any, server: Any, topics: Any, run_all: Any, topic: str, tmp_path: Path
) -> None:
    """Deleting ``commits/N`` makes Spark replay batch N with the same id and offsets."""
    topics.write(topic, [{"u": f"u{i % 4}"} for i in range(200)])
    out, fold_path = f"{topic}-out", tmp_path / "fold"

    def both() -> None:
        writer = (
            _stream(spark, server, topic).select("data").writeStream.format("waymark")
            .option("url", server.url).option("topic", out).option("writerId", out)
            .option("checkpointLocation", str(tmp_path / "copy"))
        )  # fmt: skip
        sink = FoldSink(f"lmdb:{fold_path}", merge=_add)
        folding = _counts(_stream(spark, server, topic)).writeStream.foreachBatch(sink)
        folding = folding.option("checkpointLocation", str(tmp_path / "fold-checkpoint"))
        for query in run_all(writer, folding):  # the two queries overlap their fixed costs
            assert not isinstance(query, Exception), query
        sink.close()

    both()
    before = topics.read(out)
    assert len(before) == 200 and _fold_values(fold_path) == {f"u{i}": 50 for i in range(4)}
    for checkpoint in ("copy", "fold-checkpoint"):
        commits = tmp_path / checkpoint / "commits"
        assert (commits / "1").exists()
        for name in ("1", ".1.crc"):
            (commits / name).unlink(missing_ok=True)
    both()
    assert topics.read(out) == before
    assert _fold_values(fold_path) == {f"u{i}": 50 for i in range(4)}
    assert _last_batch(fold_path) == 1


class FlakyWriter(WaymarkStreamWriter):
    """Fault injector: the first attempt of partition 0 fails after staging its rows."""

    def write(self, iterator: Any) -> StagedParts:
        message = super().write(iterator)
        context = TaskContext.get()
        assert context is not None
        if context.partitionId() == 0 and context.attemptNumber() == 0:
            Path(self.marker).touch()
            raise RuntimeError("fault injector: attempt 0 of partition 0 fails after staging")
        return message


class FlakySource(WaymarkDataSource):
    @classmethod
    def name(cls) -> str:
        return "waymark_flaky"

    def streamWriter(self, schema: StructType, overwrite: bool) -> FlakyWriter:
        writer = FlakyWriter(self.options, schema)
        writer.marker = self.options["marker"]
        return writer


def test_task_retry_leaves_exactly_one_copy(
    spark: Any, server: Any, topics: Any, run: Any, topic: str, tmp_path: Path
) -> None:
    spark.dataSource.register(FlakySource)
    topics.write(topic, list(range(100)))
    marker = tmp_path / "failed-once"
    writer = (
        _stream(spark, server, topic).select("data").writeStream.format("waymark_flaky")
        .option("url", server.url).option("topic", f"{topic}-out").option("writerId", topic)
        .option("marker", str(marker)).option("checkpointLocation", str(tmp_path / "ck"))
    )  # fmt: skip
    run(writer)
    assert marker.exists(), "the injected failure never happened"
    assert [r["data"] for r in topics.read(f"{topic}-out")] == list(range(100))


def test_stale_epoch_writer_is_fenced(server: Any, topics: Any, topic: str) -> None:
    """A zombie of an earlier run (say a driver that lost its lease but still runs)
    can neither stage nor publish once a new run has opened the writer."""
    schema = StructType([StructField("data", StringType())])
    options = {"url": server.url, "topic": topic, "writerId": topic}
    zombie = WaymarkStreamWriter(options, schema)
    old = zombie.epoch  # opened when first used (shipped to its tasks)
    current = WaymarkStreamWriter(options, schema)
    assert current.epoch == old + 1
    with pytest.raises(ApiError) as fenced:
        zombie.commit([StagedParts(0, 0, [(topic, 1, 1)], epoch=old)], 0)
    assert fenced.value.status == 409 and fenced.value.code == "fenced"
    assert topics.read(topic) == []


def test_a_zombie_drivers_commit_is_fenced(
    spark: Any, server: Any, topics: Any, topic: str
) -> None:
    """Spark builds a new sink writer in the driver for every commit (pyspark's
    streaming sink runner). A zombie driver's tasks staged under its run's epoch; once a
    newer run has planned a batch (opened the writer), the zombie's commit, through a
    writer built afresh as Spark builds it, is refused 409 ``fenced`` and appends
    nothing: the commit publishes under the epoch its tasks staged under, never a fresh
    one (docs/spark.md, "Exactly-once topic sink")."""
    schema = StructType([StructField("data", StringType())])
    options = {"url": server.url, "topic": topic, "writerId": topic}
    planner = WaymarkStreamWriter(options, schema)  # the zombie's planning, shipped to tasks
    batch = pa.record_batch([pa.array(['{"i": 1}', '{"i": 2}'])], names=["data"])

    def task(_: Any) -> list[StagedParts]:  # a real task: TaskContext names the attempt
        return [planner.write(iter([batch]))]

    context = spark.sparkContext
    context.setLocalProperty("streaming.sql.batchId", "0")  # as Spark sets it for batch 0
    try:
        staged = context.parallelize([0], 1).mapPartitions(task).collect()
    finally:
        context.setLocalProperty("streaming.sql.batchId", None)
    assert WaymarkStreamWriter(options, schema).epoch > planner.epoch  # a newer run plans
    with pytest.raises(ApiError) as fenced:
        WaymarkStreamWriter(options, schema).commit(staged, 0)  # the zombie's commit
    assert fenced.value.status == 409 and fenced.value.code == "fenced"
    assert topics.read(topic) == []


def test_the_zombie_test_catches_a_commit_under_a_fresh_epoch(
    spark: Any, server: Any, topics: Any, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutant: the commit's writer opens an epoch of its own and publishes under it
    (the code before: every writer Spark built opened one)."""
    monkeypatch.setattr(WaymarkStreamWriter, "_staged_epoch", lambda self, *_: self.epoch)
    with pytest.raises(pytest.fail.Exception):
        test_a_zombie_drivers_commit_is_fenced(spark, server, topics, topic)


def test_a_commit_of_parts_staged_under_two_epochs_is_refused(server: Any, topic: str) -> None:
    """One planned batch ships one writer to its tasks: parts of two epochs are not one
    batch, and the commit publishes neither."""
    schema = StructType([StructField("data", StringType())])
    writer = WaymarkStreamWriter({"url": server.url, "topic": topic, "writerId": topic}, schema)
    epoch = writer.epoch
    parts = [StagedParts(0, 0, [(topic, 1, 1)], epoch=epoch - 1),
             StagedParts(1, 0, [(topic, 1, 1)], epoch=epoch)]  # fmt: skip
    with pytest.raises(ValueError, match="staged under epochs"):
        writer.commit(parts, 0)


def test_a_streaming_query_opens_one_epoch_a_micro_batch(
    spark: Any, server: Any, http: Any, topics: Any, run: Any, topic: str, tmp_path: Path
) -> None:
    """Spark builds the sink's writer twice a micro-batch (planning, commit); only the
    planning's opens an epoch, and the commit publishes under it: one writer open (one
    journaled frame and its sync) a batch, not two."""
    topics.write(topic, [{"i": i} for i in range(200)])
    writer = (
        _stream(spark, server, topic).select("data").writeStream.format("waymark")
        .option("url", server.url).option("topic", f"{topic}-out").option("writerId", topic)
        .option("checkpointLocation", str(tmp_path / "ck"))
    )  # fmt: skip
    query = run(writer)
    batches = len([p for p in query.recentProgress if p["numInputRows"] > 0])
    assert batches == 2
    assert [r["data"]["i"] for r in topics.read(f"{topic}-out")] == list(range(200))
    states = {w["writer"]: w["epoch"] for w in http.get("/v0/writers").json()["writers"]}
    assert states[topic] == batches


def test_driver_sigkill_between_sink_commit_and_commit_log(
    server: Any, topics: Any, topic: str, tmp_path: Path
) -> None:
    """A real driver process is SIGKILLed right after the topic sink published batch 1
    and the fold folded batch 1, before either query wrote ``commits/1``; the restarted
    driver replays batch 1 of both: the output topic and the fold still hold every
    input exactly once."""
    topics.write(topic, [{"u": f"u{i % 3}"} for i in range(300)])
    out, fold_path, checkpoints = f"{topic}-out", tmp_path / "fold", tmp_path / "checkpoints"
    checkpoints.mkdir()

    def driver(kill: str, expected: int) -> None:
        args = [sys.executable, str(HERE / "kill_driver.py"), server.url, topic, out,
                str(fold_path), str(checkpoints), kill]  # fmt: skip
        done = subprocess.run(args, start_new_session=True, capture_output=True, timeout=240)
        log = tmp_path / f"driver-{kill}.log"
        log.write_bytes(done.stderr)
        assert done.returncode == expected, _driver_failure(done.stderr, log)

    driver("both:1", -9)
    # Killed inside the window: both outputs hold batches 0 and 1, neither commits/1 exists.
    for query in ("copy", "fold"):
        assert (checkpoints / query / "offsets" / "1").exists()
        assert not (checkpoints / query / "commits" / "1").exists()
    assert len(topics.read(out)) == 200
    assert _last_batch(fold_path) == 1
    assert _fold_values(fold_path) == {"u0": 67, "u1": 67, "u2": 66}
    driver("none", 0)
    assert [r["data"] for r in topics.read(out)] == [{"u": f"u{i % 3}"} for i in range(300)]
    assert _fold_values(fold_path) == {"u0": 100, "u1": 100, "u2": 100}


def _driver_failure(stderr: bytes, log: Path) -> str:
    """What a failed driver said: the lines naming errors (a JVM trace's head and its
    causes), then its last lines; the whole of it is in ``log``."""
    lines = stderr.decode(errors="replace").splitlines()
    errors = [line for line in lines if "Error" in line or "Exception" in line
              or line.startswith("Caused by")]  # fmt: skip
    return "\n".join([f"driver failed; its stderr is {log}", *errors[:40], "...", *lines[-20:]])


def test_foreach_batch_writers_publish_each_batch_id_once(
    spark: Any, server: Any, topics: Any, topic: str
) -> None:
    """Inside ``foreachBatch``: ``df.write.format("waymark")`` with ``batchId`` (tasks
    stage, the driver publishes) and :class:`TopicBatchSink` (staged from the driver).
    Writing a batch id again — Spark's replay after a crash — appends nothing."""
    rows = [(orjson.dumps({"i": i}).decode(),) for i in range(50)]
    df = spark.createDataFrame(rows, "data STRING").repartition(2)

    def write(batch_id: int | None) -> None:
        writer = (
            df.write.format("waymark").mode("append").option("url", server.url)
            .option("topic", topic).option("writerId", topic)
        )  # fmt: skip
        if batch_id is not None:
            writer = writer.option("batchId", str(batch_id))
        writer.save()

    write(0)
    write(0)
    write(1)
    values = [r["data"]["i"] for r in topics.read(topic)]
    assert sorted(values[:50]) == sorted(values[50:]) == list(range(50)) and len(values) == 100
    with pytest.raises(Exception, match="batchId"):
        write(None)

    out = f"{topic}-driver"
    sink = TopicBatchSink(server.url, out, out)
    table = pa.table({"data": ['{"i": 1}', '{"i": 2}'], "tag": ["a", None]})
    first = sink.publish(table, 0)[out]
    again = sink.publish(table, 0)[out]
    assert again.replayed and (again.first_seq, again.count) == (first.first_seq, 2)
    newer = TopicBatchSink(server.url, out, out)  # a restarted driver: the old one is fenced
    with pytest.raises(ApiError) as fenced:
        sink.publish(table, 1)
    assert fenced.value.code == "fenced"
    assert not newer.publish(table, 1)[out].replayed
    records = topics.read(out)
    assert [(r["data"]["i"], r.get("$tag")) for r in records] == [(1, "a"), (2, None)] * 2


def test_sink_needs_no_writer_id_the_checkpoint_names_it(
    spark: Any, server: Any, http: Any, topics: Any, run_all: Any, topic: str, tmp_path: Path
) -> None:
    """Options as for the Kafka sink (``url``, ``topic``, ``checkpointLocation``): the
    writer id comes from the checkpoint. A restart of the query from its checkpoint is
    the same writer — its replay of a batch published before the crash (``commits/1``
    deleted) appends nothing — and a query with another checkpoint is another writer,
    whose batches 0 and 1 are its own, not replays of the first query's."""
    other = f"{topic}-other"
    topics.write(topic, [{"i": i} for i in range(150)])
    topics.write(other, [{"j": j} for j in range(120)])
    out = f"{topic}-out"

    def copy(source: str, checkpoint: Path, url: str | None = server.url) -> Any:
        writer = _stream(spark, server, source).select("data").writeStream.format("waymark")
        if url is not None:
            writer = writer.option("url", url)
        return writer.option("topic", out).option("checkpointLocation", str(checkpoint))

    first, second = tmp_path / "first", tmp_path / "second"
    for query in run_all(copy(topic, first)):
        assert not isinstance(query, Exception), query
    assert [r["data"]["i"] for r in topics.read(out)] == list(range(150))
    for name in ("1", ".1.crc"):
        (first / "commits" / name).unlink(missing_ok=True)
    topics.write(topic, [{"i": i} for i in range(150, 200)])
    no_url = copy(topic, tmp_path / "no-url", url=None)
    restarted, another, failed = run_all(copy(topic, first), copy(other, second), no_url)
    assert not isinstance(restarted, Exception) and not isinstance(another, Exception)
    assert "option 'url' must be specified for the waymark sink" in str(failed)
    records = [r["data"] for r in topics.read(out)]
    assert [r["i"] for r in records if "i" in r] == list(range(200))
    assert [r["j"] for r in records if "j" in r] == list(range(120))
    # Both runs of the first query opened epochs of the one writer its checkpoint names.
    from waymark.spark.sink import checkpoint_writer_id

    opened = http.post("/v0/writers", json={"writer": checkpoint_writer_id(str(first))})
    assert opened.json()["epoch"] >= 3
