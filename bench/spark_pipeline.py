"""The fast data paths of issue #16 against their anchors, each in one run, one session.

    .venv/bin/python bench/spark_pipeline.py [--rows 1000000]

1. Arrow diff page, 100k rows, read with the shipped client (``diff_arrow``) beside
   the same records read as JSON pages (10 x 10k, the JSON limit) parsed with orjson;
2. Spark source -> ``noop``: one micro-batch of ``--rows`` records (after a warm-up
   batch) beside a do-nothing Python source yielding prebuilt Arrow batches of the
   same schema and rows (memory-mapped from an Arrow file), and beside the JVM
   ceiling: ``rate-micro-batch`` -> ``selectExpr`` building the same 7 columns;
3. Spark sink: ``--rows`` rows into the waymark sink beside the same query into
   ``noop``, and into a do-nothing Python sink (the ceiling of any Python sink);
4. the demo pipeline (per-user deltas to a topic and a fold, exactly once,
   availableNow over the whole input) beside the same aggregate job reading the same
   events from Spark's JSON file source.

``--master spark://HOST:PORT`` runs the Spark parts on a standalone cluster (``waymark
cluster up``; the prebuilt anchor's Arrow file is read by the executors, so the cluster
shares this machine's disk); ``--only sink`` measures the sink and its two anchors
alone, ``--pairs`` times alternated (the do-nothing Python sink, then the waymark sink),
each query measured over ``--batches`` micro-batches after its warm-up (default 1; one
batch a pair is a short sample on a shared machine), and prints each pair's ratio and
their median, and the topic server's CPU seconds per batch of the waymark sink (its
query's batches with the warm-up, averaged: stage, publish and seal).

Not a test: it prints figures and ratios (a rich table), and the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from waymark.cli.demo import ACTIONS, Stream, _server
from waymark.client import Client
from waymark.protocol import MAX_ARROW_DIFF_LIMIT, MAX_DIFF_LIMIT
from waymark.spark.demo_job import INPUT_DDL, Aggregate, JobConfig, events, session
from waymark.spark.partitions import ReadSettings, SeqRange
from waymark.spark.schema import ARROW_SCHEMA, SOURCE_DDL
from waymark.spark.source import PAGE, read_range

TOPIC = "bench.clicks"
# The JVM ceiling: the source's 7 columns from the rate source's value alone.
RATE_COLUMNS = (
    "'bench.clicks' as topic", "value as seq", "timestamp as ts", "cast(null as string) as node",
    "cast(null as string) as tag", "cast(null as map<string,string>) as meta",
    "concat('{\"user\":\"user-', lpad(cast(value % 50000 as string), 6, '0'), "
    "'\",\"action\":\"view\",\"page\":\"/product/', cast(value % 5000 as string), "
    "'\",\"ts\":', cast(1790000000000 + value * 3 as string), '}') as data",
)  # fmt: skip


class _Prebuilt(DataSourceStreamReader):
    """A do-nothing Python source: the same rows as Arrow batches of the source's schema,
    prebuilt in an Arrow file, yielded as they are (no HTTP, no decoding)."""

    def __init__(self, path: str, per_batch: int) -> None:
        self.path = path
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
        with pa.memory_map(self.path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(partition.value, reader.num_record_batches, 2):
                yield reader.get_batch(i)

    def commit(self, end: dict) -> None:
        pass


class _NullWriter(DataSourceStreamArrowWriter):
    """The ceiling of any Python sink: takes Spark's Arrow batches and does nothing."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list, batchId: int) -> None:
        pass

    def abort(self, messages: list, batchId: int) -> None:
        pass


class _NullSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "waymark_null"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        return _NullWriter()


class _PrebuiltSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "waymark_prebuilt"

    def schema(self) -> str:
        return SOURCE_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _Prebuilt(self.options["path"], int(self.options["perBatch"]))


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
                http.post(
                    f"/v0/topics/{TOPIC}/records",
                    content=body,
                    headers={"content-type": "application/json"},
                ).raise_for_status()

    began = time.perf_counter()
    threads = [threading.Thread(target=producer) for _ in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows / (time.perf_counter() - began)


def page_rates(url: str, rounds: int = 5) -> tuple[float, float]:
    """Rows/s of a 100k-row Arrow page and of the same rows as 10k JSON pages + orjson."""
    arrow_s = json_s = float("inf")
    with Client(url) as client, httpx.Client(base_url=url, timeout=60) as http:
        for _ in range(rounds):
            began = time.perf_counter()
            page = client.diff_arrow(TOPIC, 0, limit=MAX_ARROW_DIFF_LIMIT)
            arrow_s = min(arrow_s, time.perf_counter() - began)
            assert page.count == MAX_ARROW_DIFF_LIMIT
            began = time.perf_counter()
            cursor = rows = 0
            while rows < MAX_ARROW_DIFF_LIMIT:
                body = {"from_seq": cursor, "limit": MAX_DIFF_LIMIT}
                answer = orjson.loads(http.post(f"/v0/topics/{TOPIC}/diff", json=body).content)
                rows += len(answer["records"])
                cursor = answer["next_from_seq"]
            json_s = min(json_s, time.perf_counter() - began)
    return MAX_ARROW_DIFF_LIMIT / arrow_s, MAX_ARROW_DIFF_LIMIT / json_s


def batch_rate(
    df: Any, checkpoint: str, sink: str = "noop", batches: int = 1, **options: str
) -> float:
    """Rows/s of the ``batches`` micro-batches with data after the first (which warms
    the JVM and the Python workers), from Spark's progress reports: their rows over
    their summed ``triggerExecution``."""
    writer = df.writeStream.format(sink).option("checkpointLocation", checkpoint)
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            done = [p for p in query.recentProgress if p["numInputRows"] > 0]
            if len(done) >= 1 + batches:
                measured = done[1 : 1 + batches]
                rows = sum(p["numInputRows"] for p in measured)
                return rows / (sum(p["durationMs"]["triggerExecution"] for p in measured) / 1000)
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.05)
        raise RuntimeError("two batches did not complete in 600 s")
    finally:
        query.stop()


def pipeline_rate(spark: Any, cfg: JobConfig, df: Any) -> tuple[int, float]:
    """Events/s of the demo's aggregate job over ``df``, availableNow, start to stop."""
    aggregate = Aggregate(cfg)
    began = time.perf_counter()
    query = (
        df.writeStream.foreachBatch(aggregate).option("checkpointLocation", cfg.checkpoint)
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    aggregate.close()
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return rows, rows / elapsed


def sink_pairs(spark: Any, console: Console, url: str, prebuilt: str, a: Any, load: Any) -> None:
    """The sink against its anchors, ``a.pairs`` times alternated in one session."""
    import statistics

    def rows_out() -> Any:
        reader = spark.readStream.format("waymark_prebuilt").option("path", prebuilt)
        return reader.option("perBatch", a.rows).load().select("data", "tag")

    with tempfile.TemporaryDirectory(prefix="waymark-bench-sink-") as tmp:
        noop = batch_rate(rows_out(), f"{tmp}/n", batches=a.batches)
        # One query of each sink first, unmeasured: the JVM's JIT keeps speeding the
        # first queries up, which flattered whichever sink ran later.
        batch_rate(rows_out(), f"{tmp}/pw", "waymark_null")
        batch_rate(rows_out(), f"{tmp}/ww", "waymark", url=url, topic="warm")
        pairs, server_s, times = [], [], {"null": 0.0, "ours": 0.0}

        def null_sink(i: int) -> float:
            rate = batch_rate(rows_out(), f"{tmp}/p{i}", "waymark_null", a.batches)
            times["null"] += a.rows * a.batches / rate
            return rate

        def waymark_sink(i: int) -> float:
            began = _server_cpu()
            rate = batch_rate(rows_out(), f"{tmp}/w{i}", "waymark", a.batches, url=url,
                              topic=f"out{i}")  # fmt: skip
            server_s.append((_server_cpu() - began) / (1 + a.batches))  # with the warm-up
            times["ours"] += a.rows * a.batches / rate
            return rate

        for i in range(a.pairs):  # alternately first and second: no order favours either
            if i % 2:
                ours, null = waymark_sink(i), null_sink(i)
            else:
                null, ours = null_sink(i), waymark_sink(i)
            pairs.append((null, ours))
    load_after = os.getloadavg()
    table = Table(
        title=f"Spark sink, {a.rows:,} rows a batch, {a.batches} measured a query, on "
        f"{a.master or 'local[2]'} (load average "
        f"{load[0]:.1f} before, {load_after[0]:.1f} after); noop {noop:,.0f} rows/s",
        title_justify="left",
    )
    for col in ("pair", "do-nothing Python sink", "waymark sink", "ratio", "of noop",
                "server CPU a batch"):  # fmt: skip
        table.add_column(col, justify="right")
    for i, (null, ours) in enumerate(pairs):
        table.add_row(str(i + 1), f"{null:,.0f} rows/s", f"{ours:,.0f} rows/s",
                      f"{ours / null:.2f}x", f"{ours / noop:.2f}x",
                      f"{server_s[i]:.2f} s")  # fmt: skip
    median = statistics.median(ours / null for null, ours in pairs)
    table.add_row("median", "", "", f"{median:.2f}x", "")
    table.add_row("all batches", f"{a.rows * a.batches * a.pairs / times['null']:,.0f} rows/s",
                  f"{a.rows * a.batches * a.pairs / times['ours']:,.0f} rows/s",
                  f"{times['null'] / times['ours']:.2f}x", "")  # fmt: skip
    console.print(table)


def write_json_events(stream: Stream, rows: int, directory: Path, per_file: int) -> None:
    """The same events as JSON lines files, one file per micro-batch of the demo."""
    directory.mkdir()
    for lo in range(0, rows, per_file):
        lines = []
        for i in range(lo, min(lo + per_file, rows)):
            event = {
                "seq": i + 1,
                "user": f"user-{int(stream.user[i]):06d}",
                "action": ACTIONS[int(stream.action[i])].decode(),
                "cents": int(stream.cents[i]),
            }
            lines.append(orjson.dumps(event))  # fmt: skip
        (directory / f"events-{lo:09d}.json").write_bytes(b"\n".join(lines) + b"\n")


def _server_cpu() -> float:
    """CPU seconds the topic server (this process's ``waymark serve`` child) has used."""
    for pid in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == os.getpid() and b"serve" in cmdline:
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    raise RuntimeError("the topic server process was not found")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per measured batch")
    parser.add_argument("--master", default=None, help="spark://HOST:PORT (default local[2])")
    parser.add_argument("--only", choices=["all", "sink"], default="all")
    parser.add_argument("--pairs", type=int, default=3, help="with --only sink")
    parser.add_argument("--batches", type=int, default=1,
                        help="with --only sink: micro-batches measured a query")  # fmt: skip
    a = parser.parse_args()
    console = Console(width=140)
    load = os.getloadavg()
    total = 2 * a.rows  # a warm-up batch, then the measured one
    with tempfile.TemporaryDirectory(prefix="waymark-bench-spark-") as tmp, _server(
        Path(tmp) / "data"
    ) as url:  # fmt: skip
        stream = Stream(total, 50_000, 3)
        produced = produce(url, stream, total)
        console.print(f"produced {total:,} click events at {produced:,.0f}/s")
        if a.only == "all":
            arrow_rate, json_rate = page_rates(url)

        # The prebuilt anchor's batches: the topic's own rows, read once by read().
        settings = ReadSettings(url, None, "fail", "gaps", PAGE)
        prebuilt = f"{tmp}/prebuilt.arrow"
        began = time.perf_counter()
        server_cpu = _server_cpu()
        with Client(url) as client:  # not 1: the server's internal topics take epochs too
            epoch = client.get_topic(TOPIC, touch=False).epoch
        with pa.OSFile(prebuilt, "wb") as sink, pa.ipc.new_file(sink, ARROW_SCHEMA) as out:
            for batch in read_range(SeqRange(settings, TOPIC, epoch, 0, a.rows)):
                out.write_batch(batch)
        read_alone = a.rows / (time.perf_counter() - began)
        server_cpu = (_server_cpu() - server_cpu) * 1_000_000 / a.rows

        spark = session("waymark-bench", master=a.master)
        spark.dataSource.register(_PrebuiltSource)
        spark.dataSource.register(_NullSink)
        if a.only == "sink":
            sink_pairs(spark, console, url, prebuilt, a, load)
            spark.stop()
            return

        def waymark() -> Any:
            reader = spark.readStream.format("waymark").option("url", url)
            return reader.option("topics", TOPIC).option("maxRecordsPerTrigger", a.rows).load()

        def prebuilt_source() -> Any:
            reader = spark.readStream.format("waymark_prebuilt").option("path", prebuilt)
            return reader.option("perBatch", a.rows).load()

        def rate() -> Any:
            reader = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", a.rows)
            return reader.option("numPartitions", 2).load().selectExpr(*RATE_COLUMNS)

        source = batch_rate(waymark(), f"{tmp}/w")
        ceiling = batch_rate(prebuilt_source(), f"{tmp}/p")
        jvm = batch_rate(rate(), f"{tmp}/r")

        rows_out = prebuilt_source().select("data", "tag")
        noop_sink = batch_rate(rows_out, f"{tmp}/sn")
        null_sink = batch_rate(rows_out, f"{tmp}/sp", "waymark_null")
        waymark_sink = batch_rate(rows_out, f"{tmp}/sw", "waymark", url=url, topic="bench.out")

        cfg = JobConfig(url, TOPIC, "bench.user-deltas", f"lmdb:{tmp}/fold", f"{tmp}/pipeline",
                        250_000, total)  # fmt: skip
        events_n, pipeline = pipeline_rate(spark, cfg, events(spark, cfg))
        write_json_events(stream, total, Path(tmp) / "json", 250_000)
        json_cfg = JobConfig(url, TOPIC, "bench.user-deltas-json", f"lmdb:{tmp}/fold-json",
                             f"{tmp}/pipeline-json", 250_000, total)  # fmt: skip
        from pyspark.sql import functions as F

        json_events = (
            spark.readStream.schema(f"seq BIGINT, {INPUT_DDL}").option("maxFilesPerTrigger", 1)
            .json(f"{tmp}/json")
            .select("seq", "user",
                    F.when(F.col("action") == "purchase", 1).otherwise(0).alias("purchase"),
                    F.coalesce(F.col("cents"), F.lit(0)).alias("cents"))
        )  # fmt: skip
        json_n, json_pipeline = pipeline_rate(spark, json_cfg, json_events)
        spark.stop()

    load_after = os.getloadavg()
    table = Table(
        title=f"issue #16 targets, one run (2 cores; load average {load[0]:.1f} before, "
        f"{load_after[0]:.1f} after)",
        title_justify="left",
    )
    for col in ("measure", "waymark", "anchor (same run)", "ratio", "goal"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    table.add_row("Arrow diff page, 100k rows (client)", f"{arrow_rate:,.0f} rows/s",
                  f"JSON pages + orjson {json_rate:,.0f} rows/s",
                  f"{arrow_rate / json_rate:.2f}x", ">=3x")  # fmt: skip
    table.add_row(f"Spark source -> noop, {a.rows:,} records", f"{source:,.0f} rows/s",
                  f"prebuilt Arrow Python source {ceiling:,.0f} rows/s",
                  f"{source / ceiling:.2f}x", ">=0.8x")  # fmt: skip
    table.add_row("same, JVM ceiling", f"{source:,.0f} rows/s",
                  f"rate -> selectExpr 7 columns {jvm:,.0f} rows/s",
                  f"{source / jvm:.2f}x", "report")  # fmt: skip
    table.add_row(f"Spark sink, {a.rows:,} rows", f"{waymark_sink:,.0f} rows/s",
                  f"noop sink {noop_sink:,.0f} rows/s",
                  f"{waymark_sink / noop_sink:.2f}x", ">=0.5x")  # fmt: skip
    table.add_row("same, Python sink ceiling", f"{waymark_sink:,.0f} rows/s",
                  f"a do-nothing Python sink {null_sink:,.0f} rows/s",
                  f"{waymark_sink / null_sink:.2f}x", "report")  # fmt: skip
    table.add_row(f"demo pipeline, {events_n:,} events end to end", f"{pipeline:,.0f} events/s",
                  f"JSON file source, {json_n:,} events: {json_pipeline:,.0f} events/s",
                  f"{pipeline / json_pipeline:.2f}x", ">=0.5x")  # fmt: skip
    table.add_row("read() alone, no Spark (1 process)", f"{read_alone:,.0f} rows/s",
                  f"Spark source above {source:,.0f} rows/s", f"{source / read_alone:.2f}x",
                  "")  # fmt: skip
    console.print(table)
    console.print(
        f"The server's CPU for read() alone: {server_cpu:.2f} s per 1M records "
        "(Arrow pages rendered and sent)."
    )
    console.print(
        "Rates from Spark's progress reports (triggerExecution of the measured micro-batch); "
        "the pipelines from start to termination. Page reads: the best of 5."
    )


if __name__ == "__main__":
    if os.environ.get("PYSPARK_PYTHON") is None:
        os.environ["PYSPARK_PYTHON"] = sys.executable
    sys.exit(main())
