"""``waymark ship``: deliver a topic to an HTTP collector with an ordered checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from waymark.cli.options import ServerUrl

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from waymark.checkpoint.shipper import Shipper


def register(app: typer.Typer) -> None:
    @app.command()
    def ship(
        url: ServerUrl,
        topic: Annotated[str, typer.Option(help="The topic to ship.")],
        to: Annotated[str, typer.Option(help="The collector URL batches are POSTed to.")],
        in_flight: Annotated[int, typer.Option(min=1, help="Batches in flight at once.")] = 8,
        batch_records: Annotated[
            int, typer.Option(min=1, max=10_000, help="Records per batch (one diff page).")
        ] = 500,
        state: Annotated[
            Path | None,
            typer.Option(
                help="State directory: checkpoints.json, status.json, gaps.jsonl. "
                "Default: ./waymark-ship/<topic>."
            ),
        ] = None,
        dead_letter: Annotated[
            str | None,
            typer.Option(help="Topic for rejected records. Default: <topic>.dead-letter."),
        ] = None,
        once: Annotated[
            bool, typer.Option("--once", help="Ship up to the head seen at start, drain, exit.")
        ] = False,
        wait_ms: Annotated[
            int, typer.Option(min=0, max=60_000, help="Long-poll wait when caught up.")
        ] = 5_000,
        retry_base_ms: Annotated[
            float, typer.Option(min=0.001, help="First retry delay (doubles each retry).")
        ] = 100.0,
        retry_cap_ms: Annotated[float, typer.Option(min=0.001, help="Longest retry delay.")] = (
            10_000.0
        ),
        retry_budget_s: Annotated[
            float,
            typer.Option(
                min=0.001,
                help="Seconds one call (to the waymark server, or a batch to the collector) "
                "may keep failing before ship gives up: exit 6, the checkpoint kept.",
            ),
        ] = 120.0,
        metrics_port: Annotated[
            int | None, typer.Option(help="Serve Prometheus /metrics on this port (0: any).")
        ] = None,
        progress: Annotated[
            bool | None,
            typer.Option(help="Live progress display. Default: on when stderr is a terminal."),
        ] = None,
        token: Annotated[
            str | None,
            typer.Option(
                envvar="WAYMARK_TOKEN",
                show_envvar=True,
                help="Bearer token for a server with tokens (read:<topic>, and "
                "write on the dead-letter topic).",
            ),
        ] = None,
        ca_file: Annotated[
            Path | None,
            typer.Option(
                # --ca/WAYMARK_CA as every other command; the old spellings still work.
                "--ca",
                "--ca-file",
                envvar=["WAYMARK_CA", "WAYMARK_CA_FILE"],
                show_envvar=True,
                help="CA certificate (PEM) of an https waymark server.",
            ),
        ] = None,
    ) -> None:
        """Ship a topic to an HTTP collector, N batches in flight, resuming from the
        committed checkpoint. SIGTERM/SIGINT drain and exit; a second one stops at once."""
        import asyncio
        import logging

        from rich.console import Console
        from rich.logging import RichHandler

        from waymark.checkpoint.shipper import ShipConfig, Shipper
        from waymark.checkpoint.shipstats import serve_metrics
        from waymark.clock import Backoff

        console = Console(stderr=True)
        live = console.is_terminal if progress is None else progress
        logging.basicConfig(
            level=logging.INFO,
            format="%(message)s",
            handlers=[RichHandler(console=console, show_path=False)],
        )
        # One line per POST would drown the retries and rejections worth reading.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        config = ShipConfig(
            url=url,
            topic=topic,
            to=to,
            state_dir=state or Path("waymark-ship") / topic,
            in_flight=in_flight,
            batch_records=batch_records,
            dead_letter=dead_letter,
            once=once,
            wait_ms=wait_ms,
            backoff=Backoff(retry_base_ms / 1000, max(retry_cap_ms, retry_base_ms) / 1000),
            retry_budget_s=retry_budget_s,
            token=token,
            ca_file=None if ca_file is None else str(ca_file),
        )
        shipper = Shipper(config)
        if metrics_port is not None:
            bound = serve_metrics(shipper.stats, metrics_port)
            console.print(f"metrics on http://127.0.0.1:{bound}/metrics")
        asyncio.run(_main(shipper, console, live))
        stats = shipper.stats
        console.print(
            f"waymark ship stopped: {stats.records_acked} records acked, "
            f"{stats.records_dead_lettered} dead-lettered, committed $seq {stats.committed_seq}"
        )


async def _main(shipper: Shipper, console: Console, live: bool) -> None:
    import asyncio
    import contextlib
    import signal

    from rich.live import Live

    loop = asyncio.get_running_loop()
    run = asyncio.create_task(shipper.run())

    signals = 0

    def on_signal() -> None:
        # The first signal drains; a second one means "now": in-flight batches are
        # abandoned (read again after restart) and the committed checkpoint saved.
        nonlocal signals
        signals += 1
        if signals > 1:
            run.cancel()
        shipper.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    if live:
        with Live(_table(shipper), console=console, refresh_per_second=4) as display:
            while not run.done():
                await asyncio.wait((run,), timeout=0.25)
                display.update(_table(shipper))
    # A cancel is the second signal's forced stop, after which the shipper has saved
    # its committed checkpoint: a clean exit too.
    with contextlib.suppress(asyncio.CancelledError):
        await run


def _table(shipper: Shipper) -> Table:
    from rich.table import Table

    s = shipper.stats
    view = s.as_dict()
    table = Table(title=f"waymark ship {s.topic} → {shipper.config.to}", show_header=False)
    table.add_column(justify="right", style="bold")
    table.add_column(justify="right")
    rows = [
        ("state", shipper.state),
        ("read / head $seq", f"{s.read_seq:,} / {s.head_seq:,}"),
        ("committed $seq", f"{s.committed_seq:,}"),
        ("in flight", f"{s.in_flight} / {shipper.config.in_flight}"),
        ("records acked", f"{s.records_acked:,}  ({view['records_per_s']:,.0f}/s)"),
        ("batches acked / sent", f"{s.batches_acked:,} / {s.batches_sent:,}"),
        ("retries", f"{s.retries:,}"),
        ("rejected (records dead-lettered)", f"{s.batches_rejected} ({s.records_dead_lettered:,})"),
        ("tombstones (records lost)", f"{s.tombstones} (~{s.gap_records:,})"),
        ("replies", " ".join(f"{k}:{v}" for k, v in sorted(s.status_counts.items()))),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    return table
