"""Failing stages through ``waymark pipeline run`` (docs/semantics/pipeline.md §9): a
poison event goes to the dead-letter topic after ``max_attempts`` and the rest of the
pipeline finishes; without a dead-letter topic the pipeline stops, exit status 1,
naming the stage, the event and the error. The restart policy itself is
tests/pipeline/test_runner.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

from tests.conftest import ServerProcess
from tests.pipeline.test_processes import sink_events

from waymark.client import Client

WAYMARK = str(Path(sys.executable).parent / "waymark")
EVENTS = 20

STAGES = """
def enrich(event):
    if event["event_id"] == 7:
        raise ValueError("poison 7")
    return [event]
"""


def spec(root: Path, url: str, sink_topic: str, dead_letter: str | None) -> Path:
    """produce -> raw -> transform (fails on event 7) -> enriched -> sink, its function
    in a module next to the pipeline file."""
    (root / "poison_stages.py").write_text(STAGES)
    dead = f'\n[pipeline.dead_letter]\nurl = "{url}"\ntopic = "{dead_letter}"\n'
    path = root / "poison.toml"
    path.write_text(f"""
[pipeline]
name = "poison"
handoff = "{(root / "handoff").as_uri()}"
servers = ["{url}"]

[pipeline.restart]
delay_s = 0.01
max_delay_s = 0.05
max_attempts = 2
{dead if dead_letter else ""}
[[edge]]
name = "raw"

[[edge]]
name = "enriched"

[[stage]]
name = "produce"
function = "waymark.pipeline.demo:produce"
events = {EVENTS}
output = "raw"

[[stage]]
name = "transform"
function = "poison_stages:enrich"
input = "raw"
output = "enriched"

[[stage]]
name = "sink"
function = "waymark.pipeline.demo:deliver"
input = "enriched"
sink = {{ url = "{url}", topic = "{sink_topic}" }}
""")
    return path


def run(path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([WAYMARK, "pipeline", "run", str(path), "--timeout-s", "60"],
                          capture_output=True, text=True, timeout=120, cwd="/",
                          env={**env, "COLUMNS": "250"})  # fmt: skip


def test_a_poison_event_goes_to_the_dead_letter_topic_and_the_rest_is_delivered(
    tmp_path: Path, waymark_server: ServerProcess
) -> None:
    url, tag = waymark_server.url, uuid.uuid4().hex[:8]
    done = run(spec(tmp_path, url, f"out-{tag}", f"dead-{tag}"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sink_events(url, f"out-{tag}") == Counter(n for n in range(EVENTS) if n != 7)
    with Client(url) as client:
        (dead,) = client.diff(f"dead-{tag}", 0).records
    assert dead.data["event_id"] == 7
    assert dead.meta is not None
    assert dead.meta["wm.stage"] == "transform" and dead.meta["wm.attempts"] == "2"
    assert dead.meta["wm.error"] == "ValueError: poison 7"
    assert dead.meta["wm.event"].endswith("/produce:7")
    status = json.loads(subprocess.run(
        [WAYMARK, "pipeline", "status", str(tmp_path / "poison.toml"), "--json"],
        capture_output=True, text=True, timeout=60, check=True).stdout)  # fmt: skip
    assert status["stages"]["transform"]["dead_lettered"] == 1
    assert {e: (s["generation"], s["lag"]) for e, s in status["edges"].items()} == {
        "raw": (1, 0), "enriched": (1, 0)}  # fmt: skip


def test_without_a_dead_letter_topic_a_poison_event_stops_the_pipeline_naming_it(
    tmp_path: Path, waymark_server: ServerProcess
) -> None:
    url, tag = waymark_server.url, uuid.uuid4().hex[:8]
    done = run(spec(tmp_path, url, f"out-{tag}", None))
    assert done.returncode == 1, done.stderr[-3000:]
    message = " ".join(done.stderr.split())  # rich wraps long lines
    assert "pipeline poison stopped: stage 'transform': its function failed on event" in message
    assert "/produce:7" in message and "ValueError: poison 7" in message, message
    assert "it failed 2 times and the pipeline has no dead_letter topic" in message, message
    status = json.loads(subprocess.run(
        [WAYMARK, "pipeline", "status", str(tmp_path / "poison.toml"), "--json"],
        capture_output=True, text=True, timeout=60, check=True).stdout)  # fmt: skip
    # the transform acknowledged none: the lag counts items (events), as Kafka's
    # consumer lag counts records; the 20 are in one pack (docs/pipeline.md, "Running it")
    assert (status["edges"]["raw"]["lag"], status["edges"]["raw"]["lag_packs"]) == (20, 1)
    assert status["stages"]["transform"]["last_error"].endswith("ValueError: poison 7")
