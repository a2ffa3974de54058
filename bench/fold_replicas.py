"""Benchmark: fold replicas. Bootstrap from an artifact vs a cold replay, and export
throughput vs a plain ``tar`` + upload of the same files. One run, ratios.

Per backend, on one bucket of ``--keys`` keys (values of ``--value-bytes``):

1. **Bootstrap** (goal >= 10x): a node folds the bucket (``watch_applied`` from
   an empty store), exports and publishes an artifact; then ``--tail`` more
   updates are written. A new node bootstraps:
   ``ObjectStoreTransport.bootstrap_open`` (download the pointer's payload,
   stream-extract it, re-hash every file, open it, rename it into place, hand
   the opened store over) and then ``watch_applied`` from the artifact's cursor
   until it has folded the tail. The anchor is a cold replay of the same
   bucket into an empty store up to the same last sequence, run just after it.
2. **Export** (goal >= 0.8x): ``store.export_to`` (the backend's copy, verify by
   reopening, BLAKE3 of every file, manifest) plus ``transport.upload`` (the tar
   streamed as a multipart upload, then the pointer swap), against ``tar -cf -``
   of the same files (the artifact's) piped into an upload to the same store.
   Throughput is bytes of the artifact's files per second.

The export round runs twice per backend on the same exporter store, kept open in
between as a periodic exporter's is: after the fold of the bucket, and after it
folded ``--tail`` more updates.

Before each timed export and anchor the page cache's dirty data is written out
(``settle``, untimed). Both are timed on the wall clock and on the CPU: the
process's CPU time (every thread, obstore's included) and, for the anchor, ``tar``'s. On this shared
2-core machine a loaded run stretches the wall clock of CPU-bound work by the
run queue: the CPU columns say what the work itself costs.

Run: .venv/bin/python bench/fold_replicas.py [--keys 1000000] [--tail 10000] [--shuffle]
     [--backends append-log,lmdb,rocksdb] [--store-url file:///dir | s3://bucket/prefix | moto]
     [--profile] [--only export]
``--only export`` runs the export rows only (no bootstrap, no cold replay).
``--store-url moto`` starts moto's S3 server (a dev dependency) as a separate process on a
free port and uses a bucket there, over HTTP. ``--profile`` runs each backend's
``export_to`` and bootstrap import under cProfile and prints where their wall time went.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.table import Table

from waymark.kv import (
    BatchConfig,
    Connection,
    KvStore,
    NatsConnectionConfig,
    ObjectStoreTransport,
    PublishOutcome,
    StoreConfig,
    WatchCursor,
    WatchScope,
    open_store,
    watch_applied,
)
from waymark.kv.artifact import ExportInfo, StagedExport, stage_export
from waymark.kv.export import publish_staged
from waymark.kv.server import EmbeddedNats, free_port
from waymark.kv.stores.protocol import SnapshotStore
from waymark.objstore import PART_SIZE
from waymark.objstore import open_store as open_objstore

BACKENDS = ("append-log", "lmdb", "rocksdb")
T = TypeVar("T")
BATCH = 1000


def spec(backend: str, root: Path) -> str:
    return f"{backend}:{root / ('fold.log' if backend == 'append-log' else 'db')}"


async def load(kv: KvStore, items: Iterator[tuple[str, bytes]]) -> None:
    for key, value in items:
        await kv.js.publish_async(f"{kv.subject_prefix}{key}", value)
    await kv.js.publish_async_completed()


async def fold_until(kv: KvStore, store: SnapshotStore, last: int) -> float:
    """Seconds for ``watch_applied`` to take ``store`` from its cursor to ``last``."""
    done = asyncio.Event()

    def on_applied(cursor: WatchCursor) -> None:
        if cursor.as_u64() >= last:
            done.set()

    if store.cursor.as_u64() >= last:
        done.set()
    t = time.perf_counter()
    await watch_applied(
        kv.watcher(),
        WatchScope.all(),
        store=store,
        reader=kv.reader(),
        config=BatchConfig(window=0.05, max=BATCH * 4, channel_capacity=BATCH),
        on_applied=on_applied,
        shutdown=done,
    )
    return time.perf_counter() - t


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """moto's S3 server in its own process (not this one's GIL); yields an s3:// URL."""
    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
    }
    os.environ.update(env)
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        for _ in range(200):
            try:
                client.create_bucket(Bucket="replicas")
                break
            except Exception:  # not listening yet
                time.sleep(0.05)
        yield "s3://replicas/bench"
    finally:
        server.kill()
        server.wait()


def settle() -> None:
    """Write out the page cache's dirty data (untimed) before a timed export or anchor:
    on ext4 an fsync can wait for other files' dirty blocks too, so without it the
    side that runs first pays for what the fold (or the other side) wrote."""
    os.sync()


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def round_cpu(store: SnapshotStore) -> float:
    """This process's CPU seconds plus those of the store's reopen worker (RocksDB's
    rounds verify there), from /proc in clock ticks (10 ms): a round's CPU is both."""
    cpu = time.process_time()
    pid = getattr(getattr(store, "reopen_worker", None), "pid", None)
    if pid is not None:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu


def tar_upload(transport: ObjectStoreTransport, key: str, artifact: Path) -> tuple[float, float]:
    """The anchor: ``tar -cf -`` of the artifact's files piped into an upload.

    Returns wall seconds and CPU seconds (this process's and tar's).
    """
    t, c, cc = time.perf_counter(), time.process_time(), children_cpu()
    proc = subprocess.Popen(
        ["tar", "-cf", "-", "-C", str(artifact), "MANIFEST.json", "data"], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None

    def chunks() -> Iterator[bytes]:
        while chunk := proc.stdout.read(PART_SIZE):  # type: ignore[union-attr]
            yield chunk

    transport.store.upload(f"anchor/{key}.tar", chunks())
    if proc.wait() != 0:
        raise RuntimeError("tar failed")
    cpu = time.process_time() - c + children_cpu() - cc
    return time.perf_counter() - t, cpu


@dataclass
class Profiles:
    """cProfile of the phases asked for (``--profile``), by label."""

    enabled: bool
    stats: dict[str, pstats.Stats] = field(default_factory=dict)

    def run(self, label: str, fn: Callable[[], T]) -> T:
        if not self.enabled:
            return fn()
        prof = cProfile.Profile()
        try:
            return prof.runcall(fn)
        finally:
            self.stats[label] = pstats.Stats(prof)

    def tables(self, top: int = 8) -> Iterator[Table]:
        for label, st in self.stats.items():
            t = Table(title=f"profile: {label} (top {top} by own time; seconds of wall clock)")
            for col in ("function", "calls", "own", "cumulative"):
                t.add_column(col, justify="left" if col == "function" else "right")
            rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
            for (file, line, name), (_, calls, own, cum, _) in rows[:top]:
                where = name if file == "~" else f"{Path(file).name}:{line} {name}"
                t.add_row(where, f"{calls:,}", f"{own:.3f}", f"{cum:.3f}")
            yield t


@dataclass
class Timed:
    """One pipelined export as a round runs it, and its anchor on the same files."""

    stage_s: float = 0.0
    total_s: float = 0.0
    cpu: float = 0.0
    tar_s: float = 0.0
    tar_cpu: float = 0.0
    artifact_bytes: int = 0


def export_round(
    transport: ObjectStoreTransport, key: str, store: SnapshotStore, workdir: Path
) -> Timed:
    """What ``run_export_round`` does between winning the lease and completing it:
    ``stage_export`` (the copy, in the fold's pause) and ``publish_staged`` (the
    verifying reopen on a second thread while BLAKE3, the tar stream and the upload
    run, then the pointer swap). Then the anchor on the same files."""
    out = Timed()
    info = ExportInfo(exporter="bench", bucket="bench")
    settle()
    t, c = time.perf_counter(), round_cpu(store)
    staged: StagedExport = stage_export(store, workdir / "round", info, link=True)
    out.stage_s = time.perf_counter() - t
    try:
        manifest, outcome = publish_staged(transport, key, staged)
        out.total_s, out.cpu = time.perf_counter() - t, round_cpu(store) - c
        assert outcome is PublishOutcome.Published
        out.artifact_bytes = sum(f.size for f in manifest.files)
        (staged.stage / "MANIFEST.json").write_bytes(manifest.encode())  # for the anchor's tar
        settle()
        out.tar_s, out.tar_cpu = tar_upload(transport, key, staged.stage)
    finally:
        staged.discard()
    return out


@dataclass
class Row:
    backend: str
    cold_s: float = 0.0
    bootstrap_s: float = 0.0
    download_import_s: float = 0.0
    tail_s: float = 0.0
    download_import_cpu: float = 0.0
    export_s: float = 0.0
    export_copy_s: float = 0.0
    export_cpu: float = 0.0
    export_copy_cpu: float = 0.0
    tar_s: float = 0.0
    tar_cpu: float = 0.0
    artifact_bytes: int = 0
    round: Timed = field(default_factory=lambda: Timed())
    repeat: Timed = field(default_factory=lambda: Timed())


async def run(
    args: argparse.Namespace, root: Path, console: Console, profiles: Profiles
) -> list[Row]:
    backends = args.backends.split(",")
    url = args.url
    transport = ObjectStoreTransport(open_objstore(url))
    rows = {b: Row(b) for b in backends}
    value = b"v" * args.value_bytes
    with EmbeddedNats(root / "nats") as server:
        async with Connection(NatsConnectionConfig(url=server.url, timeout=60)) as conn:
            kv = await conn.store("bench", StoreConfig(max_bytes=None))
            console.print(f"loading {args.keys:,} keys …")
            order = list(range(args.keys))
            if args.shuffle:  # keys written in no order: the fold's log is not sorted by key
                random.Random(22).shuffle(order)
            await load(kv, ((f"key.{i:08}", value) for i in order))
            _, exported_at = await kv.stream_bounds()

            exporters: dict[str, SnapshotStore] = {}  # open until their second round
            for b in backends:
                console.print(f"{b}: exporter folds the bucket, exports, publishes …")
                store = exporters[b] = open_store(spec(b, root / b / "exporter"))
                store.start_rounds()  # as an exporting fold node does before its rounds
                await fold_until(kv, store, exported_at)
                rows[b].round = export_round(transport, f"{b}.round", store, root / b)
                art = root / b / "artifact"
                info = ExportInfo(exporter="bench", bucket="bench")
                settle()
                t, c = time.perf_counter(), time.process_time()
                profiles.run(f"{b} export_to", lambda: store.export_to(art, info))  # noqa: B023
                copied, copied_cpu = time.perf_counter() - t, time.process_time() - c
                _, outcome = transport.upload(b, art)
                rows[b].export_s = time.perf_counter() - t
                rows[b].export_cpu = time.process_time() - c
                rows[b].export_copy_s, rows[b].export_copy_cpu = copied, copied_cpu
                assert outcome is PublishOutcome.Published
                rows[b].artifact_bytes = sum(
                    p.stat().st_size for p in (art / "data").rglob("*") if p.is_file()
                )
                settle()
                rows[b].tar_s, rows[b].tar_cpu = tar_upload(transport, b, art)
                shutil.rmtree(art)

            console.print(f"writing a tail of {args.tail:,} updates …")
            await load(
                kv,
                (
                    (f"key.{i:08}", b"tail")
                    for i in range(0, args.keys, max(1, args.keys // max(args.tail, 1)))
                ),
            )
            _, last = await kv.stream_bounds()

            for b in backends:
                console.print(f"{b}: exporter folds the tail, exports again …")
                # The same store, still open: a periodic exporter's next round (the
                # append log's verification then replays only what the tail appended).
                store = exporters.pop(b)
                await fold_until(kv, store, last)
                rows[b].repeat = export_round(transport, f"{b}.round", store, root / b)
                store.close()

            for b in backends if args.only != "export" else ():
                console.print(f"{b}: bootstrap, then the cold replay anchor …")
                dest = spec(b, root / b / "bootstrapped")
                t, c = time.perf_counter(), time.process_time()
                manifest, store = profiles.run(
                    f"{b} bootstrap_open",
                    lambda: transport.bootstrap_open(b, dest),  # noqa: B023
                )
                rows[b].download_import_s = time.perf_counter() - t
                rows[b].download_import_cpu = time.process_time() - c
                assert manifest.rank == exported_at
                rows[b].tail_s = await fold_until(kv, store, last)
                rows[b].bootstrap_s = time.perf_counter() - t
                store.close()
                shutil.rmtree(root / b / "bootstrapped", ignore_errors=True)

                cold = open_store(spec(b, root / b / "cold"))
                rows[b].cold_s = await fold_until(kv, cold, last)
                cold.close()
                shutil.rmtree(root / b, ignore_errors=True)
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--tail", type=int, default=10_000, help="updates written after export")
    parser.add_argument("--value-bytes", type=int, default=32)
    parser.add_argument(
        "--shuffle",
        action="store_true",
        help="write the keys in a random order (else in key order)",
    )
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument(
        "--store-url", help="object store URL, or 'moto' (default: file:// in a temp dir)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile export_to and the bootstrap import"
    )
    parser.add_argument(
        "--only", choices=("export",), help="only the export rows (no bootstrap, no cold replay)"
    )
    args = parser.parse_args()
    console = Console(width=190)
    profiles = Profiles(args.profile)
    start_load = os.getloadavg()[:2]
    root = Path(tempfile.mkdtemp(prefix="waymark-bench-replicas-"))
    try:
        with contextlib.ExitStack() as stack:
            if args.store_url == "moto":
                args.url = stack.enter_context(moto_s3())
            else:
                args.url = args.store_url or (root / "objects").as_uri()
            rows = asyncio.run(run(args, root, console, profiles))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    load1, load5, _ = os.getloadavg()
    where = {None: "file:// (local disk)", "moto": "S3 (moto server, HTTP)"}.get(
        args.store_url, args.store_url
    )
    t = Table(
        title=f"fold replicas, {args.keys:,} keys of {args.value_bytes} B"
        f" ({'written in a random order' if args.shuffle else 'written in key order'})"
        f" + {args.tail:,} tail,"
        f" {where}, {os.cpu_count()} cores, load average {start_load[0]:.1f} / {start_load[1]:.1f}"
        f" at the start, {load1:.1f} / {load5:.1f} at the end (1 / 5 min)"
    )
    for col in ("measure", "backend", "ours", "anchor", "ratio", "ratio (CPU)", "goal"):
        t.add_column(col, justify="left" if col in ("measure", "backend") else "right")
    for r in rows if args.only != "export" else ():
        t.add_row(
            "bootstrap (fetch+verify+import+open, tail) vs cold replay",
            r.backend,
            f"{r.bootstrap_s:.2f} s ({r.download_import_s:.2f} + {r.tail_s:.2f});"
            f" import CPU {r.download_import_cpu:.2f} s",
            f"{r.cold_s:.2f} s",
            f"{r.cold_s / r.bootstrap_s:.1f}x",
            "",
            "≥10x",
        )
    for label, pick in (
        ("export round, first (stage + verify ∥ hash/tar/upload, swap) vs tar + upload", "round"),
        (f"export round again, after {args.tail:,} more updates", "repeat"),
    ):
        for r in rows:
            x: Timed = getattr(r, pick)
            mb = x.artifact_bytes / 1e6
            t.add_row(
                label,
                r.backend,
                f"{mb / x.total_s:,.0f} MB/s"
                f" ({x.stage_s:.2f} stage + {x.total_s - x.stage_s:.2f} s); CPU {x.cpu:.2f} s",
                f"{mb / x.tar_s:,.0f} MB/s ({x.tar_s:.2f} s); CPU {x.tar_cpu:.2f} s",
                f"{x.tar_s / x.total_s:.2f}x",
                f"{x.tar_cpu / x.cpu:.2f}x",
                "≥0.80x",
            )
    for r in rows:
        mb = r.artifact_bytes / 1e6
        t.add_row(
            "export_to + upload (sequential, run after the round) vs tar + upload",
            r.backend,
            f"{mb / r.export_s:,.0f} MB/s"
            f" ({r.export_copy_s:.2f} + {r.export_s - r.export_copy_s:.2f} s);"
            f" CPU {r.export_copy_cpu:.2f} + {r.export_cpu - r.export_copy_cpu:.2f} s",
            f"{mb / r.tar_s:,.0f} MB/s ({r.tar_s:.2f} s); CPU {r.tar_cpu:.2f} s",
            f"{r.tar_s / r.export_s:.2f}x",
            f"{r.tar_cpu / r.export_cpu:.2f}x",
            "≥0.80x",
        )
    console.print(t)
    console.print(
        "artifact sizes: "
        + ", ".join(f"{r.backend} {r.artifact_bytes / 1e6:,.1f} MB" for r in rows)
        + ";"
        " export time = export_to (copy, verify by reopening, BLAKE3, manifest) + upload (tar"
        " stream, multipart put, pointer swap)"
    )
    for table in profiles.tables():
        console.print(table)


if __name__ == "__main__":
    main()
