"""Receipt recovery: receipt throughput, and the recovery query over one day.

Run: .venv/bin/python bench/receipt_recovery.py [--keys N] [--checkpoints N]
     [--seconds N] [--records-per-s N] [--record-bytes N]

1. Receipts/s with ``--keys`` (10 000) keys per checkpoint, through RecoveryService
   into a LocalReceiptStore on disk (SQLite, WAL, synchronous=FULL): every key of
   ``--checkpoints`` checkpoints receipted, timed up to the last future resolving.
   Anchors, same run, same file settings: the same number of plain row writes to
   SQLite, batched one transaction per checkpoint (the backend's best case), and one
   durable transaction per row (what persisting each receipt would cost; measured on
   2 000 rows).
2. The recovery query over ``--seconds`` (86 400) of 1 s change checkpoints, each
   second ``--records-per-s`` records of ``--record-bytes``, served by a real HTTP
   server (an in-process engine on a manual clock, so a day is written in seconds):
   the query's time and the bytes it reads, against reading the same range of the
   topic itself with the shipped client (diff pages of 10 000). The server runs on a
   thread of this process, so both sides of both reads share one GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from waymark.client import Client
from waymark.clock import ManualClock
from waymark.log import Engine, RecordIn
from waymark.log.config import ChangesConfig
from waymark.protocol import Checkpoint, KeyChange
from waymark.recovery import (
    CheckpointListener,
    LocalReceiptStore,
    RecoveryService,
    ServerView,
    TopicCheckpoints,
)
from waymark.server import App, ServerConfig
from waymark.server.serving import Server, listen


class Prepared:
    """A checkpoint source of prepared checkpoints, handed to the listener on demand."""

    topics = None

    def __init__(self) -> None:
        self.listener: CheckpointListener | None = None

    def newest_id(self) -> int:
        return 0

    def view(self) -> ServerView:
        return ServerView()

    def committed(self, key: str, version: int, epoch: int) -> str | None:
        return None

    def request_checkpoints(self, earliest_ms: int) -> Iterator[Checkpoint]:
        return iter(())

    def register_checkpoint_listener(
        self, listener: CheckpointListener, after: int, on_error: object = None
    ) -> None:
        self.listener = listener

    def close(self) -> None:
        pass


def bench_receipts(keys: int, checkpoints: int, workdir: Path) -> float:
    source = Prepared()
    store = LocalReceiptStore(workdir / "receipts.db")
    service = RecoveryService(source, store, "bench", compress_interval_s=3_600)
    service.subscribe(lambda committed: None)
    assert source.listener is not None
    elapsed = 0.0
    for c in range(1, checkpoints + 1):
        names = [f"orders/o{c}-{k}" for k in range(keys)]
        source.listener(Checkpoint(c, c * 1000, [KeyChange(n, c, c, 1) for n in names]))
        start = time.perf_counter()
        futures = [service.submit_receipt(name, c, 1) for name in names]
        futures[-1].result(timeout=60)
        elapsed += time.perf_counter() - start
        assert all(f.done() and f.exception() is None for f in futures)
    assert store.low_watermark("bench") == checkpoints
    store.close()
    return keys * checkpoints / elapsed


def _sqlite(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE r (client TEXT, key TEXT, version INTEGER, PRIMARY KEY (client, key))")
    return db


def bench_sqlite_batched(keys: int, checkpoints: int, workdir: Path) -> float:
    db = _sqlite(workdir / "batched.db")
    start = time.perf_counter()
    for c in range(checkpoints):
        db.execute("BEGIN")
        db.executemany("INSERT OR REPLACE INTO r VALUES ('bench', ?, ?)",
                       ((f"orders/o{c}-{k}", c) for k in range(keys)))  # fmt: skip
        db.execute("COMMIT")
    rate = keys * checkpoints / (time.perf_counter() - start)
    db.close()
    return rate


def bench_sqlite_each(rows: int, workdir: Path) -> float:
    db = _sqlite(workdir / "each.db")
    start = time.perf_counter()
    for k in range(rows):
        db.execute("INSERT OR REPLACE INTO r VALUES ('bench', ?, 1)", (f"orders/o{k}",))
    rate = rows / (time.perf_counter() - start)
    db.close()
    return rate


def build_day(seconds: int, per_s: int, record_bytes: int, console: Console) -> Engine:
    clock = ManualClock()
    engine = Engine(clock=clock)
    engine.track_changes((seconds + 3_600) * 1000)
    rng = random.Random(7)
    filler = "x" * max(record_bytes - 60, 0)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("writing a day of orders and checkpoints", total=seconds)
        for s in range(seconds):
            records = [
                RecordIn.of({"order": rng.randrange(100_000), "s": s, "items": filler},
                            tag=f"o{rng.randrange(100_000)}")
                for _ in range(per_s)
            ]  # fmt: skip
            engine.append("orders", records)
            clock.advance(1_000)
            engine.emit_checkpoint()
            if s % 1000 == 0:
                progress.update(task, completed=s)
    return engine


class ThreadServer(Server):
    """The real server, run on a thread: the main thread keeps the signals."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class Serving:
    """The engine served over HTTP by the real server, on a thread."""

    def __init__(self, engine: Engine, window_s: float) -> None:
        self.sock = listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = ThreadServer(
            App(ServerConfig(changes=ChangesConfig(recovery_window_s=window_s)), engine=engine)
        )
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{self.url}/v0/health").status_code == 200:
                    return
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def counting_client(url: str) -> tuple[Client, list[int]]:
    read = [0]

    def count(response: httpx.Response) -> None:
        response.read()
        read[0] += len(response.content)

    http = httpx.Client(base_url=url, timeout=120, event_hooks={"response": [count]})
    return Client(url, http=http), read


def bench_query(url: str, clock_ms: int, seconds: int, workdir: Path) -> tuple[float, int, int]:
    client, read = counting_client(url)
    store = LocalReceiptStore(workdir / "query.db")
    store.store_low_watermark("bench", 0)  # receipts exist, none of this day's: all missed
    service = RecoveryService(TopicCheckpoints(url, client=client), store, "bench",
                              recent_s=0, max_window_s=seconds + 3_600,
                              clock=ManualClock(clock_ms))  # fmt: skip
    start = time.perf_counter()
    missed = service.missed()
    elapsed = time.perf_counter() - start
    store.close()
    return elapsed, read[0], len(missed)


def bench_topic_read(url: str) -> tuple[float, int, int]:
    client, read = counting_client(url)
    start = time.perf_counter()
    cursor, records = 0, 0
    while True:
        page = client.diff_raw("orders", cursor, limit=10_000)
        records += len(page.records)
        cursor = page.next_from_seq
        if page.caught_up:
            break
    return time.perf_counter() - start, read[0], records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=86_400)
    parser.add_argument("--records-per-s", type=int, default=2)
    parser.add_argument("--record-bytes", type=int, default=1_000)
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="waymark-bench-", dir=".") as tmp:
        workdir = Path(tmp)
        receipts = bench_receipts(args.keys, args.checkpoints, workdir)
        batched = bench_sqlite_batched(args.keys, args.checkpoints, workdir)
        each = bench_sqlite_each(2_000, workdir)
        engine = build_day(args.seconds, args.records_per_s, args.record_bytes, console)
        serving = Serving(engine, args.seconds + 3_600)
        try:
            q_time, q_bytes, q_keys = bench_query(serving.url, engine.clock.now_ms(),
                                                  args.seconds, workdir)  # fmt: skip
            t_time, t_bytes, t_records = bench_topic_read(serving.url)
        finally:
            serving.stop()
    load = os.getloadavg()
    table = Table(title=f"receipt recovery (load average {load[0]:.2f} {load[1]:.2f})")
    for column in ("measure", "value", "anchor", "anchor value", "ratio"):
        table.add_column(column)
    table.add_row(f"receipts/s, {args.keys} keys per checkpoint", f"{receipts:,.0f}",
                  "SQLite rows/s, one txn per checkpoint", f"{batched:,.0f}",
                  f"{receipts / batched:.2f}x (goal >= 0.5x)")  # fmt: skip
    table.add_row("", "", "SQLite rows/s, one txn per row", f"{each:,.0f}",
                  f"{receipts / each:.1f}x")  # fmt: skip
    table.add_row(f"recovery query, {args.seconds} checkpoints: time", f"{q_time:.2f} s",
                  f"read the topic ({t_records:,} records)", f"{t_time:.2f} s",
                  f"{q_time / t_time:.1f}x its time")  # fmt: skip
    table.add_row(f"  bytes read ({q_keys:,} keys missed)", f"{q_bytes / 1e6:.1f} MB",
                  "bytes of the topic read", f"{t_bytes / 1e6:.1f} MB",
                  f"{t_bytes / q_bytes:.1f}x fewer (goal >= 20x)")  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    main()
