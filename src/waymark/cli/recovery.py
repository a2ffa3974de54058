"""``waymark recovery``: what a receipt-keeping client missed, and where it stands
(docs/recovery.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from waymark.cli.options import ServerUrl as Url
from waymark.cli.options import Token

if TYPE_CHECKING:
    from waymark.recovery import CommittedVersion, RecoveryService

StoreOpt = Annotated[
    str,
    typer.Option(
        "--store",
        help="The receipt store: a SQLite file path (LocalReceiptStore), or topic:NAME for "
        "receipts kept in topic NAME of the same server (TopicReceiptStore).",
    ),
]
ClientOpt = Annotated[str, typer.Option("--client", help="The client id receipts are kept under.")]
Topics = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated topics the client reads (default: those its receipts were "
        "kept for, else all)."
    ),
]
RecentS = Annotated[
    float, typer.Option(help="Checkpoints newer than this are in flight, not missed.")
]
WindowS = Annotated[float, typer.Option(help="How far back the query looks, in seconds.")]


# Above this many keys, `missed` prints plain aligned columns instead of a rich table,
# as fast as --json (rich lays out every cell: 212 s for 100 000 keys).
RICH_ROWS = 1000


def _plain(title: str, keys: list[CommittedVersion]) -> str:
    """``keys`` as a table of plain aligned columns under ``title``."""
    width = max(len("key"), *(len(c.key) for c in keys))
    lines = [title, f"{'key':<{width}}  {'version':>10}  {'epoch':>10}"]
    lines += [f"{c.key:<{width}}  {c.version:>10}  {c.epoch:>10}" for c in keys]
    return "\n".join(lines)


def _service(
    url: str,
    token: str | None,
    store: str,
    client: str,
    topics: str | None,
    recent_s: float,
    max_window_s: float,
) -> RecoveryService:
    from waymark.client import Client
    from waymark.recovery import (
        LocalReceiptStore,
        ReceiptStore,
        RecoveryService,
        TopicCheckpoints,
        TopicReceiptStore,
    )

    # One connection for both; TopicCheckpoints closes it (the receipt store does not
    # close a client it was given).
    http = Client(url, token=token)
    try:  # read only: a look from the command line creates and changes nothing
        receipts: ReceiptStore = (
            TopicReceiptStore(url, store.removeprefix("topic:"), client=http, read_only=True)
            if store.startswith("topic:")
            else LocalReceiptStore(store, read_only=True)
        )
    except FileNotFoundError as exc:
        http.close()
        typer.echo(f"waymark: {exc}", err=True)
        raise typer.Exit(2) from exc
    binding = receipts.binding(client)
    if (
        binding is None
        and receipts.low_watermark(client) is None
        and not any(receipts.range_receipts(client, 0))
    ):
        receipts.close()
        http.close()
        typer.echo(f"waymark: {store} holds no receipts of client {client!r} (it never "
                   "subscribed there, or --client is another name)", err=True)  # fmt: skip
        raise typer.Exit(2)
    chosen = [t for t in (topics or "").split(",") if t] or None
    if topics is None and binding is not None:
        chosen = binding.topics  # the filter the receipts were kept for
    source = TopicCheckpoints(url, chosen, client=http, token=token)
    # A look from the command line is not the client itself: it reports nothing.
    return RecoveryService(source, receipts, client, recent_s=recent_s,
                           max_window_s=max_window_s, report=False)  # fmt: skip


def register(app: typer.Typer) -> None:
    recovery = typer.Typer(
        help="Receipt recovery: keys a client never receipted (docs/recovery.md).",
        no_args_is_help=True,
    )
    app.add_typer(recovery, name="recovery")

    @recovery.command()
    def missed(
        url: Url,
        store: StoreOpt,
        client: ClientOpt,
        token: Token = None,
        topics: Topics = None,
        recent_s: RecentS = 30.0,
        max_window_s: WindowS = 86_400.0,
        json: Annotated[bool, typer.Option("--json", help="JSON lines {key, version}.")] = False,
        resync: Annotated[
            bool,
            typer.Option(
                "--resync",
                help="When CLIENT's receipts are of another server instance (a new, "
                "replaced or restored data directory), list every key this server's "
                "checkpoints name instead of refusing (docs/recovery.md, Resync).",
            ),
        ] = False,
        new_filter: Annotated[
            bool,
            typer.Option(
                "--new-filter",
                help="--topics differ from those CLIENT's receipts were kept for: query "
                "with them anyway (what the old filter passed of added topics is lost).",
            ),
        ] = False,
        accept_loss: Annotated[
            bool,
            typer.Option(
                "--accept-loss",
                help="Exit 0 even when checkpoints fell out of the recovery window "
                "(they are still listed).",
            ),
        ] = False,
    ) -> None:
        """Print the keys CLIENT never receipted, each with its newest committed version,
        after the ranges of checkpoints it could not examine (lost: exit 3 unless
        --accept-loss). Reads only: nothing is receipted or stored."""
        import msgspec
        from rich.console import Console
        from rich.table import Table

        from waymark.recovery import CommittedVersion, WindowLoss

        service = _service(url, token, store, client, topics, recent_s, max_window_s)
        try:
            with Console(stderr=True).status("walking the change checkpoints"):
                found = service.missed(resync=resync, new_filter=new_filter)
        finally:  # a RecoveryError is a refusal: exit 5 (waymark.cli.errors)
            service.close()
            service.store.close()
        losses = [f for f in found if isinstance(f, WindowLoss)]
        keys = [f for f in found if isinstance(f, CommittedVersion)]
        if json:
            for loss in losses:
                lost = {"lost": [loss.first, loss.last], "reason": loss.reason}
                typer.echo(msgspec.json.encode(lost).decode())
            for committed in keys:
                line = {"key": committed.key, "version": committed.version,
                        "epoch": committed.epoch}  # fmt: skip
                typer.echo(msgspec.json.encode(line).decode())
        else:
            console = Console()
            for loss in losses:
                console.print(f"[red]lost: checkpoints {loss.first}-{loss.last} "
                              f"({loss.reason})[/red]")  # fmt: skip
            title = f"{len(keys)} keys missed by {client}"
            if len(keys) > RICH_ROWS:
                # rich measures every cell: minutes for 100 000 rows. Plain columns.
                typer.echo(_plain(title, keys))
            else:
                table = Table("key", "version", "epoch", title=title)
                for committed in keys:
                    table.add_row(committed.key, str(committed.version), str(committed.epoch))
                console.print(table)
        if losses and not accept_loss:
            ranges = ", ".join(f"{x.first}-{x.last} ({x.reason})" for x in losses)
            typer.echo(
                f"waymark: checkpoints {ranges} could not be examined: changes named only "
                "there are lost to this query (docs/recovery.md). Re-process what they may "
                "have named, or pass --accept-loss.",
                err=True,
            )
            raise typer.Exit(3)

    @recovery.command()
    def status(
        url: Url,
        store: StoreOpt,
        client: ClientOpt,
        token: Token = None,
        topics: Topics = None,
        recent_s: RecentS = 30.0,
        max_window_s: WindowS = 86_400.0,
    ) -> None:
        """CLIENT's low watermark, its range receipts and the checkpoints it has not
        fully receipted."""
        from rich.console import Console
        from rich.table import Table

        service = _service(url, token, store, client, topics, recent_s, max_window_s)
        try:
            with Console(stderr=True).status("walking the change checkpoints"):
                state = service.status()
        finally:  # a RecoveryError is a refusal: exit 5 (waymark.cli.errors)
            service.close()
            service.store.close()
        console = Console()
        mark = "none (first start)" if state.low_watermark is None else str(state.low_watermark)
        console.print(f"low watermark: {mark}")
        ranges = Table("begin", "end", title=f"{len(state.ranges)} range receipts")
        for begin, end in state.ranges:
            ranges.add_row(str(begin), str(end))
        console.print(ranges)
        pending = Table("checkpoint", "keys not receipted",
                        title=f"{len(state.pending)} checkpoints pending")  # fmt: skip
        for checkpoint, keys in state.pending:
            shown = ", ".join(keys[:5]) + (f" (+{len(keys) - 5})" if len(keys) > 5 else "")
            pending.add_row(str(checkpoint), shown)
        console.print(pending)

    @recovery.command()
    def clients(
        url: Url,
        token: Token = None,
        json: Annotated[bool, typer.Option("--json", help="The server's JSON answer.")] = False,
    ) -> None:
        """Every recovery client that reported to the server (docs/reports.md): its
        watermark, receipts, pending checkpoints and how many checkpoints it is behind."""
        import msgspec

        from waymark.client import Client

        with Client(url, token=token) as http:
            found = http.list_recovery_clients()
        from rich.console import Console  # once there is something to print
        from rich.table import Table

        if json:
            typer.echo(msgspec.json.encode(found).decode())
            return
        newest = "none" if found.newest_checkpoint is None else str(found.newest_checkpoint)
        title = f"recovery clients (newest checkpoint {newest})"
        table = Table("client", "watermark", "behind", "range receipts", "pending",
                      "last report", title=title)  # fmt: skip
        for c in found.clients:
            seen = f"{c.age_ms / 1000:.1f} s ago" + (" [red]stale[/red]" if c.stale else "")
            if c.failed:  # its service stopped (docs/semantics/recovery.md §3.6)
                seen += f" [red]failed: {c.failed}[/red]"
            table.add_row(c.client, "none" if c.watermark is None else str(c.watermark),
                          str(c.behind), str(c.range_receipts), str(c.pending), seen)  # fmt: skip
        Console().print(table)
