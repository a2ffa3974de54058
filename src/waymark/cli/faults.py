"""``waymark faults run``: a fault campaign over real waymark processes, with a report
(docs/faults.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from waymark.cli.errors import EXIT_DATA_LOSS
from waymark.cli.extras import require

faults_app = typer.Typer(help="Fault campaigns: real processes, seeded faults, checkers, a report.")


@faults_app.command()
def run(
    minutes: Annotated[float, typer.Option(min=0.2, help="Length of the campaign.")] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule.")] = 1,
    report: Annotated[Path, typer.Option(help="Directory for report.json and index.html.")] = Path(
        "faults-report"
    ),
    workdir: Annotated[
        Path | None,
        typer.Option(help="Where the processes keep their data and logs (default: temp)."),
    ] = None,
    kind: Annotated[
        list[str] | None,
        typer.Option(
            "--kind",
            help="Only these fault kinds (repeatable): server-kill, server-pause, fold-kill, "
            "fold-pause, consumer-kill, consumer-pause, net-cut, net-latency, s3-pause, disk-full, "
            "edge-kill, clock-jump, edge-pause, pipeline-kill, pipeline-pause, nats-kill, "
            "nats-pause, spark-kill, spark-pause. Default: all.",
        ),
    ] = None,
    s3: Annotated[
        bool,
        typer.Option(
            "--s3",
            help="The fold exports to S3 (moto's server, a development dependency) instead "
            "of file://, and the s3-pause fault is in the schedule.",
        ),
    ] = False,
    spark: Annotated[
        bool,
        typer.Option(
            "--spark",
            help="A Spark query (local[2]) with the exactly-once topic sink and the fold sink "
            "joins the flow, and the spark-kill and spark-pause faults the schedule (`./run "
            "faults` and the long run use it; the test suite's campaign does not: its JVM "
            "costs more than the suite's budget).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run the data flow under a seeded schedule of faults, check it, write the report.
    Exits 3 when a checker fails."""
    require("faults", "all")
    import json
    import signal
    import sys
    import tempfile

    from rich.console import Console
    from rich.table import Table

    from waymark.faults import FaultKind, run_campaign
    from waymark.faults import report as reports

    try:
        kinds = tuple(FaultKind(k) for k in kind) if kind else tuple(FaultKind)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--kind") from e
    # A kind whose part is not in the flow would leave nothing to schedule (or not that).
    needs = {FaultKind.S3_PAUSE: ("--s3", s3), FaultKind.SPARK_KILL: ("--spark", spark),
             FaultKind.SPARK_PAUSE: ("--spark", spark)}  # fmt: skip
    if kind:
        for k in kinds:
            flag, given = needs.get(k, ("", True))
            if not given:
                raise typer.BadParameter(f"{k} needs {flag}", param_hint="--kind")

    # SIGTERM ends a campaign as Ctrl-C does: unwinding stops every process of the flow
    # and unmounts its tmpfs (the default action would leave them running).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="waymark-faults-") as tmp:
        result = run_campaign(
            minutes * 60,
            seed,
            workdir or Path(tmp),
            kinds=kinds,
            s3=s3,
            spark=spark,
            log=lambda line: console.print(line),
        )
        page = reports.write(result, report)
    if as_json:
        typer.echo(json.dumps(reports.to_json(result), indent=1))
    else:
        table = Table("checker", "verdict", "result")
        for v in result.verdicts:
            table.add_row(v.name, "[green]PASS[/green]" if v.ok else "[red]FAIL[/red]", v.summary)
        Console().print(table)
        per_kind = Table("fault kind", "count", "recover p50 (s)", "p99 (s)", "not recovered",
                         "no-ops", "violations (run)")  # fmt: skip
        for name, s in reports.per_kind(result).items():
            per_kind.add_row(name, str(s["count"]), str(s["recover_p50_s"]),
                             str(s["recover_p99_s"]), str(s["not_recovered"]), str(s["noops"]),
                             str(s["violations"]))  # fmt: skip
        Console().print(per_kind)
        console.print(f"report: {page}")
    if not result.ok:
        raise typer.Exit(EXIT_DATA_LOSS)


def register(app: typer.Typer) -> None:
    app.add_typer(faults_app, name="faults")
