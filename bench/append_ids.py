"""CPU per record of appends with record ids (and a pipeline edge's three meta keys),
by records per append: does a bigger append cost more per record?

Run: ``.venv/bin/python bench/append_ids.py [--records 50000] [--sizes 500,2000,5000]``.
Not a test: it prints figures. Two ways, each a fresh topic per (shape, size):

- ``engine``: :meth:`Engine.append` in this process, no journal, timed on the
  process's CPU clock (the engine's own work, isolated from HTTP and the disk).
- ``server``: a real ``waymark serve`` process (default durability, on a temporary
  data dir) appended to over HTTP by the shipped client; the figure is the server
  process's CPU (utime + stime from /proc) over the appends, so the client's own
  encoding is not counted.

Shapes: ``id+meta`` (an id and three meta keys, as a pipeline edge writes), ``id``,
``none``, and ``hex`` (an id, and data whose event id is 32 hex digits: most hold a
digit before an ``e``, which the quick check of a write for infinite numbers must not
take for an exponent). Each figure is the best of ``--repeat`` runs (docs/pipeline.md,
figures); ``--shapes`` picks some.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
from rich.console import Console
from rich.table import Table

from waymark.client import Client
from waymark.log.config import TopicConfig
from waymark.log.engine import Engine, EngineConfig
from waymark.protocol import ConfigPatch, RecordIn

WINDOW_MS = 7 * 24 * 3_600_000  # as a pipeline edge's topics have it
SHAPES = ("id+meta", "id", "none", "hex")
_MIX = 0x9E3779B97F4A7C15F39CC0605CEDC835  # spreads n over 128 bits: a hex id per record
console = Console()


def batches(shape: str, records: int, size: int, run: str) -> list[list[RecordIn]]:
    out = []
    for lo in range(0, records, size):
        batch = []
        for n in range(lo, min(records, lo + size)):
            event = b'"%032x"' % (n * _MIX % (1 << 128)) if shape == "hex" else b"%d" % n
            data = msgspec.Raw(b'{"event_id":%b,"user":"u-1842","n":7}' % event)
            ident = f"{run}/produce:{n}" if shape != "none" else None
            meta = (
                {"wm.gen": "1", "wm.event": f"{run}/{n}", "wm.t0": str(1_790_000_000_000 + n)}
                if shape == "id+meta"
                else None
            )
            batch.append(RecordIn(data, id=ident, meta=meta))
        out.append(batch)
    return out


def engine_cpu(shape: str, records: int, size: int) -> float:
    engine = Engine(EngineConfig(defaults=TopicConfig(idempotency_window_ms=WINDOW_MS)))
    work = batches(shape, records, size, uuid.uuid4().hex[:8])
    began = time.process_time()
    for batch in work:
        engine.append("bench", batch)
    return time.process_time() - began


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        exe = str(Path(sys.executable).parent / "waymark")
        self.process = subprocess.Popen(
            [exe, "serve", "--port", "0", "--data-dir", self.dir.name],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().split()[3]
        self.client = Client(self.url)

    def cpu(self, shape: str, records: int, size: int) -> float:
        topic = f"b.{uuid.uuid4().hex[:8]}"
        self.client.put_topic(topic, ConfigPatch(idempotency_window_ms=WINDOW_MS))
        work = batches(shape, records, size, uuid.uuid4().hex[:8])
        began = proc_cpu(self.process.pid)
        for batch in work:
            self.client.append(topic, batch)
        return proc_cpu(self.process.pid) - began

    def close(self) -> None:
        self.client.close()
        self.process.kill()
        self.process.wait()
        self.dir.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--sizes", default="500,2000,5000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=("engine", "server"), default=None)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = args.shapes.split(",")
    assert set(shapes) <= set(SHAPES), f"shapes are {', '.join(SHAPES)}"
    console.print(f"load average at start: {os.getloadavg()[0]:.1f}")
    server = Server() if args.only != "engine" else None
    ways: dict[str, Callable[[str, int, int], float]] = {}
    if args.only != "server":
        ways["engine"] = engine_cpu
    if server is not None:
        ways["server"] = server.cpu
    try:
        for way, measure in ways.items():
            table = Table(title=f"{way}: CPU s per {args.records:,} records (best of "
                          f"{args.repeat}); µs per record")  # fmt: skip
            table.add_column("records per append", justify="right")
            for shape in shapes:
                table.add_column(shape, justify="right")
            for size in sizes:
                row = [f"{size:,}"]
                for shape in shapes:
                    best = min(measure(shape, args.records, size) for _ in range(args.repeat))
                    row.append(f"{best:.3f} s ({best / args.records * 1e6:.1f})")
                table.add_row(*row)
            console.print(table)
    finally:
        if server is not None:
            server.close()
    console.print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
