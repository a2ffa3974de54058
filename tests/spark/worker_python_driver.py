"""A Spark driver the worker-Python test runs as its own process.

``python worker_python_driver.py NO_WAYMARK_PYTHON`` creates a local session three
times, each with another worker Python, calls ``waymark.spark.register`` and
prints one JSON line per case: ``{"case": ..., "error": message or null}``.

1. ``PYSPARK_PYTHON`` names a Python that cannot import waymark;
2. ``PYSPARK_PYTHON`` is unset and ``python3`` on PATH cannot import waymark;
3. ``PYSPARK_PYTHON`` is this (the venv's) Python.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import waymark.spark
from waymark.spark.demo_job import JVM_OPTIONS

no_waymark = sys.argv[1]
cases = {
    "PYSPARK_PYTHON without waymark": {"PYSPARK_PYTHON": no_waymark},
    "default python3 without waymark": {
        "PYSPARK_PYTHON": None,
        "PATH": f"{Path(no_waymark).parent}{os.pathsep}{os.environ['PATH']}",
    },
    "PYSPARK_PYTHON is the venv's": {"PYSPARK_PYTHON": sys.executable},
}
for case, env in cases.items():
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    # The worker Python is fixed when the SparkContext is created.
    # JVM_OPTIONS (C1 only, serial GC): the demo's, for a short job on few cores.
    builder = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
               .config("spark.driver.extraJavaOptions", JVM_OPTIONS))  # fmt: skip
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        waymark.spark.register(spark)
        error = None
    except RuntimeError as e:
        error = str(e)
    print(json.dumps({"case": case, "python": spark.sparkContext.pythonExec, "error": error}))
    spark.stop()
