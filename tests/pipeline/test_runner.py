"""The runner's restarts wait on the injected clock: a stage that cannot reach its
edge restarts from its checkpoint after ``restart_delay_s``, and a test sees every
wait without sleeping (docs/pipeline.md, "Running it")."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from waymark.clock import ManualClock
from waymark.pipeline.runner import PipelineRunner
from waymark.pipeline.spec import PipelineSpec


def _dead_url() -> str:
    """A local port nothing listens on: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_stage_that_cannot_place_its_edge_restarts_after_the_injected_wait(
    tmp_path: Path,
) -> None:
    spec = PipelineSpec.parse({
        "pipeline": {"handoff": tmp_path.as_uri()},
        "edge": [{"name": "raw", "candidates": [_dead_url()]}],
        "stage": [
            {"name": "produce", "function": "waymark.pipeline.demo:produce", "events": 5,
             "output": "raw"},
            {"name": "sink", "function": "waymark.pipeline.demo:deliver", "input": "raw",
             "sink": {"url": _dead_url(), "topic": "out"}},
        ],
    })  # fmt: skip
    clock = ManualClock()
    waits: list[float] = []
    three = threading.Event()
    runner: PipelineRunner

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(int(seconds * 1000))
        if len(waits) == 3:
            runner.stop()
            three.set()

    runner = PipelineRunner(spec, ["produce"], clock=clock, restart_delay_s=2.5, sleep=sleep)
    threads = runner.start()
    assert three.wait(30), "the stage did not restart three times"
    for thread in threads:
        thread.join(10)
    assert waits == [2.5, 2.5, 2.5]
    assert runner.runs["produce"].report.restarts == 3
    assert clock.now_ms() == 1_700_000_000_000 + 7_500  # time moved only by the waits


def test_by_default_a_restart_wait_ends_when_the_runner_stops(tmp_path: Path) -> None:
    spec = PipelineSpec.parse({
        "pipeline": {"handoff": tmp_path.as_uri()},
        "edge": [{"name": "raw", "candidates": [_dead_url()]}],
        "stage": [
            {"name": "produce", "function": "waymark.pipeline.demo:produce", "events": 5,
             "output": "raw"},
            {"name": "sink", "function": "waymark.pipeline.demo:deliver", "input": "raw",
             "sink": {"url": _dead_url(), "topic": "out"}},
        ],
    })  # fmt: skip
    runner = PipelineRunner(spec, ["produce"], restart_delay_s=3600)
    threads = runner.start()
    for _ in range(3000):  # the stage is in its hour-long wait once restarts is 1
        if runner.runs["produce"].report.restarts:
            break
        threading.Event().wait(0.01)
    assert runner.runs["produce"].report.restarts == 1
    runner.stop()  # interrupts the wait
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()


def test_an_external_stage_is_a_consumer_the_runner_does_not_run(tmp_path: Path) -> None:
    import pytest

    from waymark.pipeline.spec import SpecError

    doc = {
        "pipeline": {"handoff": tmp_path.as_uri()},
        "edge": [{"name": "raw", "candidates": [_dead_url()]}],
        "stage": [
            {"name": "produce", "function": "waymark.pipeline.demo:produce", "events": 5,
             "output": "raw"},
            {"name": "enrich", "input": "raw", "external": True},
        ],
    }  # fmt: skip
    spec = PipelineSpec.parse(doc)
    assert spec.consumers == {"raw": "enrich"}  # the producers wait for its acknowledgements
    assert list(PipelineRunner(spec).runs) == ["produce"]
    with pytest.raises(KeyError, match="external"):
        PipelineRunner(spec, ["enrich"])
    for bad in ({"output": "raw"}, {"events": 3}, {"input": None}):
        stage = {**doc["stage"][1], **bad}  # type: ignore[dict-item]
        with pytest.raises(SpecError, match="external stage has input = EDGE only"):
            PipelineSpec.parse({**doc, "stage": [doc["stage"][0], stage]})
