"""waymark on Spark: the topic source, the exactly-once topic sink and the fold sink.

>>> from waymark import spark as ws
>>> ws.register(session)
>>> reader = session.readStream.format("waymark").option("url", url)
>>> stream = reader.option("subscribe", "clicks").load()
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING, cast

from .connection import connect
from .schema import parse_data, with_parsed_data

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .fold_sink import FoldSink
    from .sink import TopicBatchSink


def register(spark: SparkSession) -> None:
    """Register every waymark data source on ``spark`` (today: the ``waymark`` format).

    Fails at once if Spark's Python workers could not import waymark (they run
    ``PYSPARK_PYTHON``, not this interpreter), rather than in the first task.
    """
    from .datasource import WaymarkDataSource

    check_worker_python(spark)
    spark.dataSource.register(WaymarkDataSource)


def check_worker_python(spark: SparkSession) -> None:
    """Raise ``RuntimeError`` if the Python that Spark starts for its workers cannot
    import waymark.

    That Python is the session's ``pythonExec``: ``PYSPARK_PYTHON`` when the
    SparkContext was created (``spark-submit`` sets it from ``spark.pyspark.python``),
    else ``python3`` on PATH. It is run once with ``-c "import waymark"`` in the
    workers' environment. Only local masters are checked: elsewhere the workers'
    Python lives on other machines.
    """
    try:
        context = spark.sparkContext
    except (AttributeError, NotImplementedError):  # Spark Connect: the workers are remote
        return
    # A running context always has its master (the stubs allow None).
    if not cast(str, context.master).startswith("local"):
        return
    python = context.pythonExec
    env = {**os.environ, **{k: str(v) for k, v in context.environment.items()}}
    try:
        probe = subprocess.run(
            [python, "-c", "import waymark"], env=env, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        reason = str(e)
    else:
        if probe.returncode == 0:
            return
        lines = probe.stderr.strip().splitlines()
        reason = lines[-1] if lines else f"exit status {probe.returncode}"
    unset = python == "python3" and "PYSPARK_PYTHON" not in os.environ
    origin = "the default: PYSPARK_PYTHON is unset" if unset else "PYSPARK_PYTHON"
    raise RuntimeError(
        f"Spark's Python workers run {python!r} ({origin}), which cannot import waymark "
        f"({reason}): set PYSPARK_PYTHON to a Python that has waymark, e.g. "
        f"PYSPARK_PYTHON={sys.executable} (this driver's), before the SparkSession is "
        "created (with spark-submit: --conf spark.pyspark.python=...)"
    )


def __getattr__(name: str) -> object:
    # Imported when asked for: Spark's Python workers import this package to read
    # a topic, and should not pay for the sinks' dependencies (fold stores, pyspark).
    if name == "FoldSink":
        from .fold_sink import FoldSink

        return FoldSink
    if name == "TopicBatchSink":
        from .sink import TopicBatchSink

        return TopicBatchSink
    raise AttributeError(name)


__all__ = [
    "FoldSink",
    "TopicBatchSink",
    "check_worker_python",
    "connect",
    "parse_data",
    "register",
    "with_parsed_data",
]
