"""Real processes: every stage is a ``waymark pipeline run --stage`` process; the
server under the first edge is SIGKILLed under load, and so is the transform
stage (then started again); the sink must hold every event exactly once
(docs/semantics/pipeline.md §6)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import ServerProcess

from waymark.client import ApiError, Client
from waymark.protocol import ErrorCode

EVENTS = 4000
WAYMARK = str(Path(sys.executable).parent / "waymark")


def sink_events(url: str, topic: str) -> Counter[int]:
    """How many times each event id is in the sink topic (also the Spark stage test's check)."""
    seen: Counter[int] = Counter()
    with Client(url) as client:
        cursor = 0
        while True:
            try:
                page = client.diff(topic, cursor, limit=10_000)
            except ApiError as exc:  # no sink write yet: nothing seen (a wait polls this)
                if exc.code != ErrorCode.TOPIC_NOT_FOUND:
                    raise
                return seen
            seen.update(r.data["event_id"] for r in page.records)
            cursor = page.next_from_seq
            if page.caught_up:
                return seen


def stage(spec: Path, name: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([WAYMARK, "pipeline", "run", str(spec), "--stage", name],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip


@pytest.mark.slow
def test_sigkill_of_the_edge_server_and_of_a_stage_loses_and_duplicates_nothing(
    tmp_path: Path, start_waymark: Callable[..., ServerProcess]
) -> None:
    a, b, sink = start_waymark(), start_waymark(), start_waymark()
    spec = tmp_path / "pipeline.toml"
    spec.write_text(f"""
[pipeline]
name = "kill"
handoff = "{(tmp_path / "handoff").as_uri()}"

[[edge]]
name = "raw"
candidates = ["{a.url}", "{b.url}"]

[[edge]]
name = "enriched"
candidates = ["{b.url}", "{a.url}"]

[[stage]]
name = "produce"
function = "waymark.pipeline.demo:produce"
events = {EVENTS}
batch = 200
output = "raw"

[[stage]]
name = "transform"
function = "waymark.pipeline.demo:enrich"
input = "raw"
output = "enriched"
batch = 200

[[stage]]
name = "sink"
function = "waymark.pipeline.demo:deliver"
input = "enriched"
sink = {{ url = "{sink.url}", topic = "out" }}
""")
    log = tmp_path / "stages.log"
    procs = {name: stage(spec, name, log) for name in ("produce", "transform", "sink")}
    try:
        deadline = time.monotonic() + 60
        with Client(sink.url) as client:
            while True:  # under load: a quarter of the events through
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                try:
                    if client.get_topic("out").head_seq >= EVENTS // 4:
                        break
                except Exception:
                    pass
                time.sleep(0.02)
        a.stop(signal.SIGKILL)
        procs["transform"].send_signal(signal.SIGKILL)
        procs["transform"].wait()
        procs["transform"] = stage(spec, "transform", log)
        for name, proc in procs.items():
            assert proc.wait(120) == 0, f"{name}: {log.read_text()[-3000:]}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    seen = sink_events(sink.url, "out")
    assert sorted(seen) == list(range(EVENTS)), "events lost"
    assert max(seen.values()) == 1, "events duplicated"
    status = subprocess.run(
        [WAYMARK, "pipeline", "status", str(spec)],
        capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    lines = status.stdout.splitlines()
    raw = next(line for line in lines if line.lstrip("│ ").startswith("raw"))
    assert b.url in raw and " 2 " in raw, status.stdout  # moved once, to the live server
