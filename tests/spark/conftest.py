"""Spark fixtures: one local Spark session and one real waymark server per test session.

A micro-batch costs ~150 ms here, so tests share the session, use small data and
``availableNow`` triggers, and keep apart by using their own topics.
"""

from __future__ import annotations

import os
import re
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
from tests.conftest import START_S, readable

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
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        ready = readable(process.stdout, 1)
        if ready:
            line = process.stdout.readline()
            if not line:
                break
            if match := re.search(r"listening on (http://\S+)", line):
                return Server(match.group(1), process)
    process.kill()
    raise RuntimeError("waymark serve did not report its listening address")


def external_stage_spec(
    path: Path, name: str, handoff: str, edge: str, candidates: list[str], events: int
) -> Path:
    """A pipeline spec at ``path``: a ``produce`` stage (the demo's, ``events`` in
    batches of 100) writing the relocatable ``edge`` on ``candidates``, read by the
    external stage ``enrich`` (a Spark query; docs/spark.md, "A Spark stage of a
    pipeline")."""
    path.write_text(f"""
[pipeline]
name = "{name}"
handoff = "{handoff}"

[[edge]]
name = "{edge}"
candidates = [{", ".join(f'"{url}"' for url in candidates)}]

[[stage]]
name = "produce"
function = "waymark.pipeline.demo:produce"
events = {events}
batch = 100
output = "{edge}"

[[stage]]
name = "enrich"
input = "{edge}"
external = true
""")
    return path


def spark_session(app_name: str) -> Any:
    """A local[2] session whose tasks get one retry (local[N,F]: F attempts per task)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers import waymark from this venv
    from pyspark.sql import SparkSession

    from waymark.spark.demo_job import JVM_OPTIONS

    spark = (
        SparkSession.builder.master("local[2,2]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
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


class Topics:
    """Raw topic calls the Spark tests need around their queries."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def write(self, topic: str, values: list[Any], **fields: Any) -> None:
        for i in range(0, len(values), 5000):
            records = [{"data": v, **fields} for v in values[i : i + 5000]]
            response = self.http.post(f"/v0/topics/{topic}/records", json={"records": records})
            assert response.status_code == 200, response.text

    def read(self, topic: str) -> list[dict[str, Any]]:
        """Every retained record of ``topic`` (empty if it does not exist)."""
        out: list[dict[str, Any]] = []
        cursor = 0
        while True:
            response = self.http.post(
                f"/v0/topics/{topic}/diff", json={"from_seq": cursor, "limit": 10000}
            )
            if response.status_code == 404:
                return out
            page = response.json()
            out += page["records"]
            if page["caught_up"]:
                return out
            cursor = page["next_from_seq"]


@pytest.fixture(scope="session")
def topics(http: httpx.Client) -> Topics:
    return Topics(http)


def run_to_end(writer: Any, timeout: float = 180) -> Any:
    """Start an availableNow query and wait for it to drain and stop."""
    query = writer.trigger(availableNow=True).start()
    assert query.awaitTermination(timeout), "the availableNow query did not stop"
    return query


@pytest.fixture(scope="session")
def run() -> Any:
    return run_to_end


def run_together(*writers: Any, timeout: float = 180) -> list[Any]:
    """Start several availableNow queries at once and wait for all of them: queries that
    pay the same fixed costs overlap them. Returns each query, or the exception a
    failed one stopped with."""
    from pyspark.errors import StreamingQueryException

    queries = [w.trigger(availableNow=True).start() for w in writers]
    outcomes: list[Any] = []
    for query in queries:
        try:
            assert query.awaitTermination(timeout), "an availableNow query did not stop"
            outcomes.append(query)
        except StreamingQueryException as failed:
            outcomes.append(failed)
    return outcomes


@pytest.fixture(scope="session")
def run_all() -> Any:
    return run_together
