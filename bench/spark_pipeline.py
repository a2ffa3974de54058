"""The Spark part against Spark's own anchor, in one run and one session.

    .venv/bin/python bench/spark_pipeline.py [--rows 1600000] [--batch 400000]

1. source -> noop sink rows/s beside the built-in ``rate-micro-batch`` source (the
   rate source that produces exactly ``rowsPerBatch`` rows per micro-batch, so both
   run as fast as they can) with the same rows per batch;
2. one-batch latency (1000 rows per batch, median trigger time) beside the same;
3. ``read()`` alone — diff pages to Arrow batches in this process, no Spark — and
   the ceiling of any Python source with the same 7 columns (prebuilt batches, no
   I/O), to show how much of (1) is the source itself and how much Spark's side;
4. the demo's pipeline (per-user deltas to a topic and a fold, exactly once, 250k
   events per batch) over the whole topic, in events/s in the warm session.

Not a test: it prints figures and ratios, and the load average next to them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
from msgspec import Raw
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from waymark.cli.demo import Stream, _server
from waymark.protocol import Record
from waymark.spark.demo_job import Aggregate, JobConfig, events, session
from waymark.spark.partitions import ReadSettings, SeqRange
from waymark.spark.schema import SOURCE_DDL
from waymark.spark.source import PAGE, read_range, to_arrow

TOPIC = "bench.clicks"


class _Prebuilt(DataSourceStreamReader):
    """The ceiling of any Python source with the topic schema: the same 7 columns,
    one prebuilt 10k-row Arrow batch yielded again and again — no HTTP, no decoding."""

    def __init__(self, per_batch: int) -> None:
        self.per_batch = per_batch
        self.end = 0

    def initialOffset(self) -> dict:
        return {"rows": 0}

    def latestOffset(self) -> dict:
        self.end += self.per_batch
        return {"rows": self.end}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(i) for i in range(2)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        pages = self.per_batch // 2 // PAGE
        data = b'{"user":"user-012345","action":"click","page":"/product/1234","ts":1790000000000}'
        rows = [Record(seq=i, ts=1_790_000_000_000, data=Raw(data)) for i in range(PAGE)]
        batch = to_arrow("bench.clicks", rows)
        for _ in range(pages):
            yield batch

    def commit(self, end: dict) -> None:
        pass


class _PrebuiltSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "waymark_prebuilt"

    def schema(self) -> str:
        return SOURCE_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _Prebuilt(int(self.options["perBatch"]))


def produce(url: str, stream: Stream, rows: int, batch: int = 5000, producers: int = 3) -> float:
    chunks = iter(range(0, rows, batch))
    lock = threading.Lock()

    def producer() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while True:
                with lock:
                    lo = next(chunks, None)
                if lo is None:
                    return
                body = stream.body(lo, min(lo + batch, rows))
                http.post(f"/v0/topics/{TOPIC}/records", content=body).raise_for_status()

    began = time.perf_counter()
    threads = [threading.Thread(target=producer) for _ in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows / (time.perf_counter() - began)


def batches(df: Any, checkpoint: str, count: int, timeout: float = 300) -> list[dict[str, Any]]:
    """Run ``df`` into the noop sink until ``count`` batches after the first (warm-up)
    one have data; returns their progress reports."""
    query = df.writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            done = [p for p in query.recentProgress if p["numInputRows"] > 0]
            if len(done) > count:
                return done[1 : count + 1]
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.05)
        raise RuntimeError(f"{count} batches did not complete in {timeout}s")
    finally:
        query.stop()


def rows_per_s(progress: list[dict[str, Any]]) -> float:
    rows = sum(p["numInputRows"] for p in progress)
    return rows / (sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000)


def median_ms(progress: list[dict[str, Any]]) -> float:
    return statistics.median(p["durationMs"]["triggerExecution"] for p in progress)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_600_000, help="rows in the source topic")
    parser.add_argument("--batch", type=int, default=400_000, help="rows per micro-batch")
    a = parser.parse_args()
    console = Console(width=120)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="waymark-bench-spark-") as tmp, _server(
        Path(tmp) / "data"
    ) as url:  # fmt: skip
        stream = Stream(a.rows, 50_000, 3)
        produced = produce(url, stream, a.rows)
        console.print(f"produced {a.rows:,} click events at {produced:,.0f}/s")

        # (3) read() alone, two ranges as Spark would read them, one after the other.
        settings = ReadSettings(url, None, "fail", "gaps", PAGE)
        began = time.perf_counter()
        n = sum(b.num_rows for b in read_range(SeqRange(settings, TOPIC, 1, 0, a.batch)))
        read_alone = n / (time.perf_counter() - began)

        began = time.perf_counter()
        spark = session("waymark-bench")
        started = time.perf_counter() - began
        console.print(f"Spark session in {started:.1f}s")

        def waymark(per_batch: int) -> Any:
            reader = spark.readStream.format("waymark").option("url", url)
            reader = reader.option("topics", TOPIC).option("maxRecordsPerTrigger", per_batch)
            return reader.load()

        def rate(per_batch: int) -> Any:
            reader = spark.readStream.format("rate-micro-batch")
            return reader.option("rowsPerBatch", per_batch).option("numPartitions", 2).load()

        count = max(1, a.rows // a.batch - 1)
        # Warm both paths once (JIT, Python workers), then measure each.
        batches(waymark(a.batch), f"{tmp}/warm-w", 1)
        batches(rate(a.batch), f"{tmp}/warm-r", 1)
        w_tp = batches(waymark(a.batch), f"{tmp}/w", count)
        r_tp = batches(rate(a.batch), f"{tmp}/r", count)
        spark.dataSource.register(_PrebuiltSource)
        prebuilt = spark.readStream.format("waymark_prebuilt").option("perBatch", a.batch).load()
        batches(prebuilt, f"{tmp}/warm-p", 1)
        p_tp = batches(prebuilt, f"{tmp}/p", count)
        w_lat = batches(waymark(1000), f"{tmp}/wl", 10)
        r_lat = batches(rate(1000), f"{tmp}/rl", 10)

        cfg = JobConfig(url, TOPIC, "bench.user-deltas", f"lmdb:{tmp}/fold", f"{tmp}/pipeline",
                        250_000, a.rows)  # fmt: skip
        aggregate = Aggregate(cfg)
        query = events(spark, cfg).writeStream.foreachBatch(aggregate)
        began = time.perf_counter()
        run = query.option("checkpointLocation", cfg.checkpoint).trigger(availableNow=True)
        started_q = run.start()  # availableNow: the whole topic, then stop
        started_q.awaitTermination()
        elapsed = time.perf_counter() - began
        aggregate.close()
        pipeline_rows = sum(p["numInputRows"] for p in started_q.recentProgress)
        pipeline_batches = len(started_q.recentProgress)
        spark.stop()

    load_after = os.getloadavg()
    w_rate, r_rate = rows_per_s(w_tp), rows_per_s(r_tp)
    table = Table(
        title=f"waymark on Spark, one run (2 cores; load average {load[0]:.1f} before, "
        f"{load_after[0]:.1f} after)",
        title_justify="left",
    )
    for col in ("measure", "waymark", "anchor (same session)", "ratio"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    table.add_row(
        f"source -> noop, {a.batch:,} rows/batch",
        f"{w_rate:,.0f} rows/s",
        f"rate-micro-batch {r_rate:,.0f} rows/s",
        f"{w_rate / r_rate:.2f}x",
    )
    p_rate = rows_per_s(p_tp)
    table.add_row(
        "ceiling: a Python source, same 7 columns, prebuilt batches, no I/O",
        f"{p_rate:,.0f} rows/s",
        f"rate-micro-batch {r_rate:,.0f} rows/s",
        f"{p_rate / r_rate:.2f}x",
    )
    table.add_row(
        "waymark source against that ceiling",
        f"{w_rate:,.0f} rows/s",
        f"ceiling {p_rate:,.0f} rows/s",
        f"{w_rate / p_rate:.2f}x",
    )
    wl, rl = median_ms(w_lat), median_ms(r_lat)
    table.add_row(
        "one batch of 1,000 rows (median of 10)",
        f"{wl:.0f} ms",
        f"rate-micro-batch {rl:.0f} ms",
        f"{wl / rl:.2f}x",
    )
    table.add_row(
        "read() alone: diff pages -> Arrow (1 process)",
        f"{read_alone:,.0f} rows/s",
        f"Spark source above {w_rate:,.0f} rows/s",
        f"{w_rate / read_alone:.2f}x",
    )
    table.add_row(
        f"demo pipeline: {pipeline_rows:,} events, {pipeline_batches} batches",
        f"{pipeline_rows / elapsed:,.0f} events/s",
        f"source -> noop {w_rate:,.0f} rows/s",
        f"{pipeline_rows / elapsed / w_rate:.2f}x",
    )
    console.print(table)
    console.print(
        "rate-micro-batch rows are (timestamp, value); waymark rows carry 7 columns with ~90 "
        "bytes of JSON data each. Trigger times from Spark's progress reports."
    )


if __name__ == "__main__":
    if os.environ.get("PYSPARK_PYTHON") is None:
        os.environ["PYSPARK_PYTHON"] = sys.executable
    sys.exit(main())
