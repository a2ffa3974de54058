"""A Spark stage of a pipeline on a standalone cluster, run by tests/spark/test_cluster.py
as its own process (one SparkContext per process; the other Spark tests hold a local one).

``python cluster_edge_driver.py MASTER EDGE HANDOFF SINK_URL SINK_TOPIC CHECKPOINT STOP``
reads the relocatable edge EDGE (handoff store HANDOFF) as the external stage
``enrich`` and delivers each event to the pipeline sink topic SINK_TOPIC, which keeps
an event id once (docs/spark.md, "A Spark stage of a pipeline"), until the file STOP
exists. The executors reach an ``s3://`` handoff store through the ``AWS_*`` settings
the caller hands them (``spark.executorEnv.*``; docs/spark.md, "Running on a cluster").
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from waymark.pipeline import InFlight, Sink, client_factory
from waymark.spark.demo_job import session

master, edge, handoff, sink_url, sink_topic, checkpoint, stop = sys.argv[1:8]

sink = Sink(sink_url, sink_topic, connect=client_factory())
sink.open()


def deliver(batch: Any, _batch_id: int) -> None:
    rows = batch.collect()
    sink.write(InFlight.of([r.event for r in rows], [r.data.encode() for r in rows]))


spark = session("waymark-cluster-edge-test", master=master)
stream = (
    spark.readStream.format("waymark").option("edge", edge).option("handoff", handoff)
    .option("stage", "enrich").option("maxRecordsPerTrigger", 5).load()
)  # fmt: skip
query = (
    stream.selectExpr("meta['wm.event'] as event", "data")
    .writeStream.foreachBatch(deliver).option("checkpointLocation", checkpoint)
    .trigger(processingTime="100 milliseconds").start()
)  # fmt: skip
while not Path(stop).exists():
    if query.exception() is not None:
        raise SystemExit(f"the query failed: {query.exception()}")
    time.sleep(0.1)
query.stop()
spark.stop()
