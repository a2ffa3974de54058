"""The demo's Spark job: per-user aggregates of a click stream, exactly once.

One streaming query reads the input topic (admission control bounds each
micro-batch) and, per micro-batch (``foreachBatch``), computes each user's
deltas — events, purchases, cents, first and last seq — then writes them

* to the output topic with ``df.write.format("waymark")`` under the batch id
  (the exactly-once sink's two-phase commit: a replayed batch is published once),
* and into a fold store with :class:`~waymark.spark.FoldSink`, whose ``merge``
  adds the deltas to the stored totals (the batch id is the store's cursor, so a
  replayed batch is skipped rather than added twice).

Run as a child process (``python -m waymark.spark.demo_job ARGS``) so the demo can
SIGKILL the whole driver (JVM and Python workers) and restart it from its
checkpoint. Progress goes to stdout as JSON lines::

    {"event": "ready", "seconds": 11.2}
    {"event": "batch", "batch": 3, "seq": 400000, "rows": 100000}
    {"event": "done", "seconds": 41.0}

The job stops once it has read the input up to ``--until`` (the input's head seq
once the producers are done).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
INPUT_DDL = "user STRING, action STRING, cents BIGINT"  # the fields the job reads


@dataclass(frozen=True)
class JobConfig:
    url: str
    input_topic: str
    output_topic: str
    fold: str  # BACKEND:PATH of the fold store
    checkpoint: str
    max_per_trigger: int
    until: int  # stop once both queries have read up to this input seq
    master: str | None = None  # a cluster's spark://HOST:PORT; None: local[2]

    def args(self) -> list[str]:
        return [
            "--url", self.url, "--input", self.input_topic, "--output", self.output_topic,
            "--fold", self.fold, "--checkpoint", self.checkpoint,
            "--max-per-trigger", str(self.max_per_trigger), "--until", str(self.until),
            *(["--master", self.master] if self.master else []),
        ]  # fmt: skip


def session(app_name: str = "waymark-demo", cores: int = 2, master: str | None = None) -> Any:
    """A session tuned for small machines: few shuffle partitions, no UI, and a second
    attempt for a failed task, as a cluster allows (``spark.task.maxFailures``).

    ``master`` (``spark://HOST:PORT``) runs the executors on a standalone cluster, one
    core and 1 GB each, ``cores`` of them at most; the executors run this driver's
    Python (``spark.pyspark.python``), which must exist on every worker
    (docs/spark.md, "Running on a cluster").
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import waymark
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master or f"local[{cores},2]")
    if master:
        builder = (
            builder.config("spark.executor.cores", "1")
            .config("spark.executor.memory", "1g")
            .config("spark.cores.max", str(cores))
            .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
            .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
        )
        if _loopback(master):  # executors on this machine reach the driver here
            builder = builder.config("spark.driver.host", "127.0.0.1").config(
                "spark.driver.bindAddress", "127.0.0.1"
            )
    spark = (
        builder.appName(app_name)
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.driver.memory", "2g")
        # The driver's Python side waits this long for the JVM's socket (a collect, an
        # Arrow batch); Spark's 15 s ran out on a loaded 2-core machine.
        .config("spark.python.authenticate.socketTimeout", "120s")
        # Arrow batches Spark hands a Python sink: fewer, larger ones (default 10k rows;
        # docs/spark.md, "Exactly-once topic sink").
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50000")
        # A short job on few cores: C1-only JIT and the serial GC leave the CPU to the
        # job (measured: session start 16 s -> 8-10 s, whole job ~30% faster).
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    import waymark.spark

    waymark.spark.register(spark)
    return spark


def _loopback(master: str) -> bool:
    host = master.removeprefix("spark://").rsplit(":", 1)[0]
    return host in ("localhost", "::1", "[::1]") or host.startswith("127.")


def add_totals(old: dict[str, int] | None, new: dict[str, int]) -> dict[str, int]:
    """The fold's merge: add a batch's per-user deltas to the stored totals."""
    if old is None:
        return new
    return {k: old.get(k, 0) + v for k, v in new.items()}


def events(spark: Any, cfg: JobConfig) -> Any:
    """The input topic as (seq, user, purchase 0/1, cents) rows."""
    from pyspark.sql import functions as F

    from waymark.spark import with_parsed_data

    stream = (
        spark.readStream.format("waymark").option("url", cfg.url)
        .option("subscribe", cfg.input_topic)
        .option("maxOffsetsPerTrigger", str(cfg.max_per_trigger)).load()
    )  # fmt: skip
    parsed = with_parsed_data(stream.select("seq", "data"), INPUT_DDL)
    return parsed.select(
        "seq",
        F.col("data.user").alias("user"),
        F.when(F.col("data.action") == "purchase", 1).otherwise(0).alias("purchase"),
        F.coalesce(F.col("data.cents"), F.lit(0)).alias("cents"),
    )


class Aggregate:
    """The ``foreachBatch`` function: one batch's per-user deltas to the topic and the fold.

    The deltas (one row per user the batch touched) are collected once as Arrow;
    :class:`~waymark.spark.TopicBatchSink` stages and publishes them under the batch
    id (exactly once), then the fold sink adds them to the stored totals (skipped
    if the store's cursor already holds the batch id).
    """

    def __init__(self, cfg: JobConfig) -> None:
        from waymark.spark import FoldSink, TopicBatchSink

        self.topic = TopicBatchSink(cfg.url, f"demo-aggregates:{cfg.output_topic}",
                                    cfg.output_topic)  # fmt: skip
        self.fold = FoldSink(cfg.fold, key="user", value="value", merge=add_totals)
        self.steps: dict[int, dict[str, Any]] = {}  # per batch id: where its time went

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        began = time.perf_counter()
        deltas = df.groupBy("user").agg(
            F.count(F.lit(1)).alias("events"),
            F.sum("purchase").alias("purchases"),
            F.sum("cents").alias("cents"),
            F.min("seq").alias("first_seq"),
            F.max("seq").alias("last_seq"),
        )
        row = F.struct(
            F.lit(batch_id).alias("batch"), "user", "events", "purchases", "cents",
            "first_seq", "last_seq",
        )  # fmt: skip
        table = deltas.select(
            "user", F.struct("events", "purchases", "cents").alias("value"),
            F.to_json(row).alias("data"),
        ).toArrow()  # fmt: skip
        aggregated = time.perf_counter()
        published = self.topic.publish(table.select(["data"]), batch_id)
        topic = time.perf_counter()
        folded = self.fold.fold_rows(table.select(["user", "value"]).to_pylist(), batch_id)
        self.steps[batch_id] = {
            "aggregate_s": round(aggregated - began, 3),
            "topic_s": round(topic - aggregated, 3),
            "fold_s": round(time.perf_counter() - topic, 3),
            "users": table.num_rows,
            "topic_replayed": any(r.replayed for r in published.values()),
            "fold_skipped": not folded,
        }

    def close(self) -> None:
        self.fold.close()


def end_seq(progress: dict[str, Any], topic: str) -> int:
    """The input seq a query's progress report says its batch read up to."""
    offset = progress["sources"][0]["endOffset"]
    if isinstance(offset, str):
        offset = json.loads(offset)
    return int(offset[topic]["seq"])


def run_until(spark: Any, cfg: JobConfig, report: Any = None, poll_s: float = 0.1) -> int:
    """Run the query until it has read the input up to ``cfg.until``; returns its batches."""
    aggregate = Aggregate(cfg)
    query = (
        events(spark, cfg).writeStream.foreachBatch(aggregate)
        .option("checkpointLocation", cfg.checkpoint).queryName("aggregates").start()
    )  # fmt: skip
    last, batches = -1, 0
    try:
        while True:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            progresses = [p for p in query.recentProgress if p["batchId"] > last and p["sources"]]
            for progress in progresses:
                last = progress["batchId"]
                batches += 1
                seq = end_seq(progress, cfg.input_topic)
                if report is not None:
                    report({"event": "batch", "batch": last, "seq": seq,
                            "rows": progress["numInputRows"],
                            "ms": progress["durationMs"].get("triggerExecution"),
                            "steps": aggregate.steps.get(last, {})})  # fmt: skip
                if seq >= cfg.until:
                    return batches
            time.sleep(poll_s)
    finally:
        query.stop()
        aggregate.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--fold", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-per-trigger", type=int, required=True)
    parser.add_argument("--until", type=int, required=True)
    parser.add_argument("--master", default=None)
    a = parser.parse_args(argv)
    cfg = JobConfig(a.url, a.input, a.output, a.fold, a.checkpoint, a.max_per_trigger, a.until,
                    a.master)  # fmt: skip

    def report(event: dict[str, Any]) -> None:
        print(json.dumps(event), flush=True)

    began = time.perf_counter()
    spark = session(master=cfg.master)
    report({"event": "ready", "seconds": round(time.perf_counter() - began, 2)})
    run_until(spark, cfg, report)
    report({"event": "done", "seconds": round(time.perf_counter() - began, 2)})
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
