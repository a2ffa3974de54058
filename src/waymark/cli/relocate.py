"""``waymark demo relocate``: a pipeline bends around a dead server (docs/pipeline.md).

Two edge servers and a sink server; producer -> transform -> sink through two
edges; the server under the first edge is SIGKILLed mid-run; the producer moves
the edge to the other server, the transform follows the handoff, and the sink is
verified to hold every event exactly once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer

from waymark.cli.extras import require


class _Server:
    """A ``waymark serve`` child process that the demo may SIGKILL."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        with log.open("ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from waymark.cli import main; main()", "serve",
                 "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir)],
                stdout=subprocess.PIPE, stderr=err, text=True,
            )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("waymark listening on "):
            self.process.kill()
            raise typer.Exit(1)
        self.url = line.split()[3]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _sink_head(url: str, topic: str) -> int:
    """The sink topic's head before the run: a run counts only what it wrote after it
    (each run is a new pipeline run, delivered again: docs/semantics/pipeline.md §8.1)."""
    from waymark.client import ApiError, Client

    with Client(url) as client:
        try:
            return client.get_topic(topic, touch=False).head_seq
        except ApiError as error:
            if error.status == 404:
                return 0
            raise


def _sink_events(url: str, topic: str, after: int) -> Counter[int]:
    from waymark.client import Client

    seen: Counter[int] = Counter()
    with Client(url) as client:
        cursor = after
        while True:
            page = client.diff(topic, cursor, limit=10_000)
            seen.update(record.data["event_id"] for record in page.records)
            cursor = page.next_from_seq
            if page.caught_up:
                return seen


def passed(summary: dict[str, Any]) -> bool:
    """Whether a run of the demo showed what it is for: the kill landed, the edge under
    it moved (a relocation, generation 2 or above) and the sink holds every event
    exactly once. A run the kill missed proves nothing, so it fails
    (docs/pipeline.md, "The demo")."""
    return (
        bool(summary["killed"])
        and summary["relocations"] >= 1
        and summary["generations"].get("raw", 0) >= 2
        and summary["lost"] == 0
        and summary["duplicated"] == 0
    )


def relocate(
    events: Annotated[int, typer.Option(help="Events to push through the pipeline.", min=1)] = (
        20_000
    ),
    sink_url: Annotated[
        str | None, typer.Option(help="Write the sink topic on this server (default: start one).")
    ] = None,
    sink_topic: Annotated[
        str | None, typer.Option(help="The sink topic (default: a new one per run).")
    ] = None,
    kill_at: Annotated[
        float,
        typer.Option(
            help="SIGKILL the first edge's server when the source reaches this fraction of "
            "the events (it waits there until the kill landed).",
            min=0.0,
            max=0.99,
        ),
    ] = 0.3,
    as_json: Annotated[bool, typer.Option("--json", help="Print one final JSON object.")] = False,
) -> None:
    """Producer -> transform -> sink through two relocatable edges; the server under the
    first edge is SIGKILLed mid-run; every event must reach the sink exactly once."""
    require("demo relocate", "server", "kv")
    from rich.console import Console
    from rich.table import Table

    from waymark.cli.pipeline import status_tables
    from waymark.pipeline import demo
    from waymark.pipeline.runner import PipelineRunner
    from waymark.pipeline.spec import PipelineSpec
    from waymark.pipeline.status import edge_statuses

    console = Console(stderr=as_json)
    topic = sink_topic or f"demo.relocate.{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="waymark-relocate-")))
        log = root / "servers.log"
        servers = []
        for name in ("edge-a", "edge-b", *(() if sink_url else ("sink",))):
            server = _Server(root / name, log)
            stack.callback(server.close)
            servers.append(server)
        a, b = servers[0], servers[1]
        sink = sink_url or servers[2].url
        batch = max(50, min(500, events // 100))  # many batches: the kill lands mid-run
        spec = PipelineSpec.parse({
            "pipeline": {"name": "relocate-demo", "handoff": (root / "handoff").as_uri()},
            "edge": [{"name": "raw", "candidates": [a.url, b.url]},
                     {"name": "enriched", "candidates": [b.url, a.url]}],
            "stage": [
                {"name": "produce", "function": "waymark.pipeline.demo:held",
                 "events": events, "output": "raw", "batch": batch},
                {"name": "transform", "function": "waymark.pipeline.demo:enrich",
                 "input": "raw", "output": "enriched"},
                {"name": "sink", "function": "waymark.pipeline.demo:deliver",
                 "input": "enriched", "sink": {"url": sink, "topic": topic}},
            ],
        })  # fmt: skip
        console.print(f"edge servers {a.url} (raw) and {b.url} (enriched); sink {sink} {topic}")
        before = _sink_head(sink, topic)
        runner = PipelineRunner(spec, report_interval_s=0.2)
        # The source waits at the kill point until the kill landed: a run the kill
        # missed (everything written and acknowledged first, on a fast or loaded
        # machine) would move nothing and prove nothing (docs/pipeline.md, "The demo").
        at = min(events - 1, int(kill_at * events))
        demo.held.hold(at)
        stack.callback(demo.held.release)  # never leave the source waiting
        started = time.monotonic()
        runner.start()
        killed = threading.Event()

        def kill_when_due() -> None:
            while not demo.held.reached.wait(0.05):
                if runner.wait(0):
                    return
            console.print(f"[bold red]SIGKILL[/] the server under edge raw ({a.url}) "
                          f"as the source reached event {at:,}")  # fmt: skip
            a.kill()
            killed.set()
            demo.held.release()

        killer = threading.Thread(target=kill_when_due, daemon=True)
        killer.start()
        done = runner.wait(300)
        runner.stop()
        wall = time.monotonic() - started
        seen = _sink_events(sink, topic, before)
        reports = {name: run.report for name, run in runner.runs.items()}
        generations = {
            s.edge: s.locator.generation if s.locator else 0
            for s in edge_statuses(spec, runner.store)
        }
        if not as_json:
            console.print(*status_tables(spec, runner.store))
    lost = sum(1 for n in range(events) if seen[n] == 0)
    duplicated = sum(c - 1 for c in seen.values() if c > 1)
    recover = max((max(r.recover_s, default=0.0) for r in reports.values()), default=0.0)
    summary: dict[str, Any] = {
        "events": events,
        "relocations": sum(r.relocations for r in reports.values()),
        "time_to_recover_s": round(recover, 3),
        "replayed": sum(r.replayed for r in reports.values()),
        "generations": generations,
        "lost": lost,
        "duplicated": duplicated,
        "killed": killed.is_set(),
        "wall_s": round(wall, 3),
    }
    ok = done and passed(summary) and len(seen) == events
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        table = Table(title="relocate demo")
        table.add_column("")
        table.add_column("value", justify="right")
        for key, value in summary.items():
            table.add_row(key, str(value))
        console.print(table)
        console.print("[green]exactly once[/]" if ok else "[red]FAILED[/]")
    if not ok:
        raise typer.Exit(1)
