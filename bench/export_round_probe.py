"""Probe: where an export round's time goes, step by step, per backend, and which step
limits it. No NATS: the store is filled by ``apply`` directly (1M keys of 32 B).

For each backend, ``--rounds`` times after the fill (the first one flushes what the
store holds in memory; later ones are the steady state of a periodic exporter, each
after ``--between`` new keys were applied):

* the steps one after the other, each timed on the wall clock and the CPU:
  ``stage_export`` (the copy, in the fold's pause; for the append log a hard link
  to the live log, as a round makes it), ``describe`` (BLAKE3 of every file; of
  RocksDB's new SST files only, in a later round), ``StagedExport.verify`` (the
  reopen; RocksDB's also hashes again the SST files describe did not),
  ``upload_files`` (the tar stream, multipart put) and ``swap_pointer``;
* the round as ``publish_staged`` runs it (the verify on a second thread while
  describe and upload run, RocksDB's from the moment the store took the payload's
  last byte; the swap waits for both), on a fresh stage, that round's own stage
  apart ("round's stage": with a stage that flushes, a first round's flush, which
  the later step-by-step copy no longer pays; RocksDB's round stage carries the WAL
  instead), and how long its swap waited for the verification ("gate wait");
* the anchor: ``tar -cf -`` of the same files piped into an upload to the same store.

Before the round and before the anchor the page cache's dirty data is written
out (``settle``: ``sync``, untimed), so neither pays for the other's writes, nor
for the fill's, in its fsyncs.

If the swap waited for the verification (a gate wait over a millisecond), the
verification is the limit: the pipelined round is ``stage + verify + swap``.

With ``--pairs N`` the round and its anchor are run N times each (a fresh stage of
the same store each time) and the table gives the medians, and the median of the N
ratios: on a loaded machine one pair's wall clock swings by 2-4x. The first round
is run once (only it follows the fill).

With ``--twin`` the first round's steps are timed on a second store filled the
same way, so their ``stage`` is a first stage too.

Run: .venv/bin/python bench/export_round_probe.py [--keys 1000000] [--rounds 3] [--pairs 1]
     [--between 10000] [--twin]
     [--backends append-log,lmdb,rocksdb] [--store-url file:///dir | s3://bucket/prefix | moto]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from fold_replicas import BACKENDS, moto_s3, round_cpu, settle, spec, tar_upload
from waymark.kv import ObjectStoreTransport, open_store
from waymark.kv import export as export_module
from waymark.kv.artifact import MANIFEST_NAME, ExportInfo, stage_export
from waymark.kv.export import publish_staged
from waymark.kv.stores.protocol import SnapshotStore
from waymark.kv.types import KvUpdate, WatchCursor
from waymark.objstore import open_store as open_objstore

T = TypeVar("T")


def timed(fn: Callable[[], T], store: SnapshotStore) -> tuple[T, float, float]:
    """``fn()``, its wall and CPU seconds (``store``'s reopen worker's included)."""
    t, c = time.perf_counter(), round_cpu(store)
    out = fn()
    return out, time.perf_counter() - t, round_cpu(store) - c


def fill(store: SnapshotStore, keys: int, start: int = 0) -> None:
    """Puts of keys ``start`` .. ``keys - 1`` (revision = key number + 1), 1000 a batch."""
    value = b"v" * 32
    for i in range(start, keys, 1000):
        batch = [KvUpdate.put(f"key.{j:08}", value, j + 1) for j in range(i, min(i + 1000, keys))]
        store.apply(batch, WatchCursor.from_u64(i + len(batch)))


GATE_WAITS: list[float] = []
"""Wall seconds the pipelined round's swap waited for the verification (its gate)."""


def timed_gate(verifying: Future[None]) -> None:
    t = time.perf_counter()
    try:
        gate(verifying)
    finally:
        GATE_WAITS.append(time.perf_counter() - t)


gate = export_module.verify_gate
export_module.verify_gate = timed_gate  # publish_staged looks it up at each call


def pair(
    transport: ObjectStoreTransport, backend: str, store: SnapshotStore, work: Path
) -> tuple[tuple[float, float], tuple[float, float], float, tuple[float, float], float]:
    """One pipelined round and its anchor on the same files: (wall, CPU) of each, MB,
    (wall, CPU) of the round's own stage, and
    how long its swap waited for the verification."""
    info = ExportInfo(exporter="probe", bucket="probe")
    settle()
    t, c = time.perf_counter(), round_cpu(store)
    staged = stage_export(store, work / "round", info, link=True)  # as export_via does
    stage = (time.perf_counter() - t, round_cpu(store) - c)
    try:
        GATE_WAITS.clear()
        manifest, _ = publish_staged(transport, backend, staged)
        done = (time.perf_counter() - t, round_cpu(store) - c)
        (staged.stage / MANIFEST_NAME).write_bytes(manifest.encode())
        settle()
        anchor = tar_upload(transport, backend, staged.stage)
        return done, anchor, sum(f.size for f in manifest.files) / 1e6, stage, GATE_WAITS[0]
    finally:
        staged.discard()


def probe(
    transport: ObjectStoreTransport,
    backend: str,
    store: SnapshotStore,
    work: Path,
    pairs: int,
    twin: SnapshotStore | None = None,
) -> dict[str, tuple[float, float]]:
    """The pipelined round and its anchor (``pairs`` times: the median of each, and the
    median of the pairs' ratios), then one round's steps one after the other (on a
    second copy: the first stage of all is the round's; or on ``twin``'s first copy, a
    store filled the same way)."""
    out: dict[str, tuple[float, float]] = {}
    runs = [pair(transport, backend, store, work) for _ in range(pairs)]

    def median(values: list[tuple[float, float]]) -> tuple[float, float]:
        return statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)

    out["round"] = median([r[0] for r in runs])
    out["anchor"] = median([r[1] for r in runs])
    out["ratio"] = median([(a[0] / o[0], a[1] / o[1]) for o, a, *_ in runs])
    out["bytes"] = (runs[0][2], 0.0)
    out["round's stage"] = median([r[3] for r in runs])
    out["gate wait"] = median([(r[4], 0.0) for r in runs])
    info = ExportInfo(exporter="probe", bucket="probe")

    steps = twin if twin is not None else store
    staged, *out["stage"] = timed(lambda: stage_export(steps, work / "seq", info, link=True), steps)
    try:
        # Described first: a stage with a digest memo (RocksDB) verifies what describe
        # took from it, as the round does.
        (raw, manifest), *out["describe"] = timed(staged.describe, steps)
        _, *out["verify"] = timed(staged.verify, steps)
        up, *out["upload"] = timed(
            lambda: transport.upload_files(
                backend, staged.stage, raw, manifest, prefixes=staged.prefixes.keys()
            ),
            steps,
        )
        _, *out["swap"] = timed(lambda: transport.swap_pointer(up), steps)
    finally:
        staged.discard()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--pairs", type=int, default=1, help="round + anchor pairs per round (medians)"
    )
    parser.add_argument(
        "--between", type=int, default=10_000, help="new keys applied before each later round"
    )
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--store-url", help="object store URL, or 'moto' (default: file://)")
    parser.add_argument(
        "--twin",
        action="store_true",
        help="time the first round's steps on a second store filled the same way (so its"
        " stage is a first one too)",
    )
    args = parser.parse_args()
    console = Console(width=190)
    start_load = os.getloadavg()[:2]
    root = Path(tempfile.mkdtemp(prefix="waymark-bench-round-probe-"))
    table = Table(
        title=f"export round, step by step, {args.keys:,} keys of 32 B, {os.cpu_count()} cores;"
        " wall / CPU seconds"
    )
    cols = ("backend", "round", "stage", "verify", "describe", "upload", "swap")
    last = ("round's stage", "gate wait", "pipelined round", "anchor tar + upload")
    last = (*last, "ratio (wall / CPU)")
    last = (*last, "limit")
    for col in (*cols, *last):
        table.add_column(col, justify="left" if col in ("backend", "limit") else "right")
    try:
        with contextlib.ExitStack() as stack:
            url = (
                stack.enter_context(moto_s3())
                if args.store_url == "moto"
                else args.store_url or (root / "objects").as_uri()
            )
            transport = ObjectStoreTransport(open_objstore(url))
            for backend in args.backends.split(","):
                console.print(f"{backend}: filling {args.keys:,} keys …")
                store = open_store(spec(backend, root / backend / "live"))
                store.start_rounds()  # as an exporting fold node does before its rounds
                fill(store, args.keys)
                for n in range(args.rounds):
                    if n:  # what a periodic exporter finds: the fold moved since its last round
                        fill(
                            store, args.keys + n * args.between, args.keys + (n - 1) * args.between
                        )
                    # The first round once: only its first pair is a first round.
                    twin = None
                    if args.twin and n == 0:
                        twin = open_store(spec(backend, root / backend / "twin"))
                        twin.start_rounds()
                        fill(twin, args.keys)
                    try:
                        pairs = args.pairs if n else 1
                        r = probe(transport, backend, store, root / backend, pairs, twin)
                    finally:
                        if twin is not None:
                            twin.close()
                    limit = "verify" if r["gate wait"][0] > 0.001 else "describe + upload"
                    table.add_row(
                        backend,
                        "first" if n == 0 else f"again {n}",
                        *(f"{r[k][0]:.3f} / {r[k][1]:.3f}" for k in (*cols[2:], "round's stage")),
                        f"{r['gate wait'][0]:.3f}",
                        f"{r['round'][0]:.3f} / {r['round'][1]:.3f}",
                        f"{r['anchor'][0]:.3f} / {r['anchor'][1]:.3f}",
                        f"{r['ratio'][0]:.2f}x / {r['ratio'][1]:.2f}x",
                        f"{limit} ({r['bytes'][0]:.1f} MB)",
                    )
                store.close()
                shutil.rmtree(root / backend, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load1, load5, _ = os.getloadavg()
    table.caption = (
        f"load average {start_load[0]:.1f} / {start_load[1]:.1f} at the start, {load1:.1f} /"
        f" {load5:.1f} at the end (1 / 5 min). 'first' follows the fill (RocksDB's memtables"
        " full: its round stage copies their WAL); then the anchor on that round's files,"
        " then the steps one after the other on a second copy."
    )
    console.print(table)


if __name__ == "__main__":
    main()
