"""A Spark driver the SIGKILL test runs as its own process (and process group).

``python kill_driver.py URL IN OUT FOLD CHECKPOINT KILL`` runs two availableNow
queries over topic IN at once: an exactly-once copy into topic OUT, and a per-user
count folded into the LMDB fold FOLD. KILL is ``both:N`` or ``none``.

Fault injector (named as such): with ``both:N`` the copy's sink, right after
publishing batch N, and the fold, right after folding batch N, each wait for the
other to get there; then the whole driver (JVM, Python workers) is SIGKILLed. Both
queries die between their sink commit and Spark's ``commits/N`` — a window that
cannot be hit reliably from outside the process. One driver start serves both.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from waymark.spark import FoldSink
from waymark.spark.datasource import WaymarkDataSource
from waymark.spark.demo_job import JVM_OPTIONS
from waymark.spark.sink import WaymarkStreamWriter

url, source, out, fold_path, checkpoint, kill = sys.argv[1:7]
where, _, at = kill.partition(":")
os.environ["WAYMARK_TEST_KILL_PGID"] = str(os.getpgid(0))
os.environ["WAYMARK_TEST_KILL_BATCH"] = at if where == "both" else "-1"
os.environ["WAYMARK_TEST_MARKERS"] = checkpoint


def _reached(side: str, batch: int) -> None:
    """Mark that ``side`` committed ``batch``; once both sides have, kill the driver."""
    if batch != int(os.environ["WAYMARK_TEST_KILL_BATCH"]):
        return
    markers = Path(os.environ["WAYMARK_TEST_MARKERS"])
    (markers / f"reached-{side}").touch()
    other = markers / ("reached-fold" if side == "sink" else "reached-sink")
    deadline = time.monotonic() + 120
    while not other.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(int(os.environ["WAYMARK_TEST_KILL_PGID"]), signal.SIGKILL)


class KillingWriter(WaymarkStreamWriter):
    def commit(self, messages, batchId):  # type: ignore[no-untyped-def]
        super().commit(messages, batchId)
        _reached("sink", batchId)


class KillingSource(WaymarkDataSource):
    @classmethod
    def name(cls) -> str:
        return "waymark_killing"

    def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]
        return KillingWriter(self.options, schema)


# Two attempts per task, as the other Spark tests and a cluster (spark.task.maxFailures)
# allow: now and then, in a freshly started JVM whose two queries send their first
# tasks at once, a task fails while Spark deserializes it (a Java ObjectInputStream
# error in ResultTask.runTask, before any Python worker or waymark code runs). A retried
# attempt is part of what the sink's exactly-once promise covers (docs/spark.md).
spark = (
    SparkSession.builder.master("local[2,2]")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
spark.dataSource.register(WaymarkDataSource)
spark.dataSource.register(KillingSource)


def stream():  # type: ignore[no-untyped-def]
    reader = spark.readStream.format("waymark").option("url", url).option("topics", source)
    return reader.option("maxRecordsPerTrigger", "100").load()


sink = FoldSink(f"lmdb:{fold_path}", key="key", value="value", merge=lambda old, n: (old or 0) + n)


def fold(df, batch_id):  # type: ignore[no-untyped-def]
    sink(df, batch_id)
    _reached("fold", batch_id)


copy = (
    stream().select("data").writeStream.format("waymark_killing")
    .option("url", url).option("topic", out).option("writerId", out)
    .option("checkpointLocation", f"{checkpoint}/copy").trigger(availableNow=True).start()
)  # fmt: skip
counts = stream().select(F.get_json_object("data", "$.u").alias("key"), F.lit(1).alias("value"))
folding = (
    counts.writeStream.foreachBatch(fold)
    .option("checkpointLocation", f"{checkpoint}/fold").trigger(availableNow=True).start()
)  # fmt: skip
copy.awaitTermination()
folding.awaitTermination()
sink.close()
spark.stop()
