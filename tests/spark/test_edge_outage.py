"""A Spark stage waits out an outage of the handoff store (docs/semantics/pipeline.md §10;
docs/spark.md, "A Spark stage of a pipeline"): the edge source's driver
calls (planning, committing) and its executors' reads go through the same patient
store as the pipeline runner, so an outage shorter than ``storeBudgetMs`` costs time,
not the query. The source's methods are called as Spark's driver and executors call
them (they run in Python workers a test cannot inject faults into); the store is the
production file:// store behind the fault injector of tests/pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.pipeline.conftest import StoreFaults

from waymark.client import Client, RecordIn
from waymark.objstore import ObjectStore, ObjectStoreError, open_store
from waymark.pipeline import InFlight, Position, RelocatableQueueEdge, StageStateStore
from waymark.pipeline.report import load_report
from waymark.spark import edge_source


def test_the_edge_source_waits_out_a_handoff_store_outage(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql.datasource import ReadAllAvailable

    from waymark.spark.datasource import WaymarkDataSource
    from waymark.spark.edge import parse_offsets

    handoff = tmp_path.as_uri()
    store = open_store(handoff)
    producer = RelocatableQueueEdge("e", [server.url], store, consumer="s")
    producer.push(InFlight.of([f"e:{n}" for n in range(20)], [b"%d" % n for n in range(20)]))
    producer.relocate()  # generation 2, on the same server: generation 1's records are stale
    producer.settle()  # the 20 records again, under generation 2
    placed = producer.locator
    assert placed is not None and placed.generation == 2
    with Client(server.url) as client:  # and one a producer that missed the move wrote
        client.append(placed.topic, [RecordIn.of(0, meta={"wm.gen": "1", "wm.event": "z"})])

    faults = StoreFaults()

    def faulty(url: str, **kwargs: Any) -> ObjectStore:
        return faults.wrap(open_store(url, **kwargs))

    monkeypatch.setattr(edge_source, "open_store", faulty)

    def reader(**options: str) -> Any:
        options = {"edge": "e", "handoff": handoff, "stage": "s", **options}
        return WaymarkDataSource(options).streamReader(None)  # type: ignore[arg-type]

    spark_stage = reader()
    faults.outage_calls = 3  # each driver and executor call below meets an outage first
    start = spark_stage.initialOffset()
    assert parse_offsets("e", start).position == Position(2, placed.start_seq)
    faults.outage_calls = 3
    end = spark_stage.latestOffset(start, ReadAllAvailable())
    faults.outage_calls = 3  # a read records the stale row it dropped
    rows = [row for part in spark_stage.partitions(start, end)
            for batch in spark_stage.read(part) for row in batch.to_pylist()]  # fmt: skip
    assert sorted(int(r["data"]) for r in rows) == list(range(20))
    faults.outage_calls = 3
    spark_stage.commit(end)  # acknowledged to the producer, and reported
    assert faults.failed == 12 and faults.outage_calls == 0
    state = StageStateStore(store).load("s")
    assert state is not None and state.input == parse_offsets("e", end).position
    report = load_report(store, "s")
    assert report is not None and report.stale_dropped == 1
    producer.settle()
    assert not producer.unacked  # the producer forgot what the Spark stage acknowledged

    # past the budget, the call fails (the query with it) instead of waiting forever
    impatient = reader(storeBudgetMs="100")
    faults.down = True
    with pytest.raises(ObjectStoreError, match="injected outage"):
        impatient.initialOffset()


def test_max_offsets_per_trigger_on_an_edge_counts_items_cut_at_whole_packs(
    server: Any, tmp_path: Path
) -> None:
    """On an edge an offset is a pack of up to 1,000 items: ``maxOffsetsPerTrigger``
    caps a micro-batch's items (rows), as Kafka's caps records, cutting at whole packs
    and never below one pack, so every batch progresses (docs/spark.md, "A Spark stage
    of a pipeline"). Counted per pack seq it would let 1,500 packs, 1,500,000 rows, in."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from waymark.spark.datasource import WaymarkDataSource
    from waymark.spark.edge import parse_offsets

    handoff = tmp_path.as_uri()
    producer = RelocatableQueueEdge("e", [server.url], open_store(handoff), consumer="s")
    for lo in range(0, 3000, 1000):  # three packs of 1,000 items
        producer.push(InFlight.of([f"e:{n}" for n in range(lo, lo + 1000)],
                                  [b"%d" % n for n in range(lo, lo + 1000)]))  # fmt: skip
    stage = WaymarkDataSource({"edge": "e", "handoff": handoff, "stage": "s"}).streamReader(
        None  # type: ignore[arg-type]
    )
    start = stage.initialOffset()

    def rows(limit: Any) -> int:
        end = stage.latestOffset(start, limit)
        return sum(batch.num_rows for part in stage.partitions(start, end)
                   for batch in stage.read(part))  # fmt: skip

    assert rows(ReadMaxRows(1500)) == 1000  # one whole pack: a second makes 2,000
    assert rows(ReadMaxRows(2000)) == 2000
    assert rows(ReadMaxRows(10)) == 1000  # never below one pack
    assert rows(ReadAllAvailable()) == 3000
    assert parse_offsets("e", stage.latestOffset(start, ReadMaxRows(1500))).seq == (
        parse_offsets("e", start).seq + 1
    )
