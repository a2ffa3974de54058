"""A Spark driver on a standalone cluster, run by tests/spark/test_cluster.py as its own
process (one SparkContext per process; the other Spark tests hold a local one).

``python cluster_driver.py MASTER URL IN OUT CHECKPOINT MARKERS`` copies topic IN into
topic OUT with the exactly-once sink (``writeStream.format("waymark")``, availableNow,
batches of 1000 records in 2 tasks each).

Fault injector (named as such): every task of batch 0 touches
``MARKERS/task-<partition>-<attempt>-<pid>`` (pid: its Python worker) and then waits
until ``MARKERS/go`` exists, so the test can SIGKILL the worker machine that runs a
task while the task is in the middle of its batch.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from waymark.spark.demo_job import session

master, url, source, out, checkpoint, markers = sys.argv[1:7]


def hold_first_batch(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    if context.getLocalProperty("streaming.sql.batchId") == "0":
        where = Path(markers)
        name = f"task-{context.partitionId()}-{context.attemptNumber()}-{os.getpid()}"
        (where / name).touch()
        deadline = time.monotonic() + 120
        while not (where / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    yield from batches


spark = session("waymark-cluster-test", master=master)
stream = (
    spark.readStream.format("waymark").option("url", url).option("topics", source)
    .option("maxRecordsPerTrigger", "1000").option("minPartitions", "2").load()
)  # fmt: skip
copy = (
    stream.select("data").mapInArrow(hold_first_batch, "data STRING")
    .writeStream.format("waymark").option("url", url).option("topic", out)
    .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
)  # fmt: skip
copy.awaitTermination()
spark.stop()
