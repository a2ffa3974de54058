"""Queue claim + ack throughput: waymark (docs/semantics/topics.md §10) beside Redis Streams
consumer groups.

16 workers (2 processes x 8 asyncio tasks, so neither system is measured through
one saturated client) loop ``claim max=B`` then ``ack`` those seqs, against:

* waymark: ``waymark serve --data-dir <tmp>``, a ``type: queue`` topic of class
  ``disk`` (the default), leases log in class ``memory`` (the default);
* Redis: ``redis-server`` (no persistence, its default for a bare start),
  ``XREADGROUP GROUP g <worker> COUNT B STREAMS jobs >`` then ``XACK``, via redis-py.

Both are started by the benchmark on free ports with temporary directories.
Run: ``.venv/bin/python bench/queue_claims.py [--jobs 40000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis
import redis.asyncio as aredis
from rich.console import Console
from rich.table import Table

PROCESSES, TASKS = 2, 8  # 16 workers
QUEUE = "jobs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# --- waymark ------------------------------------------------------------------------


def start_waymark(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    exe = str(Path(sys.executable).parent / "waymark")
    process = subprocess.Popen(
        [exe, "serve", "--port", "0", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    url = line.split("waymark listening on ")[1].split()[0]
    return process, url


def fill_waymark(url: str, jobs: int) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        client.delete(f"/v0/topics/{QUEUE}")
        client.put(f"/v0/topics/{QUEUE}", json={"type": "queue"}).raise_for_status()
        for start in range(0, jobs, 5000):
            records = [{"data": {"job": i}} for i in range(start, min(jobs, start + 5000))]
            client.post(f"/v0/topics/{QUEUE}/records", json={"records": records})


class RawHttp:
    """A minimal keep-alive HTTP/1.1 client: one write per request, Content-Length
    responses only. httpx spends ~1 ms of client CPU per request here, so with it
    the batch-1 row measured the load generator (the server sat ~80% idle), while
    redis-py's side costs a fraction of that; this keeps the clients comparable."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: Any) -> Any:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        payload = orjson.dumps(body)
        head = b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n" % (
            path.encode(), self.host.encode())  # fmt: skip
        self.writer.write(b"%scontent-length: %d\r\n\r\n%s" % (head, len(payload), payload))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
        answer = await self.reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"{path}: {status} {answer[:200]!r}")
        return orjson.loads(answer)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


async def waymark_worker(url: str, name: str, batch: int) -> int:
    done = 0
    host, port = url.removeprefix("http://").split(":")
    client = RawHttp(host, int(port))
    try:
        while True:
            jobs = (await client.post(f"/v0/topics/{QUEUE}/claim",
                                      {"node": name, "max": batch}))["jobs"]  # fmt: skip
            if not jobs:
                return done
            seqs = [job["$seq"] for job in jobs]
            await client.post(f"/v0/topics/{QUEUE}/ack", {"node": name, "seqs": seqs})
            done += len(seqs)
    finally:
        await client.close()


# --- redis --------------------------------------------------------------------------


def start_redis(directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--dir", str(directory), "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return process, port
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def fill_redis(port: int, jobs: int) -> None:
    client = redis.Redis(port=port)
    client.delete(QUEUE)
    client.xgroup_create(QUEUE, "g", id="0", mkstream=True)
    for start in range(0, jobs, 5000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(jobs, start + 5000)):
            pipe.xadd(QUEUE, {"data": f'{{"job":{i}}}'})
        pipe.execute()


async def redis_worker(port: int, name: str, batch: int) -> int:
    done = 0
    client = aredis.Redis(port=port)
    try:
        while True:
            answer = await client.xreadgroup("g", name, {QUEUE: ">"}, count=batch)
            if not answer or not answer[0][1]:
                return done
            ids = [entry_id for entry_id, _ in answer[0][1]]
            await client.xack(QUEUE, "g", *ids)
            done += len(ids)
    finally:
        await client.aclose()


# --- the run --------------------------------------------------------------------------


def _process(system: str, target: str, first: int, batch: int) -> int:
    async def run() -> int:
        if system == "waymark":
            tasks = [waymark_worker(target, f"w{first + i}", batch) for i in range(TASKS)]
        else:
            tasks = [redis_worker(int(target), f"w{first + i}", batch) for i in range(TASKS)]
        return sum(await asyncio.gather(*tasks))

    return asyncio.run(run())


def measure(system: str, target: str, batch: int) -> tuple[float, int]:
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        started = time.perf_counter()
        done = pool.starmap(_process, [(system, target, p * TASKS, batch)
                                       for p in range(PROCESSES)])  # fmt: skip
        elapsed = time.perf_counter() - started
    return sum(done) / elapsed, sum(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40_000, help="jobs per batch-size row")
    args = parser.parse_args()
    console = Console()
    if not shutil.which("redis-server"):
        console.print("[red]redis-server not found: apt-get install -y redis-server[/red]")
        return
    table = Table(title=f"claim + ack, {PROCESSES * TASKS} workers, {args.jobs:,} jobs per row")
    for column in ("batch (max / COUNT)", "waymark jobs/s", "Redis Streams jobs/s",
                   "waymark ÷ Redis", "load"):  # fmt: skip
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        waymark, url = start_waymark(Path(tmp) / "waymark")
        (Path(tmp) / "redis").mkdir()
        server, port = start_redis(Path(tmp) / "redis")
        try:
            for batch in (1, 10, 100):
                jobs = args.jobs // 4 if batch == 1 else args.jobs
                fill_waymark(url, jobs)
                ours, got = measure("waymark", url, batch)
                assert got == jobs, f"waymark workers finished {got} of {jobs} jobs"
                fill_redis(port, jobs)
                theirs, got = measure("redis", str(port), batch)
                assert got == jobs, f"redis workers finished {got} of {jobs} jobs"
                table.add_row(str(batch), f"{ours:,.0f}", f"{theirs:,.0f}",
                              f"{ours / theirs:.2f}x", load_average())  # fmt: skip
        finally:
            waymark.terminate()
            server.terminate()
            waymark.wait()
            server.wait()
    console.print(table)


if __name__ == "__main__":
    main()
