"""Benchmark: KV fold catch-up and fold-store apply rates, against anchors from the same run.

1. Catch-up: ``watch_applied`` folding N keys from an empty store, per backend,
   beside a raw nats-py ordered-consumer read of the same stream run just before
   it (target >= 0.8x).
2. Apply: ``store.apply`` in batches of 1000 (+ cursor), per backend, beside the
   raw backend writing the same pre-encoded bytes with the same engine calls
   (target >= 0.7x).

Run: .venv/bin/python bench/kv_fold.py [--keys 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections import deque
from itertools import repeat
from pathlib import Path
from typing import NamedTuple

import lmdb
from nats.js import api
from rich.console import Console
from rich.table import Table
from rocksdict import WriteBatch

from waymark.kv import (
    BatchConfig,
    Connection,
    KvUpdate,
    NatsConnectionConfig,
    StoreConfig,
    WatchCursor,
    WatchScope,
    open_store,
    watch_applied,
)
from waymark.kv.server import EmbeddedNats
from waymark.kv.stores.append_log import _cursor_record, _put_record
from waymark.kv.stores.protocol import CURSOR_KEY, encode_record

BATCH = 1000
BACKENDS = ("append-log", "lmdb", "rocksdb")


class Rate(NamedTuple):
    """Entries per second of wall time, and per second of this process's CPU time."""

    wall: float
    cpu: float


class Timer:
    def __init__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self, entries: int) -> Rate:
        return Rate(
            entries / (time.perf_counter() - self._wall),
            entries / (time.process_time() - self._cpu),
        )


def spec(backend: str, root: Path) -> str:
    return f"{backend}:{root / backend / ('fold.log' if backend == 'append-log' else 'db')}"


async def load(kv, n: int) -> None:
    value = b"v" * 32
    for i in range(n):
        await kv.js.publish_async(f"{kv.subject_prefix}key.{i:08}", value)
    await kv.js.publish_async_completed()


async def raw_ordered_read(kv, n: int) -> Rate:
    """The anchor: nats-py's own ordered consumer, doing nothing but count."""
    done = asyncio.Event()
    seen = 0

    async def cb(msg) -> None:
        nonlocal seen
        seen += 1
        if seen >= n:
            done.set()

    t = Timer()
    sub = await kv.js.subscribe(
        f"{kv.subject_prefix}>",
        stream=kv.stream,
        cb=cb,
        ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.ALL,
    )
    await done.wait()
    rate = t.stop(n)
    await sub.unsubscribe()
    return rate


async def fold_catch_up(kv, store_spec: str, last: int) -> Rate:
    store = open_store(store_spec)
    done = asyncio.Event()

    def on_applied(cursor: WatchCursor) -> None:
        if cursor.as_u64() >= last:
            done.set()

    t = Timer()
    await watch_applied(
        kv.watcher(),
        WatchScope.all(),
        store=store,
        config=BatchConfig(window=0.05, max=BATCH * 4, channel_capacity=BATCH),
        on_applied=on_applied,
        shutdown=done,
    )
    rate = t.stop(last)
    store.close()
    return rate


def apply_rate(store_spec: str, updates: list[KvUpdate]) -> Rate:
    store = open_store(store_spec)
    t = Timer()
    for i in range(0, len(updates), BATCH):
        store.apply(updates[i : i + BATCH], WatchCursor.from_u64(i + BATCH))
    rate = t.stop(len(updates))
    store.close()
    return rate


def raw_rate(backend: str, root: Path, updates: list[KvUpdate]) -> Rate:
    """The same writes straight into the engine: pre-encoded bytes, one transaction per batch.

    Each anchor makes the same engine calls as its store (a file append plus a
    dict fold; ``putmulti``; ``WriteBatch.put`` driven by ``map``), so the
    ratio is what the store adds: encoding each update (and the CRCs).
    """
    keys = [u.key.encode() for u in updates]
    if backend == "append-log":
        records = [
            _put_record(k, u.value, u.version.raw) for k, u in zip(keys, updates, strict=True)
        ]
        str_keys = [u.key for u in updates]
        fold: dict[str, KvUpdate] = {}
        with open(root / "raw.log", "ab") as f:
            t = Timer()
            for i in range(0, len(records), BATCH):
                f.write(b"".join(records[i : i + BATCH]) + _cursor_record(b"\0" * 8))
                f.flush()
                fold.update(zip(str_keys[i : i + BATCH], updates[i : i + BATCH], strict=True))
            return t.stop(len(updates))
    values = [encode_record(u.value, u.version) for u in updates]
    if backend == "lmdb":
        env = lmdb.open(
            str(root / "raw-lmdb"), map_size=1 << 30, max_dbs=2, sync=False, metasync=False
        )
        data, meta = env.open_db(b"data"), env.open_db(b"meta")
        t = Timer()
        for i in range(0, len(keys), BATCH):
            with env.begin(write=True) as txn:
                txn.cursor(db=data).putmulti(
                    zip(keys[i : i + BATCH], values[i : i + BATCH], strict=True)
                )
                txn.put(CURSOR_KEY, b"\0" * 8, db=meta)
        rate = t.stop(len(keys))
        env.close()
        return rate
    from waymark.kv.stores.rocksdb_store import RocksDbStore

    store = RocksDbStore(root / "raw-rocks")  # the same tuned engine, bypassing the codec
    db, data, meta, opts = store._db, store._data_cf, store._meta_cf, store._write_opts
    t = Timer()
    for i in range(0, len(keys), BATCH):
        wb = WriteBatch(raw_mode=True)
        deque(map(wb.put, keys[i : i + BATCH], values[i : i + BATCH], repeat(data)), maxlen=0)
        wb.put(CURSOR_KEY, b"\0" * 8, meta)
        db.write(wb, opts)
    rate = t.stop(len(keys))
    store.close()
    return rate


async def main(n: int) -> None:
    console = Console()
    root = Path(tempfile.mkdtemp(prefix="waymark-bench-"))
    try:
        with EmbeddedNats(root / "nats") as server:
            async with Connection(NatsConnectionConfig(url=server.url, timeout=30)) as conn:
                kv = await conn.store("bench", StoreConfig(max_bytes=None))
                console.print(f"loading {n:,} keys …")
                await load(kv, n)
                _, last = await kv.stream_bounds()
                # Each catch-up beside its own anchor run, just before it: one
                # anchor for all three compared the later rows with a different
                # moment of a shared, drifting machine. The first read after
                # the load ran faster than later ones in 4 of 5 runs, so it is
                # a warm-up, not a measurement.
                await raw_ordered_read(kv, n)
                catch_up = {}
                for b in BACKENDS:
                    anchor = await raw_ordered_read(kv, n)
                    catch_up[b] = (await fold_catch_up(kv, spec(b, root / "catch"), last), anchor)
        updates = [KvUpdate.put(f"key.{i:08}", b"v" * 32, i + 1) for i in range(n)]
        applies = {}
        for b in BACKENDS:
            (root / "raw" / b).mkdir(parents=True)
            applies[b] = (
                apply_rate(spec(b, root / "apply"), updates),
                raw_rate(b, root / "raw" / b, updates),
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)

    t = Table(title=f"waymark.kv fold, {n:,} keys, {os.cpu_count()} cores (one run)")
    t.add_column("measure")
    t.add_column("backend")
    t.add_column("entries/s", justify="right")
    t.add_column("anchor/s", justify="right")
    t.add_column("ratio", justify="right")
    t.add_column("cpu ratio", justify="right")
    t.add_column("target", justify="right")
    rows = [("catch-up (watch_applied)", b, *catch_up[b], "≥0.80x") for b in BACKENDS]
    rows += [("store.apply, batch 1000", b, *applies[b], "≥0.70x") for b in BACKENDS]
    for measure, b, ours, anchor, target in rows:
        t.add_row(
            measure,
            b,
            f"{ours.wall:,.0f}",
            f"{anchor.wall:,.0f}",
            f"{ours.wall / anchor.wall:.2f}x",
            f"{ours.cpu / anchor.cpu:.2f}x",
            target,
        )
    console.print(t)
    console.print(
        "catch-up anchor: nats-py ordered consumer counting messages of the same stream,"
        " run just before each catch-up"
    )
    console.print(
        "apply anchor: the same engine calls writing pre-encoded bytes, one transaction per batch"
    )
    console.print(
        "cpu ratio: the same comparison per second of this process's CPU time (nats-server's"
        " excluded), steadier than wall time on a shared machine"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=200_000)
    asyncio.run(main(parser.parse_args().keys))
