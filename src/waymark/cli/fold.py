"""``waymark fold``: keep a durable local fold of a NATS KV bucket; ``fold show`` prints one.

With ``--export-to`` the node also takes part in export rounds (lease, export,
upload, pointer swap); with ``--bootstrap-from`` a new node starts from the
published artifact instead of replaying the bucket; ``fold inspect`` shows what
is published. See docs/kv.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from waymark.cli.errors import EXIT_DATA_LOSS, EXIT_NOT_FOUND, EXIT_REFUSED
from waymark.cli.extras import require
from waymark.cli.options import Token
from waymark.cli.options import server as remember_server

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Awaitable, Callable

    from rich.console import Console

    from waymark.cli.fold_report import FoldReporter
    from waymark.client import AsyncClient
    from waymark.kv import ExportRequest, KvStore, SnapshotStore
    from waymark.kv.leftovers import StoreLock

EXIT_ARTIFACT_INVALID = EXIT_DATA_LOSS
EXIT_ARTIFACT_UNAVAILABLE = EXIT_NOT_FOUND

fold_app = typer.Typer(
    help="Fold a NATS JetStream KV bucket into a local durable store, resuming after restarts.",
    invoke_without_command=True,
    no_args_is_help=False,
)

PrefixOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--prefix", help="Only keys under this prefix (repeatable); '.' is appended if missing."
    ),
]


def _prefixes(prefix: list[str] | None) -> tuple[str, ...]:
    return tuple(p if p.endswith(".") else p + "." for p in prefix or [])


@fold_app.callback()
def fold(
    ctx: typer.Context,
    nats: Annotated[
        str | None,
        typer.Option(
            envvar="NATS_URL",
            show_envvar=True,
            help="NATS URL, or a cluster's URLs comma-separated (the start waits, saying "
            "so, until one answers); without it an embedded nats-server is started.",
        ),
    ] = None,
    bucket: Annotated[str | None, typer.Option(help="KV bucket (created if missing).")] = None,
    store: Annotated[
        str | None, typer.Option(help="append-log:PATH | lmdb:PATH | rocksdb:PATH")
    ] = None,
    prefix: PrefixOpt = None,
    creds: Annotated[str | None, typer.Option(help="Path to a NATS .creds file.")] = None,
    nats_dir: Annotated[
        Path | None,
        typer.Option(help="JetStream directory of the embedded server (default: temp)."),
    ] = None,
    nats_timeout_s: Annotated[
        float,
        typer.Option(
            min=0.5,
            help="Seconds a NATS request may take: one in flight when its server dies "
            "fails (and is retried) after this long.",
        ),
    ] = 30.0,
    nats_reset_attempts: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Attempts the watch makes to recreate a lost consumer while they fail "
            "transiently (a timeout, a cluster electing a leader) before the fold fails "
            "(default: until one succeeds, as nats.go's ordered consumer).",
        ),
    ] = None,
    window_ms: Annotated[int, typer.Option(help="Batch window in milliseconds.")] = 10,
    batch_max: Annotated[int, typer.Option(help="Flush a batch at this many updates.")] = 1000,
    export_to: Annotated[
        str | None,
        typer.Option(
            help="Take part in export rounds, publishing artifacts to this object store "
            "(file:///dir or s3://bucket/prefix)."
        ),
    ] = None,
    export_every_s: Annotated[
        float, typer.Option(min=0.01, help="Seconds between this node's export rounds.")
    ] = 300.0,
    lease_ttl_s: Annotated[
        float | None,
        typer.Option(min=1.0, help="Export lease TTL (default: --export-every-s); prune grace 4x."),
    ] = None,
    node_id: Annotated[
        str | None, typer.Option(help="This node's name in the lease (default: host-pid).")
    ] = None,
    keep: Annotated[
        int,
        typer.Option(
            min=1,
            help="Keep the last N restorable artifacts (the published one counts): pruning "
            "never removes them, so `fold restore --artifact ID` can fetch any of them.",
        ),
    ] = 1,
    bootstrap_from: Annotated[
        str | None,
        typer.Option(
            help="Start an empty store from the artifact published at this object store URL, "
            "then fold only the tail."
        ),
    ] = None,
    if_exists: Annotated[
        bool,
        typer.Option(
            "--if-exists",
            help="With --bootstrap-from: when nothing is published yet (a fleet's first "
            "node), replay the bucket from the start instead of exiting 4.",
        ),
    ] = False,
    artifact_key: Annotated[
        str | None, typer.Option(help="Artifact key in the object store (default: the bucket).")
    ] = None,
    report_to: Annotated[
        str | None,
        typer.Option(
            help="Report this node's status (cursor, lag, last export) to this "
            "waymark server, shown at /v0/folds and in its console."
        ),
    ] = None,
    report_every_s: Annotated[
        float, typer.Option(min=0.1, max=3600.0, help="Seconds between status reports.")
    ] = 5.0,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="WAYMARK_TOKEN",
            show_envvar=True,
            help="Bearer token of --report-to (a write scope).",
        ),
    ] = None,
    clock_offset_file: Annotated[
        Path | None,
        typer.Option(
            help="Fault injection, for tests and fault campaigns: the export rounds' clock "
            "(the export lease, artifact ages) is the wall clock plus the milliseconds this "
            "file holds, read again every 0.1 s, so rewriting it jumps the clock "
            "(docs/faults.md).",
        ),
    ] = None,
) -> None:
    """Run the fold loop: resume from the store's cursor, apply, advance, until Ctrl-C."""
    require("fold", "kv")  # here, so that `fold show` is covered too
    if ctx.invoked_subcommand is not None:
        return
    if bucket is None or store is None:
        raise typer.BadParameter("--bucket and --store are required to run a fold")
    if if_exists and bootstrap_from is None:
        raise typer.BadParameter("--if-exists goes with --bootstrap-from")
    if keep != 1 and export_to is None:
        raise typer.BadParameter("--keep goes with --export-to")
    import asyncio

    replicas = Replicas(
        export_to=export_to,
        every_s=export_every_s,
        ttl_s=lease_ttl_s or max(export_every_s, 1.0),
        node_id=node_id,
        bootstrap_from=bootstrap_from,
        key=artifact_key or bucket,
        if_exists=if_exists,
        keep=keep,
        clock_offset_file=clock_offset_file,
    )
    reporting = Reporting(report_to, report_every_s, token) if report_to else None
    remember_server(report_to)
    from rich.console import Console

    # soft_wrap: lines on stderr are log lines; a pipe's 80 columns must not cut them.
    console = Console(stderr=True, soft_wrap=True)
    # Held for the whole run, whichever way it ends (an exit code included).
    with _lock_and_clean(console, Path(store.partition(":")[2]).absolute()):
        asyncio.run(
            _run(
                nats,
                bucket,
                store,
                _prefixes(prefix),
                (creds, nats_timeout_s, nats_reset_attempts),
                nats_dir,
                window_ms / 1000,
                batch_max,
                replicas,
                reporting,
            )
        )


@dataclass(frozen=True)
class Reporting:
    """Where and how often a fold node reports its status (docs/reports.md)."""

    url: str
    every_s: float
    token: str | None


@dataclass(frozen=True)
class Replicas:
    """The export/bootstrap options of a fold node."""

    export_to: str | None
    every_s: float
    ttl_s: float
    node_id: str | None
    bootstrap_from: str | None
    key: str
    if_exists: bool = False
    keep: int = 1
    clock_offset_file: Path | None = None  # fault injection: OffsetClock (docs/faults.md)


async def _bootstrap(
    console: Console,
    replicas: Replicas,
    spec: str,
    bucket: str,
    prefixes: tuple[str, ...],
    generation: Callable[[], Awaitable[int]],
    reporter: FoldReporter | None,
) -> SnapshotStore | None:
    """Import the published artifact into the empty store path and return the store open
    (an append log replays once, in the import's verification), or exit non-zero; None
    when the path already holds a fold. Its progress is shown (and reported)."""
    import asyncio

    from rich.markup import escape

    from waymark.cli.fold_progress import RestoreProgress
    from waymark.kv import (
        ArtifactInvalid,
        ArtifactUnavailable,
        NothingPublished,
        ObjectStoreTransport,
    )
    from waymark.kv.artifact import content_address
    from waymark.kv.artifact_import import destination_is_empty
    from waymark.objstore import open_store as open_objstore

    assert replicas.bootstrap_from is not None
    path = Path(spec.partition(":")[2])
    if not destination_is_empty(path):
        console.print(f"{path} already holds a fold: resuming it instead of bootstrapping")
        return None
    transport = ObjectStoreTransport(open_objstore(replicas.bootstrap_from))
    published = transport.read_pointer(replicas.key)
    # Only an artifact that names its bucket instance needs this one's, from NATS.
    pointed = published.manifest
    current = await generation() if pointed is not None and pointed.generation else None
    artifact = content_address(published.body) if published.body is not None else "?"
    try:
        with RestoreProgress(
            console, artifact, pointed.rank if pointed else 0, reporter
        ) as progress:
            manifest, store = await asyncio.to_thread(
                transport.bootstrap_open, replicas.key, spec, bucket=bucket, scope=prefixes,
                generation=current, progress=progress, pointer=published,
            )  # fmt: skip
    except ArtifactInvalid as e:
        console.print(f"[red]ArtifactInvalid[/red]: {escape(e.reason)} (nothing written at {path})")
        raise typer.Exit(EXIT_ARTIFACT_INVALID) from e
    except NothingPublished as e:
        if not replicas.if_exists:
            console.print(f"[red]ArtifactUnavailable[/red]: {escape(str(e))}")
            raise typer.Exit(EXIT_ARTIFACT_UNAVAILABLE) from e
        # Only an absent pointer, or an artifact of a deleted instance of the bucket:
        # a pointer whose payload is gone, or one that does not parse, is a fault to
        # report, not "nothing published yet".
        console.print(
            f"nothing published at {escape(replicas.bootstrap_from)} ({escape(replicas.key)}) "
            f"yet for this bucket ({escape(str(e))}): replaying the bucket from the start "
            "(--if-exists)"
        )
        return None
    except ArtifactUnavailable as e:
        console.print(f"[red]ArtifactUnavailable[/red]: {escape(str(e))}")
        raise typer.Exit(EXIT_ARTIFACT_UNAVAILABLE) from e
    if reporter is not None:
        reporter.restored()
    size = sum(f.size for f in manifest.files)
    console.print(
        f"bootstrapped from {replicas.bootstrap_from} ({replicas.key}): cursor "
        f"{manifest.rank}, artifact {artifact}, {manifest.backend}, {len(manifest.files)} "
        f"file(s), {size:,} bytes, exported by {manifest.exporter or '?'}"
    )
    return store


async def _export_rounds(
    console: Console,
    replicas: Replicas,
    folded: KvStore,
    leases: KvStore,
    fold_store: SnapshotStore,
    requests: asyncio.Queue[ExportRequest],
    bucket: str,
    prefixes: tuple[str, ...],
    spec: str,
    reporter: FoldReporter | None,
) -> None:
    """Every ``every_s`` seconds, an export round if the fold moved since the last one."""
    import asyncio
    import os
    import socket

    from rich.markup import escape

    from waymark.clock import Clock, OffsetClock, SystemClock
    from waymark.kv import ExportLease, LeaseRecord, ObjectStoreTransport, RoundResult
    from waymark.kv.artifact import ExportInfo
    from waymark.kv.export import RoundState, export_via, run_export_round
    from waymark.kv.leftovers import exports_dir
    from waymark.objstore import open_store as open_objstore

    assert replicas.export_to is not None
    offset = replicas.clock_offset_file
    clock: Clock = SystemClock() if offset is None else OffsetClock(offset)
    node = replicas.node_id or f"{socket.gethostname()}-{os.getpid()}"
    transport = ObjectStoreTransport(open_objstore(replicas.export_to, clock=clock), clock=clock)
    lease = ExportLease(
        leases.reader(), leases.writer(), f"lease.{replicas.key}", node, replicas.ttl_s, clock
    )
    generation = await folded.generation()
    export = export_via(
        requests, lambda: ExportInfo(node, clock.now_ms(), bucket, prefixes, generation)
    )
    workdir = exports_dir(Path(spec.partition(":")[2]).absolute())
    fold_store.start_rounds()  # RocksDB verifies its rounds in a worker: started before them
    if abandoned := await asyncio.to_thread(transport.store.clean_abandoned_temp):
        console.print(
            f"removed {len(abandoned)} upload(s) a killed writer left in {replicas.export_to} "
            f"({sum(n for _, n in abandoned):,} bytes)"
        )
    last = None
    role = None  # what this node last said it does: "holder" or the standby's holder

    def standing_by(said: str | None, holder: LeaseRecord | None) -> str:
        """Say (and report) that this node stands by, when that is news."""
        name = holder.holder_id if holder is not None else "another node"
        if said != name:
            until = f" until {holder.expires_at_unix} (Unix s)" if holder is not None else ""
            console.print(f"export: standing by; {escape(name)} holds the lease {lease.key}{until}")
            if reporter is not None:
                reporter.export_role("standby", name)
        return name

    skipping = False  # whether it last said the pointer already names its cursor
    while True:
        await asyncio.sleep(replicas.every_s)
        cursor = fold_store.cursor
        if cursor.is_none or cursor == last:
            continue  # nothing folded yet, or nothing new since this node's last export
        try:
            now = await folded.generation()
        except Exception as e:  # the bucket is gone, or NATS unreachable: not this round
            console.print(f"[yellow]export round skipped[/yellow]: {escape(str(e))}")
            continue
        if now != generation:
            # This fold is of the deleted instance until it resyncs; labelled with the
            # new one its artifacts would be offered to the new bucket's nodes.
            console.print(
                f"[yellow]export stopped[/yellow]: the bucket was deleted and recreated "
                f"(generation {generation} -> {now}); restart this node to fold and export it"
            )
            return
        rank = cursor.as_u64()
        report = await run_export_round(
            lease=lease, export=export, transport=transport, key=replicas.key, workdir=workdir,
            keep=replicas.keep, fold_at=None if rank is None else (generation << 64) | rank,
        )  # fmt: skip
        if report.result is RoundResult.AlreadyPublished:
            last = cursor  # exported already (by whichever node): wait for the fold to move
            if not skipping:
                assert report.manifest is not None
                console.print(
                    f"export: skipped; the pointer already names cursor "
                    f"{report.manifest.rank} (this fold is at {rank})"
                )
            skipping = True
            holder = await lease.current()
            if (holder is not None and holder.holder_id != node
                    and not holder.expired(lease.now_unix())):  # fmt: skip
                role = standing_by(role, holder)  # it did not contend, but it stands by
            continue
        skipping = False
        if report.result is RoundResult.NotYours:
            role = standing_by(role, await lease.current())
            continue
        if RoundState.Exporting in report.states and role != "holder":
            role = "holder"
            console.print(f"export: {escape(node)} holds the lease {lease.key}; exporting")
            if reporter is not None:
                reporter.export_role("exporter", node)
        if report.result is RoundResult.Published:
            assert report.manifest is not None
            last = report.manifest.cursor
            console.print(
                f"export: published cursor {report.manifest.rank} to {replicas.export_to}"
                f" (pruned {len(report.pruned)})"
            )
            if reporter is not None:
                reporter.exported()
        elif report.result is RoundResult.Failed:
            console.print(f"[yellow]export round failed[/yellow]: {escape(str(report.error))}")
        elif report.result is RoundResult.SupersededByNewer:
            console.print("export: superseded by a newer artifact")


def _reporter(
    reporting: Reporting, replicas: Replicas, bucket: str, backend: str
) -> tuple[FoldReporter, AsyncClient]:
    """The node's status reporter to ``reporting.url``; it names the fold by its
    artifact key and reads the pointer where this node exports, if it does."""
    import os
    import socket

    from waymark.cli.fold_report import FoldReporter
    from waymark.client import AsyncClient
    from waymark.kv import ObjectStoreTransport
    from waymark.objstore import open_store as open_objstore

    client = AsyncClient(reporting.url, token=reporting.token, timeout=10.0)
    pointer = None
    if replicas.export_to is not None:
        pointer = ObjectStoreTransport(open_objstore(replicas.export_to))
    reporter = FoldReporter(
        client,
        fold=replicas.key,
        node=replicas.node_id or f"{socket.gethostname()}-{os.getpid()}",
        bucket=bucket,
        backend=backend,
        every_s=reporting.every_s,
        pointer=pointer,
    )
    return reporter, client


_EXIT_MEANINGS = {EXIT_DATA_LOSS: "data lost or damaged", EXIT_NOT_FOUND: "not found",
                  EXIT_REFUSED: "refused"}  # fmt: skip


def _failure(exc: BaseException) -> str | None:
    """What ended a fold, for its final report: None when it was asked to stop."""
    import asyncio

    if isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
        return None
    if isinstance(exc, typer.Exit):  # the reason was printed; the report names its kind
        meaning = _EXIT_MEANINGS.get(exc.exit_code, "error")
        return None if exc.exit_code == 0 else f"exit {exc.exit_code} ({meaning})"
    return f"{type(exc).__name__}: {exc}"


async def _run(
    url: str | None,
    bucket: str,
    spec: str,
    prefixes: tuple[str, ...],
    access: tuple[str | None, float, int | None],
    nats_dir: Path | None,
    window: float,
    batch_max: int,
    replicas: Replicas,
    reporting: Reporting | None,
) -> None:
    import asyncio
    import signal
    import time

    from rich.console import Console
    from rich.live import Live

    from waymark.cli.nats_wait import until_nats_answers
    from waymark.kv import (
        BatchConfig,
        Connection,
        NatsConnectionConfig,
        StoreConfig,
        WatchCursor,
        WatchScope,
        open_store,
        watch_applied,
    )
    from waymark.kv.deadline import cancel_and_wait
    from waymark.kv.server import EmbeddedNats

    console = Console(stderr=True, soft_wrap=True)
    server = None
    if url is None:
        server = EmbeddedNats(nats_dir).start()
        url = server.url
        console.print(f"embedded nats-server at [bold]{url}[/bold]")
    nats_url = url
    creds, timeout, reset_attempts = access  # the .creds file, the request timeout, ...

    def nats_config(url: str) -> NatsConnectionConfig:
        return NatsConnectionConfig(
            url=url, creds_file=creds, timeout=timeout, reset_attempts=reset_attempts
        )

    store_config = StoreConfig(max_bytes=None) if server else None

    async def bucket_generation() -> int:
        async def step() -> int:
            async with Connection(nats_config(nats_url)) as c:
                return await (await c.store(bucket, store_config)).generation()

        return await until_nats_answers(console, f"bucket {bucket} at {nats_url}", step)

    async def connected_bucket() -> tuple[Connection, KvStore]:
        """Connect and open the folded bucket; the connection is closed again when
        a step fails."""
        conn = Connection(nats_config(nats_url))
        try:
            await conn.connect()
            return conn, await conn.store(bucket, store_config)
        except BaseException:
            await conn.shutdown()
            raise

    async def open_buckets() -> tuple[Connection, KvStore, KvStore | None]:
        """:func:`connected_bucket`, then record the bucket's generation and open the
        lease's bucket; the connection is closed again when a step fails."""
        conn, kv = await connected_bucket()
        try:
            _record_generation(Path(spec.partition(":")[2]), await kv.generation())
            leases = None
            if requests is not None:
                # The lease lives in a bucket of its own: in the folded one it would be
                # folded. As many replicas as the folded bucket: on one node of a
                # cluster, that node's loss would stop every export round (docs/kv.md,
                # "On a NATS cluster").
                leases = await conn.store(f"{bucket}-export", StoreConfig(num_replicas=kv.replicas))
        except BaseException:
            await conn.shutdown()
            raise
        return conn, kv, leases

    reporter, report_client, reports = None, None, None
    if reporting is not None:
        reporter, report_client = _reporter(reporting, replicas, bucket, spec.partition(":")[0])
    try:
        await _forget_a_dead_buckets_fold(console, Path(spec.partition(":")[2]), bucket_generation)
        bootstrapped = None
        if replicas.bootstrap_from is not None:

            def bootstrap() -> Awaitable[SnapshotStore | None]:
                return _bootstrap(
                    console, replicas, spec, bucket, prefixes, bucket_generation, reporter
                )

            if reporter is None:
                bootstrapped = await bootstrap()
            else:  # the console shows the bootstrap's progress while it runs
                c, reported = await until_nats_answers(
                    console, f"bucket {bucket} at {nats_url}", connected_bucket
                )
                try:
                    during = asyncio.create_task(reporter.run(reported))
                    try:
                        bootstrapped = await bootstrap()
                    finally:
                        await cancel_and_wait(during)
                finally:
                    await c.shutdown()
    except BaseException as exc:
        if reporter is not None:  # the console's final report (docs/reports.md)
            why = _failure(exc)
            await reporter.final("failed" if why else "stopped", 0, why)
        if report_client is not None:
            await report_client.aclose()
        if server is not None:
            server.stop()
        raise
    fold_store = bootstrapped if bootstrapped is not None else open_store(spec)
    requests: asyncio.Queue[ExportRequest] | None = (
        asyncio.Queue() if replicas.export_to is not None else None
    )
    exporter: asyncio.Task[None] | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    applied = 0
    failure: str | None = None  # why the fold ended, when an error ended it
    started = time.monotonic()
    resumed = fold_store.cursor
    if reporter is not None:
        reporter.applied(resumed)

    def status(cursor: WatchCursor) -> str:
        rate = applied / max(time.monotonic() - started, 1e-9)
        return (
            f"[bold]{bucket}[/bold] → {fold_store.backend}  cursor {cursor}  "
            f"(resumed at {resumed})  {applied:,} updates  {rate:,.0f}/s"
        )

    try:
        conn, kv, leases = await until_nats_answers(
            console, f"bucket {bucket} at {nats_url}", open_buckets
        )
        try:
            if requests is not None:
                assert leases is not None
                exporter = asyncio.create_task(
                    _export_rounds(console, replicas, kv, leases, fold_store, requests, bucket,
                                   prefixes, spec, reporter)
                )  # fmt: skip
            if reporter is not None:
                reports = asyncio.create_task(reporter.run(kv))
            with Live(status(resumed), console=console, refresh_per_second=4) as live:

                def count(batch: list[object]) -> None:
                    nonlocal applied
                    applied += len(batch)

                def on_applied(cursor: WatchCursor) -> None:
                    live.update(status(cursor))
                    if reporter is not None:
                        reporter.applied(cursor)

                cursor = await watch_applied(
                    kv.watcher(),
                    WatchScope(prefixes),
                    count,
                    store=fold_store,
                    reader=kv.reader(),
                    config=BatchConfig(window=window, max=batch_max, channel_capacity=batch_max),
                    on_applied=on_applied,
                    shutdown=stop,
                    export_requests=requests,
                )
        finally:
            await conn.shutdown()
        console.print(f"stopped at cursor {cursor} ({applied:,} updates applied)")
    except BaseException as exc:
        failure = _failure(exc)
        raise
    finally:
        for task in (exporter, reports):
            if task is not None:
                await cancel_and_wait(task)
        if reporter is not None:  # the console's final report (docs/reports.md)
            await reporter.final("failed" if failure else "stopped", applied, failure)
        if report_client is not None:
            await report_client.aclose()
        fold_store.close()
        if server is not None:
            server.stop()


async def _forget_a_dead_buckets_fold(
    console: Console, store_path: Path, generation: Callable[[], Awaitable[int]]
) -> None:
    """Start the fold over if it is of a bucket that was deleted and recreated since.

    Its cursor counts the dead bucket's revisions: resumed on the new bucket
    (whose revisions start over) it would skip every new revision up to it,
    silently, once the new bucket has that many (docs/kv.md, CLI, "Generations")."""
    import contextlib
    import shutil

    from rich.markup import escape

    from waymark.kv.artifact_import import destination_is_empty
    from waymark.kv.leftovers import generation_path

    recorded_at = generation_path(store_path)
    if destination_is_empty(store_path) or not recorded_at.exists():
        return
    recorded = int(recorded_at.read_text() or 0)
    current = await generation()
    if not recorded or recorded == current:
        return
    console.print(
        f"[yellow]{escape(str(store_path))} folds generation {recorded} of the bucket, which "
        f"was deleted and recreated since (now generation {current}): starting it over[/yellow]"
    )
    if store_path.is_dir() and not store_path.is_symlink():
        shutil.rmtree(store_path)
    else:
        with contextlib.suppress(FileNotFoundError):
            store_path.unlink()
    recorded_at.unlink()


def _record_generation(store_path: Path, generation: int) -> None:
    """Write the bucket generation the fold is of, atomically, beside the store."""
    import os

    from waymark.kv.leftovers import generation_path

    target = generation_path(store_path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(str(generation))
    os.replace(tmp, target)


def _lock_and_clean(console: Console, store_path: Path) -> StoreLock:
    """Take the store's lock (exit 5 if another process holds it), then remove what a
    killed run of this node left beside the store (docs/kv.md, "Crash leftovers")."""
    from rich.markup import escape

    from waymark.kv.errors import StoreInUse
    from waymark.kv.leftovers import StoreLock, clean_leftovers

    try:
        lock = StoreLock(store_path)
    except StoreInUse as e:
        console.print(f"[red]StoreInUse[/red]: {escape(str(e))}")
        raise typer.Exit(EXIT_REFUSED) from e
    if removed := clean_leftovers(store_path, lock):
        names = ", ".join(p.name for p, _ in removed)
        console.print(
            f"removed {len(removed)} leftover(s) of a killed run "
            f"({sum(n for _, n in removed):,} bytes): {escape(names)}"
        )
    return lock


@fold_app.command()
def show(
    store: Annotated[str, typer.Option(help="append-log:PATH | lmdb:PATH | rocksdb:PATH")],
    prefix: PrefixOpt = None,
) -> None:
    """Print the fold's cursor, then one JSON line per entry: {"key", "value", "version"}.

    The value is UTF-8 text when it decodes; otherwise base64, with "encoding": "base64".
    """
    import base64

    import orjson

    from waymark.kv import open_store

    fold_store = open_store(store)
    try:
        typer.echo(f"cursor {fold_store.cursor}")
        for p in _prefixes(prefix) or ("",):
            for key in fold_store.iter_keys(p):
                entry = fold_store.get(key)
                if entry is None:
                    continue
                rev = entry.version.as_u64()
                line: dict[str, object] = {
                    "key": key,
                    "version": rev if rev is not None else entry.version.raw.hex(),
                }
                try:
                    line["value"] = entry.value.decode()
                except UnicodeDecodeError:
                    line["value"] = base64.b64encode(entry.value).decode()
                    line["encoding"] = "base64"
                typer.echo(orjson.dumps(line).decode())
    finally:
        fold_store.close()


@fold_app.command()
def restore(
    url: Annotated[
        str, typer.Argument(help="The object store: file:///dir or s3://bucket/prefix.")
    ],
    artifact: Annotated[
        str, typer.Option("--artifact", help="The artifact's id, as `fold inspect` lists it.")
    ],
    store: Annotated[
        str, typer.Option(help="The new store, absent or empty: append-log:PATH | lmdb:PATH | ...")
    ],
    bucket: Annotated[str, typer.Option(help="The KV bucket the fold will fold.")],
    prefix: PrefixOpt = None,
    artifact_key: Annotated[
        str | None, typer.Option(help="Artifact key in the object store (default: the bucket).")
    ] = None,
    nats: Annotated[
        str | None,
        typer.Option(
            envvar="NATS_URL",
            show_envvar=True,
            help="NATS URL: refuse an artifact of another generation of the live bucket "
            "(without it, of another generation than the published pointer's).",
        ),
    ] = None,
    creds: Annotated[str | None, typer.Option(help="Path to a NATS .creds file.")] = None,
) -> None:
    """Restore a named artifact (the published one or an older one kept by --keep N) into a
    new store; `waymark fold --store` then folds on from its cursor.

    Exits 3 (ArtifactInvalid) on a tampered artifact and 4 (ArtifactUnavailable) on an
    unknown or pruned id or one of another generation of the bucket; nothing is left at
    the store's path then.
    """
    import asyncio

    from rich.console import Console
    from rich.markup import escape

    from waymark.cli.fold_progress import RestoreProgress
    from waymark.kv import ArtifactInvalid, ArtifactUnavailable, ObjectStoreTransport
    from waymark.kv.artifact_import import destination_is_empty
    from waymark.objstore import open_store as open_objstore

    console = Console(stderr=True, soft_wrap=True)
    key, path = artifact_key or bucket, Path(store.partition(":")[2]).absolute()
    transport = ObjectStoreTransport(open_objstore(url))
    with _lock_and_clean(console, path):
        if not destination_is_empty(path):
            console.print(f"[red]{escape(str(path))} already holds a fold[/red]: restore into "
                          "an absent or empty path")  # fmt: skip
            raise typer.Exit(EXIT_REFUSED)
        if nats is not None:
            generation: int | None = asyncio.run(_live_generation(nats, creds, bucket))
        else:
            pointed = transport.read_pointer(key).manifest
            generation = pointed.generation if pointed is not None else None
        try:
            _, named = transport.artifact_manifest(key, artifact)
            with RestoreProgress(console, artifact, named.rank) as progress:
                manifest, restored = transport.restore_open(
                    key, artifact, store, generation=generation, bucket=bucket,
                    scope=_prefixes(prefix), progress=progress,
                )  # fmt: skip
        except ArtifactInvalid as e:
            console.print(
                f"[red]ArtifactInvalid[/red]: {escape(e.reason)} (nothing written at {path})"
            )
            raise typer.Exit(EXIT_ARTIFACT_INVALID) from e
        except ArtifactUnavailable as e:
            console.print(f"[red]ArtifactUnavailable[/red]: {escape(str(e))}")
            raise typer.Exit(EXIT_ARTIFACT_UNAVAILABLE) from e
        restored.close()
        if manifest.generation:  # a later `waymark fold` on a recreated bucket starts over
            _record_generation(path, manifest.generation)
    size = sum(f.size for f in manifest.files)
    console.print(
        f"restored artifact {artifact} into {escape(store)}: cursor {manifest.rank}, "
        f"{manifest.backend}, {len(manifest.files)} file(s), {size:,} bytes, exported by "
        f"{manifest.exporter or '?'}; `waymark fold --bucket {escape(bucket)} --store "
        f"{escape(store)}` folds on from there"
    )


async def _live_generation(url: str, creds: str | None, bucket: str) -> int:
    from waymark.kv import Connection, NatsConnectionConfig

    async with Connection(NatsConnectionConfig(url=url, creds_file=creds)) as c:
        return await (await c.store(bucket)).generation()


@fold_app.command()
def reports(
    server: Annotated[
        str | None,
        typer.Argument(help="The waymark server the folds report to (or --url)."),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            envvar="WAYMARK_URL", show_envvar=True, help="The waymark server (as SERVER)."
        ),
    ] = None,
    fold_name: Annotated[str | None, typer.Option("--fold", help="Only this fold's nodes.")] = None,
    token: Token = None,
    as_json: Annotated[bool, typer.Option("--json", help="The server's JSON answer.")] = False,
) -> None:
    """The fold nodes that report to SERVER (--report-to): cursor, lag behind the bucket,
    last export, and when each last reported (docs/reports.md)."""
    import datetime

    import msgspec
    from rich.console import Console
    from rich.table import Table

    from waymark.client import Client
    from waymark.protocol import FoldList

    address = server or url  # the positional spelling is kept; it wins over WAYMARK_URL
    if address is None:
        raise typer.BadParameter("give SERVER, --url or WAYMARK_URL")
    remember_server(address)
    with Client(address, token=token) as http:
        found = http.list_folds() if fold_name is None else http.get_fold(fold_name)
    if as_json:
        typer.echo(msgspec.json.encode(FoldList(found)).decode())
        return
    table = Table("fold", "node", "backend", "bucket", "cursor", "lag", "last export",
                  "export role", "bootstrap", "last report",
                  title=f"{len(found)} fold node(s)")  # fmt: skip
    for f in found:
        export = "none"
        if f.export is not None:
            at = datetime.datetime.fromtimestamp(f.export.time_ms / 1000, datetime.UTC)
            export = f"cursor {f.export.cursor} at {at:%H:%M:%S} ({f.export.payload})"
        role: str = f.role or "-"
        if f.role == "standby":
            role = f"standby ({f.lease_holder or 'another node'} holds the lease)"
        boot = "-"
        if (r := f.restore) is not None and r.phase == "done":
            boot = f"from {r.artifact} at cursor {r.cursor}"
        elif r is not None:
            boot = f"{r.phase} {r.done_bytes:,} of {r.total_bytes:,} bytes ({r.artifact})"
        seen = f"{f.age_ms / 1000:.1f} s ago" + (" [red]stale[/red]" if f.stale else "")
        table.add_row(f.fold, f.node, f.backend, f.bucket, str(f.cursor), str(f.lag), export,
                      role, boot, seen)  # fmt: skip
    console = Console()
    if not console.is_terminal:  # piped: no width to fit, and a cut name says nothing
        console = Console(width=240)
    console.print(table)


@fold_app.command()
def inspect(
    url: Annotated[
        str, typer.Argument(help="The object store: file:///dir or s3://bucket/prefix.")
    ],
    key: Annotated[
        list[str] | None, typer.Option(help="Only this artifact key (repeatable).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Show the published artifacts: each pointer, its manifest, and the payloads."""
    import orjson

    from waymark.kv import ObjectStoreTransport
    from waymark.objstore import open_store as open_objstore

    transport = ObjectStoreTransport(open_objstore(url))
    docs = [transport.inspect(k) for k in (key or transport.keys())]
    if as_json:
        typer.echo(orjson.dumps(docs, option=orjson.OPT_INDENT_2).decode())
        return
    _print_inspection(docs)


def _print_inspection(docs: list[dict[str, Any]]) -> None:
    import datetime

    from rich.console import Console
    from rich.table import Table

    def when(ms: int) -> str:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime(
            "%Y-%m-%d %H:%M:%S"
        )

    console = Console()
    if not docs:
        console.print("no artifacts published here")
    for doc in docs:
        pointer = doc["pointer"]
        table = Table(title=f"{doc['key']} @ {doc['url']}", show_header=False)
        if pointer is None:
            table.add_row("pointer", "none")
        elif pointer["manifest"] is None:
            table.add_row(
                "pointer", f"{pointer['key']} [red]corrupt[/red] (etag {pointer['etag']})"
            )
        else:
            m = pointer["manifest"]
            table.add_row("pointer", f"{pointer['key']} (etag {pointer['etag']})")
            table.add_row("cursor", f"{m['cursor']} ({m['cursor_hex']})")
            table.add_row("backend", f"{m['backend']}, format generation {m['format_generation']}")
            table.add_row("source", f"bucket {m['bucket']}, scope {m['scope'] or 'all'}")
            table.add_row("exported", f"by {m['exporter'] or '?'} at {when(m['exported_at_ms'])}")
            size = sum(f["size"] for f in m["files"])
            table.add_row("files", f"{len(m['files'])}, {size:,} bytes")
            table.add_row("payload", pointer["payload"])
        console.print(table)
        payloads = Table("artifact id", "size", "modified", "cursor", "target")
        for p in doc["payloads"]:
            payloads.add_row(
                p["id"],
                f"{p['size']:,}",
                when(p["last_modified_ms"]),
                "?" if p["rank"] is None else str(p["rank"]),
                "yes" if p["target"] else "",
            )
        console.print(payloads)


def register(app: typer.Typer) -> None:
    app.add_typer(fold_app, name="fold")
