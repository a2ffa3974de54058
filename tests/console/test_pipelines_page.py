"""The Pipelines page in a real headless Chromium (docs/console.md): a real
``waymark pipeline run --report-to`` process moves 3,000 events through an edge whose
server is SIGKILLed mid-run into a stage with two instances; the page draws the
topology, each edge's generation and lag, who holds each shard and the move, from
the same status ``waymark pipeline status --json`` prints, and each edge's lag over the
reports the server kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from tests.conftest import ServerProcess

from waymark.client import Client

from .test_browser import WAYMARK, fresh, open_page

Shot = Callable[[Page, str], Path]
pytestmark = pytest.mark.timeout(120)
EVENTS = 3000


def test_the_pipelines_page_draws_a_pipeline_run_and_its_relocation(
    page: Page, server: ServerProcess, start_waymark: Callable[..., ServerProcess],
    tmp_path: Path, shot: Shot,
) -> None:  # fmt: skip
    edge_server = start_waymark()
    name, sink = fresh("clicks"), fresh("clicks-out")
    # The source holds event EVENTS // 2 until the edge's server is killed, so a part
    # always has events to write after the kill and moves (a source left to run could be
    # done and acknowledged by the time the kill landed on a loaded machine: no move).
    killed = tmp_path / "killed"
    (tmp_path / "gated.py").write_text(f"""
import time
from pathlib import Path
from waymark.pipeline import demo


def produce(n):
    while n >= {EVENTS // 2} and not Path({str(killed)!r}).exists():
        time.sleep(0.01)
    return demo.produce(n)
""")
    spec = tmp_path / "clicks.toml"
    spec.write_text(f"""
[pipeline]
name = "{name}"
handoff = "{(tmp_path / "handoff").as_uri()}"
report_every_s = 0.5

[[edge]]
name = "raw"
candidates = ["{edge_server.url}", "{server.url}"]

[[stage]]
name = "produce"
function = "gated:produce"
events = {EVENTS}
batch = 100
output = "raw"

[[stage]]
name = "deliver"
function = "waymark.pipeline.demo:deliver"
input = "raw"
instances = 2
batch = 50
sink = {{ url = "{server.url}", topic = "{sink}" }}
""")
    open_page(page, server, "pipelines")
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        run = subprocess.Popen([WAYMARK, "pipeline", "run", str(spec), "--report-to", server.url],
                               stdout=out, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    section = page.locator(f"[data-testid=pipeline][data-pipeline='{name}']")
    try:
        deadline = time.monotonic() + 60
        with Client(server.url) as client:
            while True:  # under load: a quarter of the events through
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                try:
                    if client.get_topic(sink).head_seq >= EVENTS // 4:
                        break
                except Exception:
                    pass
                time.sleep(0.02)
        edge_server.stop(signal.SIGKILL)
        killed.touch()
        expect(section.get_by_test_id("pipeline-graph")).to_be_visible(timeout=20_000)
        assert run.wait(90) == 0, log.read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    status = json.loads(subprocess.run(
        [WAYMARK, "pipeline", "status", str(spec), "--json"], capture_output=True, text=True,
        check=True,
    ).stdout)  # fmt: skip
    # The graph: both stages and the sink, the edge with the generations it has now.
    graph = section.get_by_test_id("pipeline-graph")
    expect(graph.locator("[data-testid=pipeline-node][data-stage='produce']")).to_contain_text(
        f"source of {EVENTS:,}"
    )
    deliver = graph.locator("[data-testid=pipeline-node][data-stage='deliver']")
    expect(deliver).to_contain_text("2 instances")
    expect(deliver).to_contain_text("done", timeout=10_000)
    expect(section.get_by_test_id("pipeline-done")).to_have_text("done (no longer reporting)")
    generations = sorted({e["generation"] for e in status["edges"].values()})
    assert generations[-1] >= 2, status["edges"]  # a part moved
    label = graph.locator("[data-testid=pipeline-edge][data-edge='raw']")
    expect(label.get_by_test_id("pipeline-edge-label")).to_have_text(
        f"gen {'/'.join(map(str, generations))} · lag 0"
    )
    expect(graph.get_by_test_id("pipeline-sink")).to_contain_text(sink)
    # Per placed edge: the generation and server status --json says.
    for placed, edge in status["edges"].items():
        row = section.locator(f"[data-testid=pipeline-edge-row][data-edge='{placed}']")
        expect(row.get_by_test_id("edge-generation")).to_have_text(str(edge["generation"]))
        expect(row).to_contain_text(edge["server"])
    # Who holds each shard, and the move over time.
    for shard, held in status["shards"].items():
        row = section.locator(f"[data-testid=pipeline-stage-row][data-stage='{shard}']")
        expect(row.get_by_test_id("shard-holder")).to_have_text(
            f"{held['owner']} (epoch {held['epoch']})"
        )
    moved = section.locator("[data-testid=placement][data-generation='2']")
    expect(moved.first).to_contain_text(server.url)
    expect(moved.first).to_contain_text("relocated")
    first = section.locator("[data-testid=placement][data-generation='1']")
    expect(first.first).to_contain_text(edge_server.url)
    # Each placed edge's lag over the reports the server kept (docs/console.md): one
    # chart per part, as many points as reports that gave the part a lag.
    with Client(server.url) as client:
        (kept,) = [p for p in client.list_pipelines() if p.report.pipeline == name]
    assert kept.lag_history, kept  # a quick run may send only its final report
    for placed in status["edges"]:
        lags = [s.lags[placed] for s in kept.lag_history if s.lags.get(placed) is not None]
        drawn = section.locator(f"[data-testid=edge-lag-chart][data-edge='{placed}']")
        expect(drawn).to_have_attribute("data-samples", str(len(lags)))
        expect(drawn).to_contain_text(f"{placed} lag")
    shot(page, "pipelines")
