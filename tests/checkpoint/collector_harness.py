"""Real processes for the shipper tests: the collector script and ``waymark ship``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from tests.conftest import readable

COLLECTOR = Path(__file__).with_name("collector.py")
WAYMARK = Path(sys.executable).parent / "waymark"


@dataclass
class CollectorProcess:
    url: str
    log: Path
    process: subprocess.Popen[str]

    def acked(self) -> list[list[int]]:
        """The seqs of every acked batch, in the order the collector acked them."""
        if not self.log.exists():
            return []
        return [orjson.loads(line)["seqs"] for line in self.log.read_bytes().splitlines()]

    def received(self) -> set[int]:
        return {seq for batch in self.acked() for seq in batch}


def start_collector(tmp: Path, *args: str) -> CollectorProcess:
    log = tmp / f"collector-{time.monotonic_ns()}.jsonl"
    process = subprocess.Popen(
        [sys.executable, str(COLLECTOR), "--log", str(log), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    ready = readable(process.stdout, 10)
    assert ready, "the collector printed nothing within 10 s"
    port = process.stdout.readline().split()[-1]
    return CollectorProcess(f"http://127.0.0.1:{port}/ingest", log, process)


def start_ship(
    server: str,
    topic: str,
    collector: CollectorProcess,
    state: Path,
    *args: str,
    launcher: tuple[str, ...] = (str(WAYMARK),),
) -> subprocess.Popen[str]:
    """``waymark ship`` with short retry delays, so transient faults cost milliseconds.

    ``launcher`` runs the CLI some other way, e.g. under a fault injector script.
    """
    command = [*launcher, "ship", "--url", server, "--topic", topic, "--to", collector.url,
               "--state", str(state), "--retry-base-ms", "5", "--retry-cap-ms", "50",
               *args]  # fmt: skip
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
    )


def committed(state: Path, topic: str) -> int:
    """The durably committed checkpoint (0 if none yet), read while the shipper may run.

    Not ``CheckpointStore.load()``: that deletes a leftover temp file, which would be
    a live shipper's save in progress.
    """
    try:
        raw = (state / "checkpoints.json").read_bytes()
    except FileNotFoundError:
        return 0
    entry = orjson.loads(raw.partition(b"\n")[2]).get(topic)
    return 0 if entry is None else int(entry["checkpoint"][1])  # [topic epoch, seq]


def status(state: Path) -> dict[str, Any]:
    return orjson.loads((state / "status.json").read_bytes())


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def append(server: str, topic: str, records: list[dict[str, Any]], **body: Any) -> list[int]:
    response = httpx.post(
        f"{server}/v0/topics/{topic}/records", json={"records": records, **body}, timeout=10
    )
    assert response.status_code == 200, response.text
    return response.json()["seqs"]


def read_all(server: str, topic: str) -> list[dict[str, Any]]:
    """Every record of ``topic`` (none if it does not exist)."""
    out: list[dict[str, Any]] = []
    cursor = 0
    while True:
        response = httpx.post(
            f"{server}/v0/topics/{topic}/diff", json={"from_seq": cursor, "limit": 10_000}
        )
        if response.status_code == 404:
            return out
        page = response.json()
        out += page["records"]
        if page["next_from_seq"] == cursor or page["caught_up"]:
            return out
        cursor = page["next_from_seq"]
