"""Spark fixtures: one local Spark session and one real waymark server per test session.

A micro-batch costs ~150 ms here, so tests share the session, use small data and
``availableNow`` triggers, and keep apart by using their own topics.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

VENV_BIN = Path(sys.executable).parent


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def start_server(data_dir: Path) -> Server:
    """``waymark serve`` on a free 127.0.0.1 port; waits for its listening line."""
    process = subprocess.Popen(
        [str(VENV_BIN / "waymark"), "serve", "--host", "127.0.0.1", "--port", "0",
         "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 1)
        if ready:
            line = process.stdout.readline()
            if not line:
                break
            if match := re.search(r"listening on (http://\S+)", line):
                return Server(match.group(1), process)
    process.kill()
    raise RuntimeError("waymark serve did not report its listening address")


def spark_session(app_name: str) -> Any:
    """A local[2] session whose tasks get one retry (local[N,F]: F attempts per task)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers import waymark from this venv
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2,2]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    import waymark.spark

    waymark.spark.register(spark)
    return spark


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("waymark-spark-data"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = spark_session("waymark-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    return re.sub(r"[^A-Za-z0-9._:-]", ".", request.node.name[:50]) + "-" + uuid.uuid4().hex[:8]
