"""Pipeline throughput through relocatable edges (docs/pipeline.md).

Three real ``waymark serve`` processes (two edge servers and a sink server) on temp
data dirs. Runs, in this order, each on fresh topics:

* anchor: the closest honest baseline — the same events written by one client
  straight to a sink topic with their ids (batches of 500), no stages, no edges;
* pipeline: produce -> transform -> sink through two edges (``waymark.pipeline``
  runner, batches of 500), every event verified exactly once at the sink;
* pipeline + failover: the same, with the server under the first edge SIGKILLed
  after a third of the events; reports relocations, time to recover, replay window;
* pipeline, one process per stage: the same spec, each stage a
  ``waymark pipeline run SPEC --stage X`` process (no GIL shared between stages),
  timed from the source's first report to the sink's last (its "done"), both stamped
  by the stages themselves: the processes' start-up (imports, ~1 s of CPU each) is
  left out, as the runner's is in the rows above; the source's start is shown apart.

Ratios are events/s against the anchor, measured in the same run. Each row also
gives the CPU seconds each process spent on it (utime + stime, from ``/proc`` for the
servers, ``getrusage`` for this process and the stage processes): less sensitive to
the machine's load than the wall time, so the figure to compare between runs.
Run: ``.venv/bin/python bench/pipeline_edges.py [--events 50000] [--per-event-sink]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from waymark.client import Client, ConfigPatch, RecordIn
from waymark.objstore import open_store
from waymark.pipeline.demo import enrich, produce
from waymark.pipeline.report import StageReport, load_report
from waymark.pipeline.runner import PipelineRunner
from waymark.pipeline.spec import PipelineSpec

BATCH = 500
# The sink stage's function: the demo's batch function, which writes each batch on as
# it was read (docs/pipeline.md, "Batch functions"); --per-event-sink: the same mapping
# event by event, each record decoded and encoded again.
SINK_FUNCTION = "waymark.pipeline.demo:deliver"


def start(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    exe = str(Path(sys.executable).parent / "waymark")
    process = subprocess.Popen(
        [exe, "serve", "--port", "0", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    return process, process.stdout.readline().split()[3]


def cpu_s(pid: int) -> float:
    """A live process's CPU seconds so far (utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent during a block: this process's, its reaped children's (the
    stage processes) and each server's."""

    def __init__(self, servers: dict[str, subprocess.Popen[str]]) -> None:
        self.servers = servers
        self.spent: dict[str, float] = {}

    @staticmethod
    def _own() -> tuple[float, float]:
        own, kids = (resource.getrusage(who) for who in
                     (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))  # fmt: skip
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime

    def __enter__(self) -> CpuMeter:
        self._start = {n: cpu_s(p.pid) for n, p in self.servers.items() if p.poll() is None}
        self._own_start = self._own()
        return self

    def __exit__(self, *_: object) -> None:
        own, kids = self._own()
        self.spent = {"bench": own - self._own_start[0]}
        reaped = kids - self._own_start[1]  # stage processes, or a server killed and reaped
        for name, start in self._start.items():
            process = self.servers[name]
            if process.poll() is None:
                self.spent[name] = cpu_s(process.pid) - start
            else:  # SIGKILLed in this run: what it spent since its start (imports included)
                self.spent[f"{name} (killed)"], reaped = reaped, 0.0
        if reaped:
            self.spent["stages"] = reaped

    def text(self) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in self.spent.items() if v >= 0.005)


def count_sink(url: str, topic: str) -> tuple[int, int]:
    """(distinct event ids, records) in the sink topic."""
    ids: set[int] = set()
    records = 0
    with Client(url) as client:
        cursor = 0
        while True:
            page = client.diff(topic, cursor, limit=10_000)
            records += len(page.records)
            ids.update(r.data["event_id"] for r in page.records)
            cursor = page.next_from_seq
            if page.caught_up:
                return len(ids), records


def anchor(sink: str, events: int) -> float:
    import msgspec

    topic = f"anchor.{uuid.uuid4().hex[:8]}"
    with Client(sink) as client:
        client.put_topic(topic, ConfigPatch(idempotency_window_ms=7 * 24 * 3_600_000))
        began = time.perf_counter()
        for lo in range(0, events, BATCH):
            records = []
            for n in range(lo, min(events, lo + BATCH)):
                (out,) = enrich(produce(n))
                records.append(RecordIn(msgspec.Raw(msgspec.json.encode(out)), id=f"p:{n}"))
            client.append(topic, records)
        took = time.perf_counter() - began
    assert count_sink(sink, topic) == (events, events)
    return took


def spec_of(root: Path, a: str, b: str, sink: str, events: int) -> tuple[dict[str, Any], str]:
    """The benchmark's pipeline (fresh handoff, edges and sink topic) and its sink topic."""
    topic = f"bench.{uuid.uuid4().hex[:8]}"
    run = uuid.uuid4().hex[:6]
    return {
        "pipeline": {"handoff": (root / f"handoff-{run}").as_uri()},
        "edge": [{"name": f"raw{run}", "candidates": [a, b]},
                 {"name": f"enr{run}", "candidates": [b, a]}],
        "stage": [
            {"name": "produce", "function": "waymark.pipeline.demo:produce", "events": events,
             "output": f"raw{run}", "batch": BATCH},
            {"name": "transform", "function": "waymark.pipeline.demo:enrich",
             "input": f"raw{run}", "output": f"enr{run}", "batch": BATCH},
            {"name": "sink", "function": SINK_FUNCTION, "input": f"enr{run}",
             "sink": {"url": sink, "topic": topic}, "batch": BATCH},
        ],
    }, topic  # fmt: skip


def pipeline(root: Path, a: str, b: str, sink: str, events: int,
             kill: subprocess.Popen[str] | None) -> tuple[float, dict[str, float]]:  # fmt: skip
    raw, topic = spec_of(root, a, b, sink, events)
    spec = PipelineSpec.parse(raw)
    # The runner's default report interval; the failover run reports more often, so
    # that the kill lands near a third of the events.
    runner = PipelineRunner(spec, report_interval_s=0.5 if kill is None else 0.1)
    began = time.perf_counter()
    runner.start()
    if kill is not None:
        while runner.runs["sink"].report.processed < events // 3:
            time.sleep(0.01)
        kill.send_signal(signal.SIGKILL)
        kill.wait()
    assert runner.wait(600), "the pipeline did not finish"
    took = time.perf_counter() - began
    runner.stop()
    assert count_sink(sink, topic) == (events, events), "not exactly once"
    reports = [r.report for r in runner.runs.values()]
    return took, {
        "relocations": sum(r.relocations for r in reports),
        "recover_s": max((max(r.recover_s, default=0) for r in reports), default=0),
        "replayed": sum(r.replayed for r in reports),
    }


def toml(raw: dict[str, Any]) -> str:
    """The benchmark's spec as a pipeline file (strings, numbers and one inline table)."""

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    lines = ["[pipeline]", *(f"{k} = {value(v)}" for k, v in raw["pipeline"].items())]
    for table in ("edge", "stage"):
        for entry in raw[table]:
            lines += ["", f"[[{table}]]", *(f"{k} = {value(v)}" for k, v in entry.items())]
    return "\n".join(lines) + "\n"


def processes(root: Path, a: str, b: str, sink: str, events: int) -> tuple[float, float]:
    """(seconds from the source's first report to the sink's "done", seconds from the
    source's process start to its first report)."""
    raw, topic = spec_of(root, a, b, sink, events)
    path = root / f"{topic}.toml"
    path.write_text(toml(raw))
    store = open_store(raw["pipeline"]["handoff"])
    exe = str(Path(sys.executable).parent / "waymark")

    def run(stage: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([exe, "pipeline", "run", str(path), "--stage", stage],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def report(stage: str, deadline: float) -> StageReport:
        while (found := load_report(store, stage)) is None:
            assert time.monotonic() < deadline, f"stage {stage} did not start"
            time.sleep(0.01)
        return found

    # the consumers first, up and waiting, so that the source's first report starts
    # the clock on a pipeline whose every stage runs
    procs = {stage: run(stage) for stage in ("transform", "sink")}
    deadline = time.monotonic() + 300
    for stage in procs:
        report(stage, deadline)
    started_ms = time.time_ns() // 1_000_000
    procs["produce"] = run("produce")
    first = report("produce", deadline)
    for stage, process in procs.items():
        assert process.wait(600) == 0, f"stage {stage} failed"
    last = load_report(store, "sink")
    assert last is not None and last.done
    assert count_sink(sink, topic) == (events, events), "not exactly once"
    return (last.updated_ms - first.updated_ms) / 1000, (first.updated_ms - started_ms) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument(
        "--per-event-sink",
        action="store_true",
        help="the sink stage's function event by event (demo:deliver_each)",
    )
    args = parser.parse_args()
    events = args.events
    if args.per_event_sink:
        global SINK_FUNCTION
        SINK_FUNCTION = "waymark.pipeline.demo:deliver_each"
    console = Console(width=140)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        procs = {name: start(root / name) for name in ("a", "b", "c", "sink")}
        try:
            a, b, c, sink = (procs[n][1] for n in ("a", "b", "c", "sink"))
            servers = {name: process for name, (process, _) in procs.items()}
            meters = [CpuMeter(servers) for _ in range(4)]
            # the checks after each run (reading the sink back) are inside its meter
            with meters[0]:
                t_anchor = anchor(sink, events)
            with meters[1]:
                t_plain, _ = pipeline(root, a, b, sink, events, None)
            with meters[2]:
                t_fail, stats = pipeline(root, c, b, sink, events, procs["c"][0])
            with meters[3]:
                t_procs, t_start = processes(root, a, b, sink, events)
        finally:
            for process, _ in procs.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()
    table = Table(title=f"{events:,} events, batches of {BATCH}, sink {SINK_FUNCTION}, "
                  f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    for column in ("run", "seconds", "events/s", "vs anchor", "relocations",
                   "time to recover", "replayed"):  # fmt: skip
        table.add_column(column, justify="left" if column == "run" else "right")
    rows = [("anchor: client -> sink", t_anchor, None),
            ("pipeline: 2 edges", t_plain, None),
            ("pipeline: 2 edges, edge server SIGKILLed", t_fail, stats),
            ("pipeline: 2 edges, one process per stage", t_procs, None)]  # fmt: skip
    for name, took, extra in rows:
        table.add_row(name, f"{took:.2f}", f"{events / took:,.0f}", f"{t_anchor / took:.2f}x",
                      str(int(extra["relocations"])) if extra else "-",
                      f"{extra['recover_s']:.2f} s" if extra else "-",
                      f"{int(extra['replayed']):,}" if extra else "-")  # fmt: skip
    console.print(table)
    cpu = Table(title="CPU seconds per process in each run (the checks after it included): "
                "bench this process, a b c the edge servers, sink the sink server, stages "
                "the stage processes (their start-up, about 1 s each, included)")  # fmt: skip
    cpu.add_column("run")
    cpu.add_column("CPU s")
    for (name, _, _), meter in zip(rows, meters, strict=True):
        cpu.add_row(name, meter.text())
    console.print(cpu)
    console.print(f"one process per stage: the source's process took {t_start:.2f} s from "
                  "its start to its first report (left out above)")  # fmt: skip


if __name__ == "__main__":
    main()
