"""A Spark query as the middle stage of a pipeline (docs/spark.md, "A Spark stage of a
pipeline"): a ``waymark pipeline run --stage produce`` process writes the edge, the
query reads it with options ``edge``/``handoff``/``stage``, transforms each event and
writes it to an idempotent sink topic; the edge server is SIGKILLed mid-run and the
query is stopped and started again from its checkpoint. The sink holds each event
exactly once, the query's offsets carry the new generation, and the producer —
which exits only once the Spark stage acknowledged every event — finishes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.pipeline.test_processes import sink_events

from waymark.client import Client, RecordIn
from waymark.objstore import open_store
from waymark.pipeline import HandoffReader, InFlight, Position, Sink, client_factory
from waymark.pipeline.report import load_report

from .conftest import external_stage_spec, start_server

EVENTS = 3000
WAYMARK = str(Path(sys.executable).parent / "waymark")


def _wait(predicate: Any, timeout_s: float, what: str, query: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        failed = query.exception()
        if failed is not None:
            raise AssertionError(f"the query failed: {failed}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_spark_stage_survives_the_relocation_of_its_input_edge(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    a, b = start_server(tmp_path / "a"), start_server(tmp_path / "b")
    run = uuid.uuid4().hex[:8]
    edge, sink_topic = f"raw{run}", f"enriched-{run}"
    handoff = (tmp_path / "handoff").as_uri()
    spec = external_stage_spec(tmp_path / "pipeline.toml", "spark-stage", handoff, edge,
                               [a.url, b.url], EVENTS)  # fmt: skip
    log = tmp_path / "produce.log"
    with log.open("wb") as out:
        producer = subprocess.Popen(
            [WAYMARK, "pipeline", "run", str(spec), "--stage", "produce"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    sink = Sink(server.url, sink_topic, connect=client_factory())
    sink.open()

    def deliver(batch: Any, _batch_id: int) -> None:
        rows = batch.collect()
        sink.write(InFlight.of([r.event for r in rows], [r.data.encode() for r in rows]))

    def start() -> Any:
        # 3 edge records a batch: packs of the producer's 100 events (the rows are items)
        stream = (
            spark.readStream.format("waymark").option("edge", edge).option("handoff", handoff)
            .option("stage", "enrich").option("maxRecordsPerTrigger", 3).load()
        )  # fmt: skip
        value = F.from_json("data", "event_id INT, user STRING, amount INT")
        enriched = F.to_json(F.struct(
            value.event_id.alias("event_id"), value.user.alias("user"),
            F.when(value.amount >= 7, "big").otherwise("small").alias("bucket"),
        ))  # fmt: skip
        return (
            stream.select(F.col("meta")["wm.event"].alias("event"), enriched.alias("data"))
            .writeStream.foreachBatch(deliver)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="100 milliseconds").start()
        )  # fmt: skip

    query = start()
    try:
        _wait(lambda: len(sink_events(server.url, sink_topic)) >= EVENTS // 4, 120,
              "a quarter of the events at the sink", query)  # fmt: skip
        a.process.kill()  # SIGKILL the server under the edge, mid-run
        a.process.wait()
        store = open_store(handoff)
        _wait(lambda: (loc := HandoffReader(store, edge).current()) is not None
              and loc.generation >= 2, 60, "the edge to move", query)  # fmt: skip
        # A producer that missed the move writes under generation 1 into the new
        # placement (a fault injected through the public client): it must be dropped.
        placed = HandoffReader(store, edge).current()
        assert placed is not None
        with Client(b.url) as client:
            client.append(placed.topic, [RecordIn.of(
                {"event_id": -1}, meta={"wm.gen": "1", "wm.event": "zombie", "wm.t0": "0"},
                id="zombie@1",
            )])  # fmt: skip
        before = len(sink_events(server.url, sink_topic))
        _wait(lambda: before == EVENTS or len(sink_events(server.url, sink_topic)) > before,
              120, "progress after the kill", query)  # fmt: skip
        query.stop()  # a restart from the checkpoint: the last batch is planned again
        query = start()
        _wait(lambda: producer.poll() is not None, 180,
              "the producer to see every event acknowledged", query)  # fmt: skip
        assert producer.returncode == 0, log.read_text()[-3000:]
        _wait(lambda: len(sink_events(server.url, sink_topic)) == EVENTS, 60, "every event", query)
        # the zombie's record may be the edge's last: wait for the batch that drops it
        _wait(lambda: (r := load_report(store, "enrich")) is not None and r.stale_dropped > 0,
              60, "the stale record to be counted", query)  # fmt: skip
        _wait(lambda: query.lastProgress is not None, 60, "the restarted query's progress",
              query)  # fmt: skip
        progress = query.lastProgress
    finally:
        query.stop()
        if producer.poll() is None:
            producer.kill()
        for srv in (a, b):
            if srv.process.poll() is None:
                srv.process.kill()
                srv.process.wait()

    seen = sink_events(server.url, sink_topic)
    assert set(seen) == set(range(EVENTS)) and set(seen.values()) == {1}  # exactly once
    moved = HandoffReader(store, edge).current()
    assert moved is not None and moved.generation >= 2 and moved.server == b.url
    end = progress["sources"][0]["endOffset"]
    offset = end if isinstance(end, dict) else __import__("json").loads(end)
    assert offset[edge]["generation"] == moved.generation  # the offsets carry it
    assert offset[edge]["server"] == b.url
    report = load_report(store, "enrich")
    assert report is not None and report.rebinds >= 1
    assert report.stale_dropped == 1  # the zombie's record, counted once
    status = subprocess.run([WAYMARK, "pipeline", "status", str(spec)], capture_output=True,
                            text=True, timeout=60, check=True,
                            env={**os.environ, "COLUMNS": "250"})  # fmt: skip
    assert "enrich" in status.stdout and b.url in status.stdout


def test_the_edge_options_are_checked_like_the_kafka_sources(tmp_path: Path) -> None:
    from pyspark.sql.types import StructType

    from waymark.spark.datasource import WaymarkDataSource
    from waymark.spark.edge_source import WaymarkEdgeStreamReader

    handoff = tmp_path.as_uri()
    cases = [
        ({"topics": "t", "edge": "e", "handoff": handoff, "stage": "s"}, "exactly one of"),
        ({"url": "http://x", "handoff": handoff}, "exactly one of"),
        ({"edge": "e", "stage": "s"}, "'handoff'"),
        ({"edge": "e", "handoff": handoff}, "'stage'"),
        ({"url": "http://x", "topics": "t", "handoff": handoff}, "goes with option 'edge'"),
        ({"edge": "e", "handoff": handoff, "stage": "s", "startingOffsets": "latest"},
         "startingOffsets"),
        ({"edge": "e", "handoff": handoff, "stage": "s", "maxRecordsPerTrigger": "0"},
         "positive integer"),
    ]  # fmt: skip
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            WaymarkDataSource(options).streamReader(StructType())
    reader = WaymarkDataSource({"edge": "e", "handoff": handoff, "stage": "s"}).streamReader(
        StructType()
    )
    assert isinstance(reader, WaymarkEdgeStreamReader)
    assert reader.initialOffset() == {
        "e": {"generation": 0, "server": "", "topic": "", "start_seq": 0, "seq": 0}
    }  # nothing placed yet: generation 0


def test_the_driver_acknowledges_only_the_published_generation_and_is_fenced(
    tmp_path: Path,
) -> None:
    """The driver's side without Spark: what a commit (or the next planning) saves as
    the stage's input position, and a newer query on the same stage fencing an older
    one (docs/semantics/pipeline.md §4.4, §7.3). The edge's server is a dead port: the
    acknowledged records' deletion is best effort."""
    from pyspark.sql.datasource import ReadAllAvailable

    from waymark.pipeline import HandoffWriter, QueueLocator, StageFenced, StageStateStore
    from waymark.spark.datasource import WaymarkDataSource
    from waymark.spark.edge import EdgeOffset, offsets_json

    handoff = tmp_path.as_uri()
    store = open_store(handoff)
    dead = "http://127.0.0.1:9"
    writer = HandoffWriter(store, "e")
    writer.publish(QueueLocator(edge="e", server=dead, topic="edge.e", generation=1))

    def reader() -> Any:
        options = {"edge": "e", "handoff": handoff, "stage": "s"}
        return WaymarkDataSource(options).streamReader(None)  # type: ignore[arg-type]

    def at(generation: int, seq: int) -> dict:
        return offsets_json("e", EdgeOffset(generation, dead, "edge.e", 0, seq))

    def acked() -> Position | None:
        state = StageStateStore(store).load("s")
        return state.input if state is not None else None

    first = reader()
    first.commit(at(1, 10))
    assert acked() == Position(1, 10)
    # planning the next batch acknowledges the one ending at its start (a late commit)
    assert first.latestOffset(at(1, 20), ReadAllAvailable()) == at(1, 20)  # server dead
    assert acked() == Position(1, 20)
    writer.publish(QueueLocator(edge="e", server=dead, topic="edge.e", generation=2))
    first.commit(at(1, 30))  # its reads may have given up on generation 1: no ack
    assert acked() == Position(1, 20)
    second = reader()  # a newer query of the same stage
    second.commit(at(2, 5))
    assert acked() == Position(2, 5)
    with pytest.raises(StageFenced):
        first.commit(at(2, 9))
    assert acked() == Position(2, 5)


def test_a_spark_stage_that_finds_records_gone_from_its_edge_moves_it_and_reads_them_again(
    spark: Any, server: Any, tmp_path: Path
) -> None:
    """A server restart loses a tail of the edge's topic its producer wrote (here,
    deterministically, an `ephemeral` edge topic loses every record). The records
    are not lost to the pipeline: the Spark stage never acknowledged them, so the
    producer holds them. The query's read meets the `lost` tombstone and moves the edge
    as a pipeline consumer does; the producer writes everything again into the new
    generation, and the query reads it there: each event exactly once at the sink,
    none skipped (docs/semantics/pipeline.md §7.4). Before, the query failed with
    WaymarkDataLoss, and again at every restart. With ``failOnDataLoss=true`` a read
    fails instead and leaves the edge where it is."""
    from pyspark.sql import functions as F
    from pyspark.sql.datasource import ReadAllAvailable
    from tests.conftest import start_server as start_on

    from waymark.client import ConfigPatch, Durability
    from waymark.faults.processes import free_port
    from waymark.pipeline import RelocatableQueueEdge
    from waymark.spark.datasource import WaymarkDataSource
    from waymark.spark.source import WaymarkDataLoss

    port = free_port()
    srv = start_on(tmp_path / "edge-data", port=port)
    handoff = (tmp_path / "handoff").as_uri()
    store = open_store(handoff)
    edge = f"gap{uuid.uuid4().hex[:8]}"
    producer = RelocatableQueueEdge(edge, [srv.url], store, consumer="enrich")
    events = [f"p:{n}" for n in range(15)]
    data = [b'{"event_id":%d}' % n for n in range(15)]
    sink_topic = f"out-{edge}"
    sink = Sink(server.url, sink_topic, connect=client_factory())
    sink.open()
    try:
        with Client(srv.url) as client:  # the edge's topic, as one a restart empties
            client.put_topic(producer.topic, ConfigPatch(durability=Durability.EPHEMERAL))
        producer.push(InFlight.of(events[:10], data[:10]))
        srv.process.terminate()
        srv.process.wait(10)
        srv = start_on(tmp_path / "edge-data", port=port)
        producer.push(InFlight.of(events[10:], data[10:]))
        assert producer.generation().value == 1  # the server answers: nothing moved it

        options = {"edge": edge, "handoff": handoff, "stage": "enrich"}
        loud = WaymarkDataSource({**options, "failOnDataLoss": "true"}).streamReader(None)  # type: ignore[arg-type]
        start = loud.initialOffset()
        end = loud.latestOffset(start, ReadAllAvailable())  # a batch over the gone records
        with pytest.raises(WaymarkDataLoss, match="failOnDataLoss=false"):
            list(loud.read(loud.partitions(start, end)[0]))
        assert HandoffReader(store, edge).current().generation == 1  # type: ignore[union-attr]

        def deliver(batch: Any, _batch_id: int) -> None:  # idempotent: docs/pipeline.md
            rows = batch.collect()
            sink.write(InFlight.of([r.event for r in rows], [r.data.encode() for r in rows]))

        stream = spark.readStream.format("waymark").options(**options).load()
        query = (
            stream.select(F.col("meta")["wm.event"].alias("event"), "data")
            .writeStream.foreachBatch(deliver)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="100 milliseconds").start()
        )  # fmt: skip
        try:

            def replayed() -> bool:
                producer.settle()  # follows the move and writes every event again there
                return len(sink_events(server.url, sink_topic)) == len(events)

            _wait(replayed, 120, "every event at the sink", query)

            def generation() -> int:  # of the last batch Spark reported
                ended = (query.lastProgress or {"sources": [{"endOffset": "{}"}]})["sources"][0]
                offset = ended["endOffset"]
                offset = offset if isinstance(offset, dict) else json.loads(offset)
                return int(offset.get(edge, {}).get("generation", 0))

            # the batch that read the last events reports the new generation in its offset
            _wait(lambda: generation() == 2, 60, "the new generation in the offsets", query)
        finally:
            query.stop()
        seen = sink_events(server.url, sink_topic)
        assert set(seen) == set(range(15)) and set(seen.values()) == {1}  # exactly once
        moved = HandoffReader(store, edge).current()
        assert moved is not None and moved.generation == 2 and moved.server == srv.url
        # That batch run again, as a restarted query runs its last planned batch: the same
        # rows (those before the gone ones), no second move.
        again = WaymarkDataSource(options).streamReader(None)  # type: ignore[arg-type]

        def rerun() -> list[Any]:
            parts = again.partitions(start, end)
            return [
                row for part in parts for batch in again.read(part) for row in batch.to_pylist()
            ]

        assert rerun() == rerun()
        assert HandoffReader(store, edge).current().generation == 2  # type: ignore[union-attr]
    finally:
        srv.process.kill()
        srv.process.wait()
