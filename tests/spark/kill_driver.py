"""A Spark driver the SIGKILL test runs as its own process (and process group).

``python kill_driver.py URL IN OUT FOLD CHECKPOINT KILL`` runs two availableNow
queries over topic IN: an exactly-once copy into topic OUT, then a per-user count
folded into the LMDB fold FOLD. KILL is ``sink:N``, ``fold:N`` or ``none``.

Fault injector (named as such): with ``sink:N`` the sink SIGKILLs the whole driver
(JVM, Python workers) right after publishing batch N, i.e. between the sink commit
and Spark's ``commits/N``; ``fold:N`` does the same right after folding batch N.
That window cannot be hit reliably from outside the process.
"""

from __future__ import annotations

import os
import signal
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from waymark.spark import FoldSink
from waymark.spark.datasource import WaymarkDataSource
from waymark.spark.sink import WaymarkStreamWriter

url, source, out, fold_path, checkpoint, kill = sys.argv[1:7]
where, _, at = kill.partition(":")
kill_batch = int(at) if at else -1
os.environ["WAYMARK_TEST_KILL_PGID"] = str(os.getpgid(0))


def _kill_driver() -> None:
    os.killpg(int(os.environ["WAYMARK_TEST_KILL_PGID"]), signal.SIGKILL)


class KillingWriter(WaymarkStreamWriter):
    def commit(self, messages, batchId):  # type: ignore[no-untyped-def]
        super().commit(messages, batchId)
        if batchId == int(os.environ["WAYMARK_TEST_KILL_BATCH"]):
            _kill_driver()


class KillingSource(WaymarkDataSource):
    @classmethod
    def name(cls) -> str:
        return "waymark_killing"

    def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]
        return KillingWriter(self.options, schema)


os.environ["WAYMARK_TEST_KILL_BATCH"] = str(kill_batch if where == "sink" else -1)
spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
spark.dataSource.register(WaymarkDataSource)
spark.dataSource.register(KillingSource)


def stream():  # type: ignore[no-untyped-def]
    reader = spark.readStream.format("waymark").option("url", url).option("topics", source)
    return reader.option("maxRecordsPerTrigger", "100").load()


copy = (
    stream().select("data").writeStream.format("waymark_killing")
    .option("url", url).option("topic", out).option("writerId", out)
    .option("checkpointLocation", f"{checkpoint}/copy").trigger(availableNow=True).start()
)  # fmt: skip
copy.awaitTermination()

sink = FoldSink(f"lmdb:{fold_path}", key="key", value="value", merge=lambda old, n: (old or 0) + n)


def fold(df, batch_id):  # type: ignore[no-untyped-def]
    sink(df, batch_id)
    if where == "fold" and batch_id == kill_batch:
        _kill_driver()


counts = stream().select(F.get_json_object("data", "$.u").alias("key"), F.lit(1).alias("value"))
folding = (
    counts.writeStream.foreachBatch(fold)
    .option("checkpointLocation", f"{checkpoint}/fold").trigger(availableNow=True).start()
)  # fmt: skip
folding.awaitTermination()
sink.close()
spark.stop()
