"""``waymark cluster up|down|status``: a Spark standalone cluster on this machine, from
the PySpark installation (docs/cli.md, "Spark cluster"; docs/spark.md, "Running on a
cluster")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from waymark.cli.connect import Json, print_json, print_table
from waymark.cli.errors import EXIT_UNAVAILABLE, Failure
from waymark.cli.extras import require

Directory = Annotated[
    Path,
    typer.Option(
        "--dir",
        envvar="WAYMARK_CLUSTER_DIR",
        help="The cluster's directory: its state (pids, ports), logs and the workers' "
        "work directories.",
    ),
]
DEFAULT_DIR = Path(".waymark-cluster")


def register(app: typer.Typer) -> None:
    cluster_app = typer.Typer(
        help="A Spark standalone cluster on this machine (master + workers, loopback).",
        no_args_is_help=True,
    )
    app.add_typer(cluster_app, name="cluster")

    @cluster_app.command("up")
    def up(
        workers: Annotated[int, typer.Option(help="Workers to run.", min=1)] = 2,
        cores: Annotated[int, typer.Option(help="Cores each worker offers.", min=1)] = 1,
        memory: Annotated[str, typer.Option(help="Memory each worker offers (1g, 512m).")] = "1g",
        host: Annotated[str, typer.Option(help="Address every daemon binds.")] = "127.0.0.1",
        timeout: Annotated[
            float, typer.Option(help="Seconds to wait for every worker to be ALIVE.")
        ] = 120.0,
        directory: Directory = DEFAULT_DIR,
    ) -> None:
        """Start a master and WORKERS workers (or the missing ones of a running cluster);
        return once the master reports them all ALIVE. Prints the master URL."""
        require("cluster", "spark")
        from waymark.spark import cluster

        try:
            state = cluster.up(directory, workers, cores=cores, memory=memory, host=host,
                               timeout=timeout)  # fmt: skip
        except cluster.ClusterError as e:
            raise Failure(f"{e} (waymark cluster down --dir {directory} cleans up)",
                          EXIT_UNAVAILABLE) from None  # fmt: skip
        typer.echo(f"master {state.master_url} (UI {state.ui_url}), "
                   f"{len(state.workers)} workers ALIVE; state in {state.directory}")  # fmt: skip
        typer.echo(f"run the demo on it: ./run demo --master {state.master_url}")

    @cluster_app.command("down")
    def down(
        timeout: Annotated[float, typer.Option(help="Seconds before SIGKILL.")] = 30.0,
        directory: Directory = DEFAULT_DIR,
    ) -> None:
        """Stop the workers (and their executors), then the master."""
        from waymark.spark import cluster

        stopped = cluster.down(directory, timeout)
        typer.echo(f"stopped {', '.join(d.role for d in stopped) or 'nothing (not running)'}")

    @cluster_app.command("status")
    def status(json: Json = False, directory: Directory = DEFAULT_DIR) -> None:
        """The master and workers: pid, ports, liveness, the state the master reports."""
        from waymark.spark import cluster

        state = cluster.status(directory)
        if json:
            print_json(state)
            return
        if not state["daemons"]:
            typer.echo(f"no cluster in {os.fspath(state['directory'])}")
            return
        rows = [
            [d["role"], d["pid"], d["port"], d["ui_port"], d["state"], d.get("cores_used", ""),
             d.get("work_dir") or "", d["log"]]
            for d in state["daemons"]
        ]  # fmt: skip
        print_table(
            f"{state['master_url']}: {state['alive_workers']} workers ALIVE, "
            f"apps {state['active_apps'] or 'none'}",
            ["role", "pid", "port", "ui port", "state", "cores used", "work dir", "log"],
            rows,
        )
