"""The Spark source reading a pipeline edge against the same source reading the same
topic (docs/spark.md, "A Spark stage of a pipeline").

One real ``waymark serve`` holds two identical topics of ``4 x --rows`` records as a
pipeline producer writes them (``meta`` with generation, event id and birth time);
a ``file://`` handoff store names one of them as the edge's generation 1. Each query
reads into ``noop`` with ``maxRecordsPerTrigger = --rows``; the first micro-batch
warms the JVM and the Python workers, the best of the next three is reported (from
Spark's progress report: the machine is shared, so the best is the least disturbed).

* anchor: ``option("topics", ...)`` — the topic source, no generation check;
* edge: ``option("edge", ...)`` — the same rows, the handoff followed, each row's
  generation looked up in its ``meta`` and checked, the batch acknowledged.

Run: ``.venv/bin/python bench/spark_edge.py [--rows 200000]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from waymark.client import Client, RecordIn
from waymark.objstore import open_store
from waymark.pipeline.locator import HandoffWriter, QueueLocator

EDGE = "bench"
TOPIC = f"edge.{EDGE}"
ANCHOR_TOPIC = "anchor.bench"  # the same records: the edge's reads delete what they acknowledge


def start(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    exe = str(Path(sys.executable).parent / "waymark")
    process = subprocess.Popen(
        [exe, "serve", "--port", "0", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    return process, process.stdout.readline().split()[3]


def fill(url: str, topic: str, rows: int) -> None:
    with Client(url, timeout=60) as client:
        for lo in range(0, rows, 5000):
            client.append(topic, [
                RecordIn(msgspec.Raw(b'{"event_id":%d,"user":"u%d","amount":%d}'
                                     % (n, n % 97, n % 13)),
                         meta={"wm.gen": "1", "wm.event": f"p:{n}", "wm.t0": "0"})
                for n in range(lo, min(rows, lo + 5000))
            ])  # fmt: skip


def session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import waymark.spark
    from waymark.spark.demo_job import JVM_OPTIONS

    spark = (
        SparkSession.builder.master("local[2]").appName("waymark-bench-edge")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    waymark.spark.register(spark)
    return spark


def rate(df: Any, checkpoint: str) -> float:
    """Rows/s of the best of micro-batches 2-4 with data, from Spark's progress report."""
    query = df.writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            done = [p for p in query.recentProgress if p["numInputRows"] > 0]
            if len(done) >= 4:
                return max(
                    p["numInputRows"] / (p["durationMs"]["triggerExecution"] / 1000)
                    for p in done[1:4]
                )
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.05)
        raise RuntimeError("four batches did not complete in 600 s")
    finally:
        query.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows per micro-batch")
    rows = parser.parse_args().rows
    console = Console(width=140)
    with tempfile.TemporaryDirectory(prefix="waymark-bench-edge-") as tmp:
        process, url = start(Path(tmp) / "data")
        try:
            fill(url, TOPIC, 4 * rows)
            fill(url, ANCHOR_TOPIC, 4 * rows)
            handoff = (Path(tmp) / "handoff").as_uri()
            HandoffWriter(open_store(handoff), EDGE).publish(QueueLocator(
                edge=EDGE, server=url, topic=TOPIC, generation=1, capacity=0, start_seq=0,
            ))  # fmt: skip
            spark = session()
            read = spark.readStream.format("waymark").option("maxRecordsPerTrigger", rows)
            load = os.getloadavg()[0]
            topic_rate = rate(read.option("url", url).option("topics", ANCHOR_TOPIC).load(),
                              f"{tmp}/ck-topic")  # fmt: skip
            read = spark.readStream.format("waymark").option("maxRecordsPerTrigger", rows)
            edge_rate = rate(read.option("edge", EDGE).option("handoff", handoff)
                             .option("stage", "bench").load(), f"{tmp}/ck-edge")  # fmt: skip
            spark.stop()
        finally:
            process.kill()
            process.wait()
    table = Table(title=f"Spark source -> noop, {rows:,} rows per micro-batch (best of 3), "
                  f"load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at end")  # fmt: skip
    for column in ("run", "rows/s", "vs anchor"):
        table.add_column(column, justify="left" if column == "run" else "right")
    table.add_row("anchor: option topics", f"{topic_rate:,.0f}", "1.00x")
    table.add_row("edge: option edge", f"{edge_rate:,.0f}", f"{edge_rate / topic_rate:.2f}x")
    console.print(table)


if __name__ == "__main__":
    main()
