"""Where a sink micro-batch's wall time goes, inside Spark (issue #27, "Sink speed").

    .venv/bin/python bench/sink_wall_probe.py [--rows 300000] [--batches 4] [--master URL]

One Spark session (``local[2]`` or ``--master``) and one topic server: a query from the
prebuilt Arrow source of ``bench/spark_pipeline.py`` into a timed subclass of the waymark
sink, ``--batches`` micro-batches of ``--rows`` rows, then the same into the do-nothing
Python sink. Every writer the sink builds, every task and every commit appends a line of
wall-clock timings to a file (the writer's construction with its ``open_writer`` round
trip, a task's encode and stage requests, the commit's publish request); Spark's progress
reports give each micro-batch's phases (``addBatch`` holds the tasks and the commit). At
the end: the writer's epoch on the server (how many writers were opened) and the medians.

Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pyspark import cloudpickle

import spark_pipeline
from spark_pipeline import TOPIC, _NullSink, _PrebuiltSource, produce
from waymark.cli.demo import Stream, _server
from waymark.client import Client
from waymark.spark.datasource import WaymarkDataSource
from waymark.spark.demo_job import session
from waymark.spark.partitions import ReadSettings, SeqRange
from waymark.spark.schema import ARROW_SCHEMA
from waymark.spark.sink import WaymarkStreamWriter
from waymark.spark.source import PAGE, read_range

cloudpickle.register_pickle_by_value(spark_pipeline)  # the workers lack bench/
LOG = os.environ.get("WAYMARK_WALL_PROBE", "/tmp/waymark-wall-probe.jsonl")


def _note(**fields: Any) -> None:
    with open(LOG, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), "t": time.time(), **fields}) + "\n")


class _TimedWriter(WaymarkStreamWriter):
    def __init__(self, options: Any, schema: Any) -> None:
        began = time.perf_counter()
        super().__init__(options, schema)
        _note(kind="writer", s=time.perf_counter() - began)

    def __getstate__(self) -> dict[str, Any]:  # the planning writer opens its epoch here
        began = time.perf_counter()
        state = super().__getstate__()
        _note(kind="open", s=time.perf_counter() - began, epoch=self._epoch)
        return state

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Any:  # type: ignore[override]
        began = time.perf_counter()
        waited = [0.0]

        def timed() -> Iterator[pa.RecordBatch]:
            while True:
                t0 = time.perf_counter()
                batch = next(iterator, None)
                waited[0] += time.perf_counter() - t0
                if batch is None:
                    return
                yield batch

        message = super().write(timed())
        _note(kind="task", s=time.perf_counter() - began, spark_s=waited[0])
        return message

    def commit(self, messages: Any, batchId: int) -> None:
        began = time.perf_counter()
        super().commit(messages, batchId)
        _note(kind="commit", s=time.perf_counter() - began, batch=batchId)


class _TimedSource(WaymarkDataSource):
    @classmethod
    def name(cls) -> str:
        return "waymark_timed"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from waymark.spark.options import STREAM_SINK, resolve

        return _TimedWriter(resolve(self.options, STREAM_SINK), schema)


def run(df: Any, checkpoint: str, batches: int, sink: str, **options: str) -> list[dict]:
    writer = df.writeStream.format(sink).option("checkpointLocation", checkpoint)
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            done = [p for p in query.recentProgress if p["numInputRows"] > 0]
            if len(done) >= batches:
                return done
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.05)
        raise RuntimeError("the batches did not complete")
    finally:
        query.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--master", default=None)
    a = parser.parse_args()
    Path(LOG).unlink(missing_ok=True)
    os.environ["WAYMARK_WALL_PROBE"] = LOG
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="waymark-wall-probe-") as tmp, _server(
        Path(tmp) / "data"
    ) as url:  # fmt: skip
        produce(url, Stream(a.rows, 50_000, 3), a.rows)
        prebuilt = f"{tmp}/prebuilt.arrow"
        with Client(url) as client:
            epoch = client.get_topic(TOPIC, touch=False).epoch
        settings = ReadSettings(url, None, "fail", "gaps", PAGE)
        with pa.OSFile(prebuilt, "wb") as sink, pa.ipc.new_file(sink, ARROW_SCHEMA) as out:
            for batch in read_range(SeqRange(settings, TOPIC, epoch, 0, a.rows)):
                out.write_batch(batch)
        spark = session("waymark-wall-probe", master=a.master)
        for source in (_PrebuiltSource, _NullSink, _TimedSource):
            spark.dataSource.register(source)

        def rows_out() -> Any:
            reader = spark.readStream.format("waymark_prebuilt").option("path", prebuilt)
            return reader.option("perBatch", a.rows).load().select("data", "tag")

        ours = run(rows_out(), f"{tmp}/w", a.batches, "waymark_timed", url=url, topic="out",
                   writerId="probe")  # fmt: skip
        null = run(rows_out(), f"{tmp}/n", a.batches, "waymark_null")
        with Client(url) as client:
            epochs = {w.writer: w.epoch for w in client.list_writers()}
        spark.stop()
    notes = [json.loads(line) for line in Path(LOG).read_text().splitlines()]
    print(f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"{a.batches} batches of {a.rows:,} rows, the first a warm-up")  # fmt: skip
    print(f"writers opened: epoch {epochs.get('probe')} after {a.batches} batches "
          f"(+1 per writer built)")  # fmt: skip
    for name, progress in (("waymark", ours), ("do-nothing", null)):
        for key in ("triggerExecution", "addBatch", "queryPlanning", "walCommit",
                    "commitOffsets", "latestOffset", "getBatch"):  # fmt: skip
            values = [p["durationMs"].get(key, 0) for p in progress[1:]]
            print(f"  {name:<10} {key:<17} median {statistics.median(values):6.0f} ms  {values}")
    for kind in ("writer", "open", "task", "commit"):
        values = [n["s"] * 1000 for n in notes if n["kind"] == kind]
        if values:
            print(f"  waymark {kind:<7} n={len(values):<3} median {statistics.median(values):6.0f} "
                  f"ms  {[round(v) for v in values]}")  # fmt: skip
    spark_s = [n["spark_s"] * 1000 for n in notes if n["kind"] == "task"]
    print(f"  waymark task, waiting on Spark for its batches: {[round(v) for v in spark_s]} ms")


if __name__ == "__main__":
    if os.environ.get("PYSPARK_PYTHON") is None:
        os.environ["PYSPARK_PYTHON"] = sys.executable
    sys.exit(main())
