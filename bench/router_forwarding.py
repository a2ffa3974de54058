"""Router forwarding throughput (docs/semantics/topics.md §8): one source fanned out to 0, 1 and
8 dests.

For each fan-out a fresh ``waymark serve --data-dir <tmp>`` (class ``disk``, the
default; checkpoints off during the run so the WAL directory holds every frame
written) takes appends of 100 records per request from ``wrk -t1 -c16`` for a fixed
time. Measured:

* appends/s: records acknowledged per second while routers forward alongside;
* delivered/s: source records per second until every router's cursor reached the
  source head (from the first append to the last copy), i.e. in all of its dests;
* copies/s: records appended to dests per second over the same span;
* WAL MB: the bytes of WAL frames written (one write per source append whatever the
  fan-out: derived copies are not journaled, docs/semantics/topics.md §8.1).

The anchor is the plain append run (no router) on the same server build, measured in
the same run; ratios are against its appends/s.
Run: ``.venv/bin/python bench/router_forwarding.py [--seconds 5]`` (needs ``wrk``:
``apt-get install wrk``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from durable import wrk  # bench/durable.py: one wrk thread POSTing a fixed body

CONNECTIONS, BATCH = 16, 100


def start_waymark(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    exe = str(Path(sys.executable).parent / "waymark")
    process = subprocess.Popen(
        [exe, "serve", "--port", "0", "--data-dir", str(data_dir),
         "--seal-interval-s", "3600"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    return process, line.split("waymark listening on ")[1].split()[0]


def wal_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "wal").rglob("*") if p.is_file())


def run(fanout: int, seconds: int) -> dict[str, float]:
    body = orjson.dumps({"records": [{"data": {"n": i, "pad": "x" * 40}} for i in range(BATCH)]})
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        process, url = start_waymark(data_dir)
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                client.put("/v0/topics/src", json={}).raise_for_status()
                for i in range(fanout):
                    route = {"source": "src", "dest": f"d{i}"}
                    client.put(f"/v0/routers/r{i}", json=route).raise_for_status()
                start = time.perf_counter()
                load = wrk(f"{url}/v0/topics/src/records", body, seconds, CONNECTIONS)
                head = client.get("/v0/topics/src").json()["head_seq"]
                while fanout and any(
                    r["cursor"] < head for r in client.get("/v0/routers").json()["routers"]
                ):
                    time.sleep(0.01)
                delivered = time.perf_counter() - start
                for i in range(fanout):
                    assert client.get(f"/v0/topics/d{i}").json()["count"] == head
            return {
                "appends": load["rps"] * BATCH,
                "delivered": head / delivered,
                "copies": fanout * head / delivered,
                "wal_mb": wal_bytes(data_dir) / 1e6,
                "records": head,
            }
        finally:
            process.terminate()
            process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=5, help="wrk's time per fan-out")
    args = parser.parse_args()
    console = Console(width=150)
    console.print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    results = {}
    for fanout in (0, 1, 8):
        with console.status(f"fan-out {fanout}: {args.seconds} s of appends, then catch-up"):
            results[fanout] = run(fanout, args.seconds)
    anchor = results[0]["appends"]
    table = Table(title="Router forwarding, disk class, 100 records per request")
    for column in ("routers", "source records", "appends/s", "vs plain", "delivered/s",
                   "vs plain", "copies/s", "WAL MB", "WAL B/record"):  # fmt: skip
        table.add_column(column, justify="right")
    for fanout, r in results.items():
        table.add_row(
            str(fanout) if fanout else "0 (anchor)", f"{r['records']:,.0f}",
            f"{r['appends']:,.0f}", f"{r['appends'] / anchor:.2f}x",
            f"{r['delivered']:,.0f}", f"{r['delivered'] / anchor:.2f}x",
            f"{r['copies']:,.0f}", f"{r['wal_mb']:.1f}", f"{r['wal_mb'] * 1e6 / r['records']:.1f}",
        )  # fmt: skip
    console.print(table)
    console.print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
