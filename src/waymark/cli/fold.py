"""``waymark fold``: keep a durable local fold of a NATS KV bucket; ``fold show`` prints one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from waymark.cli.extras import require

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
        str | None, typer.Option(help="NATS URL; without it an embedded nats-server is started.")
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
    window_ms: Annotated[int, typer.Option(help="Batch window in milliseconds.")] = 10,
    batch_max: Annotated[int, typer.Option(help="Flush a batch at this many updates.")] = 1000,
) -> None:
    """Run the fold loop: resume from the store's cursor, apply, advance, until Ctrl-C."""
    require("fold", "kv")  # here, so that `fold show` is covered too
    if ctx.invoked_subcommand is not None:
        return
    if bucket is None or store is None:
        raise typer.BadParameter("--bucket and --store are required to run a fold")
    import asyncio

    asyncio.run(
        _run(nats, bucket, store, _prefixes(prefix), creds, nats_dir, window_ms / 1000, batch_max)
    )


async def _run(
    url: str | None,
    bucket: str,
    spec: str,
    prefixes: tuple[str, ...],
    creds: str | None,
    nats_dir: Path | None,
    window: float,
    batch_max: int,
) -> None:
    import asyncio
    import signal
    import time

    from rich.console import Console
    from rich.live import Live

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
    from waymark.kv.server import EmbeddedNats

    console = Console(stderr=True)
    server = None
    if url is None:
        server = EmbeddedNats(nats_dir).start()
        url = server.url
        console.print(f"embedded nats-server at [bold]{url}[/bold]")
    fold_store = open_store(spec)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    applied = 0
    started = time.monotonic()
    resumed = fold_store.cursor

    def status(cursor: WatchCursor) -> str:
        rate = applied / max(time.monotonic() - started, 1e-9)
        return (
            f"[bold]{bucket}[/bold] → {fold_store.backend}  cursor {cursor}  "
            f"(resumed at {resumed})  {applied:,} updates  {rate:,.0f}/s"
        )

    try:
        async with Connection(NatsConnectionConfig(url=url, creds_file=creds)) as conn:
            kv = await conn.store(bucket, StoreConfig(max_bytes=None) if server else None)
            with Live(status(resumed), console=console, refresh_per_second=4) as live:

                def count(batch: list[object]) -> None:
                    nonlocal applied
                    applied += len(batch)

                def on_applied(cursor: WatchCursor) -> None:
                    live.update(status(cursor))

                cursor = await watch_applied(
                    kv.watcher(),
                    WatchScope(prefixes),
                    count,
                    store=fold_store,
                    reader=kv.reader(),
                    config=BatchConfig(window=window, max=batch_max, channel_capacity=batch_max),
                    on_applied=on_applied,
                    shutdown=stop,
                )
        console.print(f"stopped at cursor {cursor}")
    finally:
        fold_store.close()
        if server is not None:
            server.stop()


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


def register(app: typer.Typer) -> None:
    app.add_typer(fold_app, name="fold")
