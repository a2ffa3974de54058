"""Shipper: records/s to a local collector with 1 vs 16 batches in flight, one run.

Run: .venv/bin/python bench/shipper.py [--records N] [--batch-records M] [--delay-ms D]

A real ``waymark serve`` process holds the topic and a real collector process
(tests/checkpoint/collector.py) answers every batch after a fixed delay, standing
for the network and the collector's own work: that wait is what in-flight
concurrency hides. Each row ships the same records with ``once`` to an empty state
directory; the N=1 row is the anchor.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from waymark.checkpoint.shipper import ShipConfig, Shipper

ROOT = Path(__file__).resolve().parent.parent
COLLECTOR = ROOT / "tests" / "checkpoint" / "collector.py"


def start(command: list[str], prefix: str) -> tuple[subprocess.Popen[str], str]:
    """Start a process that prints ``<prefix><address>`` once it listens."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith(prefix):
        process.kill()
        raise RuntimeError(f"{command[0]}: unexpected first line {line!r}")
    return process, line[len(prefix) :].split()[0]


def fill(server: str, topic: str, records: int) -> None:
    with httpx.Client(base_url=server, timeout=30) as http:
        for start in range(0, records, 10_000):
            end = min(records, start + 10_000)
            body = [{"data": {"i": i, "payload": "x" * 64}} for i in range(start, end)]
            response = http.post(
                f"/v0/topics/{topic}/records", json={"records": body, "create": True}
            )
            response.raise_for_status()


async def ship(server: str, collector: str, topic: str, in_flight: int, batch: int) -> float:
    with tempfile.TemporaryDirectory() as state:
        config = ShipConfig(server, topic, collector, Path(state), in_flight=in_flight,
                            batch_records=batch, once=True)  # fmt: skip
        shipper = Shipper(config)
        started = time.perf_counter()
        stats = await shipper.run()
        return stats.records_acked / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--batch-records", type=int, default=100)
    parser.add_argument("--delay-ms", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        waymark = Path(sys.executable).parent / "waymark"
        server, url = start([str(waymark), "serve", "--port", "0", "--data-dir", data],
                            "waymark listening on ")  # fmt: skip
        collector, port = start([sys.executable, str(COLLECTOR), "--delay-ms",
                                 str(args.delay_ms)], "collector listening on ")  # fmt: skip
        try:
            rates = {}
            for n in (1, 16):
                topic = f"bench-{n}"
                fill(url, topic, args.records)
                rates[n] = asyncio.run(
                    ship(url, f"http://127.0.0.1:{port}/", topic, n, args.batch_records)
                )
        finally:
            server.terminate()
            collector.terminate()
            server.wait()
            collector.wait()
    table = Table(
        title=f"shipper, {args.records:,} records, {args.batch_records} per batch, "
        f"collector latency {args.delay_ms:g} ms (2 shared cores)"
    )
    for column in ("in flight", "records/s", "batches/s", "vs N=1"):
        table.add_column(column, justify="right")
    for n, rate in rates.items():
        table.add_row(str(n), f"{rate:,.0f}", f"{rate / args.batch_records:,.0f}",
                      f"{rate / rates[1]:.1f}x")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
