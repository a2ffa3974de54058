"""``waymark pipeline run SPEC.toml`` and ``waymark pipeline status SPEC.toml``
(docs/pipeline.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from waymark.cli.errors import EXIT_REFUSED, EXIT_UNAVAILABLE
from waymark.cli.extras import require

if TYPE_CHECKING:
    from rich.table import Table

    from waymark.objstore import ObjectStore
    from waymark.pipeline.spec import PipelineSpec

pipeline_app = typer.Typer(
    name="pipeline",
    help="Run pipelines whose edges move to another server when theirs dies.",
    no_args_is_help=True,
)


def status_tables(
    spec: PipelineSpec, store: ObjectStore, *, waiting_s: float | None = None
) -> tuple[Table, Table]:
    """The edges (generation, server) and the stages (progress, relocations, replay
    window, time to recover), from the handoff records and the stages' reports; while
    the store does not answer (or the runner has waited ``waiting_s`` for it), titled
    "waiting for the store" instead (docs/semantics/pipeline.md §10)."""
    from rich.markup import escape
    from rich.table import Table

    from waymark.objstore import ObjectStoreError

    try:
        edges, stages = _tables(spec, store)
    except ObjectStoreError as error:
        title = f"pipeline {spec.name}: waiting for the store ({escape(str(error)[:200])})"
        return Table(title=title), Table(title="stages")
    if waiting_s is not None:
        edges.title = f"{edges.title} - waiting for the store for {waiting_s:.1f} s"
    return edges, stages


def _tables(spec: PipelineSpec, store: ObjectStore) -> tuple[Table, Table]:
    from rich.markup import escape
    from rich.table import Table

    from waymark.pipeline.identity import load_identity
    from waymark.pipeline.report import load_report
    from waymark.pipeline.status import edge_lag, edge_statuses, shard_holders

    identity = load_identity(store)
    run = f" (run {identity.run})" if identity is not None else ""
    edges = Table(title=f"pipeline {spec.name}{run}: edges")
    # lag in items (events), and the packs (edge records) holding them
    numbers = ("generation", "lag", "lag packs")
    for column in ("edge", "generation", "server", "topic", "consumer", *numbers[1:]):
        edges.add_column(column, justify="right" if column in numbers else "left")
    for status in edge_statuses(spec, store):
        loc = status.locator
        lag = edge_lag(spec, store, status) if loc else None
        edges.add_row(status.edge, str(loc.generation) if loc else "-",
                      loc.server if loc else "(not placed)", loc.topic if loc else "-",
                      status.consumer, "-" if lag is None else f"{lag.items:,}",
                      "-" if lag is None else f"{lag.packs:,}")  # fmt: skip
    leases = shard_holders(spec, store)
    stages = Table(title="stages")
    for column in ("stage", "processed", "relocations", "rebinds", "replayed", "stale dropped",
                   "time to recover", "restarts", "dead letters", "state"):  # fmt: skip
        stages.add_column(column, justify="left" if column in ("stage", "state") else "right")
    for name in (key for stage in spec.stages.values() for key in stage.state_keys()):
        r = load_report(store, name)
        if name in leases:
            held = leases[name]
            name += f" ({held.owner}, epoch {held.epoch})" if held else " (no holder)"
        if r is None:
            stages.add_row(name, "-", "-", "-", "-", "-", "-", "-", "-", "not started")
            continue
        recover = f"{max(r.recover_s):.2f} s" if r.recover_s else "-"
        state = "done" if r.done else "running"
        if r.last_error and not r.done:
            state += f" (last error: {r.last_error[:120]})"
        stages.add_row(name, f"{r.processed:,}", str(r.relocations), str(r.rebinds),
                       f"{r.replayed:,}", f"{r.stale_dropped:,}", recover, str(r.restarts),
                       f"{r.dead_lettered:,}", escape(state))  # fmt: skip
    return edges, stages


def status_json(spec: PipelineSpec, store: ObjectStore) -> dict[str, Any]:
    """What the tables show, as one JSON object (``status --json``): the same
    ``PipelineReport`` a runner with ``report_to`` sends the console."""
    import msgspec

    from waymark.pipeline.status import pipeline_status

    return msgspec.to_builtins(pipeline_status(spec, store))  # type: ignore[no-any-return]


def _load(spec_path: Path) -> PipelineSpec:
    """The validated spec, every function imported; a bad one is one line on stderr and
    exit status 2 (docs/pipeline.md, "Checking a pipeline file")."""
    from waymark.pipeline.spec import PipelineSpec, SpecError

    try:
        return PipelineSpec.load(spec_path)
    except SpecError as error:
        typer.echo(f"{spec_path}: {error}", err=True)
        raise typer.Exit(2) from None


@pipeline_app.command()
def check(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.toml", help="The pipeline spec.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the topology as JSON.")] = False,
) -> None:
    """Validate a pipeline file without running it: keys, types and ranges, the
    topology, capacities against batches, and every stage's function imported."""
    require("pipeline", "kv")
    import json

    from rich.console import Console
    from rich.table import Table

    spec = _load(spec_path)
    if as_json:
        typer.echo(json.dumps({
            "pipeline": spec.name, "handoff": spec.handoff,
            "edges": {e.name: {"candidates": e.candidates, "capacity": e.capacity,
                               "consumer": spec.consumers[e.name]} for e in spec.edges.values()},
            "stages": {s.name: {"function": s.function or None, "input": s.input,
                                "outputs": list(s.outputs),
                                "sink": s.sink.topic if s.sink else None,
                                "events": s.events, "batch": s.batch, "external": s.external,
                                "instances": s.instances}
                       for s in spec.stages.values()},
        }))  # fmt: skip
        return
    table = Table(title=f"pipeline {spec.name}: ok")
    for column in ("stage", "function", "reads", "writes", "batch", "instances"):
        table.add_column(column, justify="right" if column in ("batch", "instances") else "left")
    for s in spec.stages.values():
        reads = s.input or (f"{s.events:,} events" if s.events is not None else "-")
        writes = ", ".join(s.outputs) or (f"{s.sink.topic} on {s.sink.url}" if s.sink else "-")
        table.add_row(s.name, "(external)" if s.external else s.function, reads, writes,
                      str(s.batch), str(s.instances))  # fmt: skip
    Console().print(table)


@pipeline_app.command()
def run(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.toml", help="The pipeline spec.")],
    stage: Annotated[
        list[str] | None,
        typer.Option(help="Run only this stage (repeatable); default: every stage."),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus /metrics on this port (0: any free).")
    ] = None,
    timeout_s: Annotated[
        float | None, typer.Option(help="Give up (exit 1) if not done after this long.")
    ] = None,
    report_to: Annotated[
        str | None,
        typer.Option(
            help="Send the pipeline's status to this server for its console "
            "(default: the file's report_to)."
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="WAYMARK_TOKEN",
            show_envvar=True,
            help="Bearer token for --report-to (a write scope).",
        ),
    ] = None,
    instance: Annotated[
        int | None,
        typer.Option(
            help="Run as this instance of the sharded stages (its shard first, "
            "others' when their holder stops); default: every shard."
        ),
    ] = None,
    clock_offset_file: Annotated[
        Path | None,
        typer.Option(
            help="Fault injection, for tests and fault campaigns: the runner's clock "
            "(shard leases, restart backoff, the handoff store's patience) is the wall "
            "clock plus the milliseconds this file holds, read again every 0.1 s, so "
            "rewriting it jumps the clock (docs/faults.md).",
        ),
    ] = None,
) -> None:
    """Run the stages until each is done: sources have produced and been acknowledged,
    the others have drained their input."""
    require("pipeline", "kv")
    from prometheus_client import start_http_server
    from rich.console import Console, Group
    from rich.live import Live
    from rich.markup import escape

    from waymark.clock import OffsetClock
    from waymark.objstore import ObjectStoreError
    from waymark.pipeline.identity import IdentityError
    from waymark.pipeline.runner import PipelineRunner
    from waymark.pipeline.shard import ShardLayoutChanged

    spec = _load(spec_path)
    clock = None if clock_offset_file is None else OffsetClock(clock_offset_file)
    try:
        runner = PipelineRunner(spec, stage, instance=instance, report_to=report_to, token=token,
                                clock=clock)  # fmt: skip
    except (KeyError, IdentityError) as error:
        message = error.args[0] if isinstance(error, KeyError) else str(error)
        typer.echo(f"{spec_path}: {message}", err=True)
        raise typer.Exit(2) from None
    except ShardLayoutChanged as error:  # a conflict with the store: refused
        typer.echo(f"{spec_path}: {error}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None
    except ObjectStoreError as error:  # out for longer than the store's budget
        typer.echo(f"{spec_path}: the handoff store does not answer: {error}", err=True)
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    console = Console(stderr=True, soft_wrap=True)
    port = metrics_port if metrics_port is not None else spec.metrics_port
    if port is not None:
        server, _ = start_http_server(port, registry=runner.registry)
        console.print(f"metrics on http://127.0.0.1:{server.server_port}/metrics")
    runner.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    done = False

    def tables() -> Group:
        # the store as it is, not waited for: the display never blocks on an outage
        since = runner.store.waiting_since_ms()
        waiting = None if since is None else (runner.clock.now_ms() - since) / 1000
        return Group(*status_tables(spec, runner.store.inner, waiting_s=waiting))

    with Live(tables(), console=console, auto_refresh=False,
              transient=not console.is_terminal) as live:  # fmt: skip
        while not done and (deadline is None or time.monotonic() < deadline):
            done = runner.wait(0.5)
            live.update(tables(), refresh=True)
            if runner.failure() is not None:
                break
    runner.stop()
    runner.report_status()  # the last status: done, or why it stopped
    if (failure := runner.failure()) is not None:
        console.print(f"[red]pipeline {spec.name} stopped: {escape(failure)}[/red]")
        raise typer.Exit(1)
    if not done:
        console.print("[red]not done before --timeout-s[/red]")
        raise typer.Exit(1)
    console.print(*tables().renderables)


@pipeline_app.command()
def status(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.toml", help="The pipeline spec.")],
    watch: Annotated[bool, typer.Option(help="Keep the tables live until Ctrl-C.")] = False,
    interval_s: Annotated[float, typer.Option(help="Refresh interval with --watch.")] = 0.5,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Each edge's generation and server; each stage's relocations, replay window and
    time to recover."""
    require("pipeline", "kv")
    from rich.console import Console, Group
    from rich.live import Live

    from waymark.objstore import open_store

    spec = _load(spec_path)
    store = open_store(spec.handoff)
    console = Console()
    if as_json:
        import json

        from waymark.objstore import ObjectStoreError

        try:
            typer.echo(json.dumps(status_json(spec, store)))
        except ObjectStoreError as error:
            typer.echo(f"{spec_path}: waiting for the store: {error}", err=True)
            raise typer.Exit(EXIT_UNAVAILABLE) from None
        return
    if not watch:
        console.print(*status_tables(spec, store))
        return
    with Live(Group(*status_tables(spec, store)), console=console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval_s)
                live.update(Group(*status_tables(spec, store)), refresh=True)
        except KeyboardInterrupt:
            pass


def register(app: typer.Typer) -> None:
    app.add_typer(pipeline_app, name="pipeline")
