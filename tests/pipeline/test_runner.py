"""The runner's restart policy on the injected clock: a stage that cannot reach its
edge restarts from its checkpoint after exponential backoff with jitter, until the
failure-rate limit stops the pipeline; a test sees every wait without sleeping
(docs/semantics/pipeline.md §9.1)."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from tests.conftest import ServerProcess

from waymark.clock import ManualClock
from waymark.objstore import open_store
from waymark.pipeline import StageStateStore
from waymark.pipeline.report import load_report
from waymark.pipeline.restart import RestartPolicy, Restarts
from waymark.pipeline.runner import PipelineRunner
from waymark.pipeline.spec import PipelineSpec


def _dead_url() -> str:
    """A local port nothing listens on: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _dead_edge_spec(tmp_path: Path) -> PipelineSpec:
    return PipelineSpec.parse({
        "pipeline": {"handoff": tmp_path.as_uri()},
        "edge": [{"name": "raw", "candidates": [_dead_url()]}],
        "stage": [
            {"name": "produce", "function": "waymark.pipeline.demo:produce", "events": 5,
             "output": "raw"},
            {"name": "sink", "function": "waymark.pipeline.demo:deliver", "input": "raw",
             "sink": {"url": _dead_url(), "topic": "out"}},
        ],
    })  # fmt: skip


def test_restarts_back_off_with_jitter_then_the_failure_rate_limit_stops_the_pipeline(
    tmp_path: Path,
) -> None:
    # docs/semantics/pipeline.md §9.1: waits double from delay_s up to max_delay_s, each
    # between half and all of that; the fifth failure within the window stops it all.
    clock = ManualClock()
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(int(seconds * 1000))

    policy = RestartPolicy(delay_s=1.0, max_delay_s=4.0, max_restarts=4, window_s=60)
    runner = PipelineRunner(_dead_edge_spec(tmp_path), ["produce"], clock=clock, restart=policy,
                            sleep=sleep, rng=random.Random(7))  # fmt: skip
    threads = runner.start()
    assert not runner.wait(30)  # it returns once the stage failed for good
    failure = runner.failure()
    assert failure is not None and failure.startswith(
        "stage 'produce' failed more than 4 times within 60 s; last error: EdgeUnavailable: "
        "edge 'raw': no healthy candidate"
    ), failure
    for thread in threads:
        thread.join(10)
    assert len(waits) == 4 and len(set(waits)) == 4  # jittered
    for attempt, wait in enumerate(waits, 1):
        ceiling = min(4.0, 2.0 ** (attempt - 1))
        assert ceiling / 2 <= wait <= ceiling
    report = load_report(runner.store, "produce")
    assert report is not None and report.restarts == 4
    assert report.last_error.startswith("EdgeUnavailable: edge 'raw'")
    assert clock.now_ms() == 1_700_000_000_000 + sum(int(w * 1000) for w in waits)


def test_failures_further_apart_than_the_window_never_stop_the_pipeline(tmp_path: Path) -> None:
    clock = ManualClock()
    waits: list[float] = []
    runner: PipelineRunner

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(int(seconds * 1000))
        if len(waits) == 6:
            runner.stop()

    # one restart per window at most, and every wait is at least the window
    policy = RestartPolicy(delay_s=2.0, max_delay_s=2.0, max_restarts=1, window_s=1.0)
    runner = PipelineRunner(_dead_edge_spec(tmp_path), ["produce"], clock=clock, restart=policy,
                            sleep=sleep)  # fmt: skip
    for thread in runner.start():
        thread.join(30)
    assert len(waits) == 6 and runner.failure() is None


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
    runner = PipelineRunner(spec, ["produce"], restart=RestartPolicy(3600, 3600))
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


MODEL = settings(max_examples=200, deadline=None, derandomize=True, database=None)
# a mutant is caught once a failing example is found: no shrinking
MUTANT = settings(MODEL, phases=[Phase.generate])
failures_and_successes = (
    st.lists(st.tuples(st.integers(0, 3000), st.booleans()), max_size=30),
    st.integers(0, 5),
    st.integers(1, 5000),
)


def check_restarts(steps: list[tuple[int, bool]], max_restarts: int, window_ms: int) -> None:
    """docs/semantics/pipeline.md §9.1 as a model: a failure is refused once more than
    max_restarts fall within the window; otherwise its wait is jittered within the
    doubling ceiling of the failures since the last successful step."""
    policy = RestartPolicy(delay_s=0.1, max_delay_s=1.0, max_restarts=max_restarts,
                           window_s=window_ms / 1000)  # fmt: skip
    restarts = Restarts(policy, random.Random(0))
    now, failures, consecutive = 0, [], 0
    for gap, succeeded in steps:
        now += gap
        if succeeded:
            restarts.succeeded()
            consecutive = 0
            continue
        failures.append(now)
        wait = restarts.failed(now)
        if sum(1 for t in failures if now - t < window_ms) > max_restarts:
            assert wait is None
            return  # the pipeline stops
        consecutive += 1
        ceiling = min(1.0, 0.1 * 2 ** (consecutive - 1))
        assert wait is not None and ceiling / 2 <= wait <= ceiling


@MODEL
@given(*failures_and_successes)
def test_restarts_follow_the_model_of_backoff_and_failure_rate(
    steps: list[tuple[int, bool]], max_restarts: int, window_ms: int
) -> None:
    check_restarts(steps, max_restarts, window_ms)


# --- mutants: each guard broken, the model fails --------------------------------------
@MUTANT
@given(*failures_and_successes)
def under_mutant(steps: list[tuple[int, bool]], max_restarts: int, window_ms: int) -> None:
    check_restarts(steps, max_restarts, window_ms)


def test_a_backoff_that_never_resets_after_a_success_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Restarts, "succeeded", lambda self: None)
    with pytest.raises(AssertionError):
        under_mutant()


def test_a_failure_window_that_never_slides_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = Restarts.failed
    monkeypatch.setattr(Restarts, "failed", lambda self, now_ms: failed(self, 0))
    with pytest.raises(AssertionError):
        under_mutant()


def test_a_stages_counters_go_on_across_runner_processes(tmp_path: Path) -> None:
    # A restarted `--stage` process (here: a second runner on the same store) goes on
    # from the stage's last report instead of resetting its counters.
    policy = RestartPolicy(delay_s=0.01, max_delay_s=0.01, max_restarts=2, window_s=60)
    for restarts in (2, 4):
        runner = PipelineRunner(_dead_edge_spec(tmp_path), ["produce"], restart=policy,
                                sleep=lambda s: None)  # fmt: skip
        for thread in runner.start():
            thread.join(30)
        report = load_report(runner.store, "produce")
        assert report is not None and report.restarts == restarts and not report.done


def test_a_superseded_stage_stops_its_runner(tmp_path: Path, waymark_server: ServerProcess) -> None:
    # Another instance claimed the stage (docs/semantics/pipeline.md §4.4): this one
    # ends, and with it the runner (a `--stage` process exits 1), instead of running on.
    spec = PipelineSpec.parse({
        "pipeline": {"handoff": tmp_path.as_uri(), "name": "fenced"},
        "edge": [{"name": "raw", "candidates": [waymark_server.url]}],
        "stage": [
            {"name": "produce", "function": "waymark.pipeline.demo:produce",
             "events": 10**9, "batch": 100, "output": "raw"},
            {"name": "sink", "function": "waymark.pipeline.demo:deliver", "input": "raw",
             "sink": {"url": waymark_server.url, "topic": "fenced-out"}},
        ],
    })  # fmt: skip
    runner = PipelineRunner(spec, ["produce"])
    threads = runner.start()
    states = StageStateStore(open_store(tmp_path.as_uri()))
    for _ in range(3000):  # until the stage has claimed its state
        if (state := states.load("produce")) is not None:
            break
        threading.Event().wait(0.01)
    assert state is not None
    states.claim(state, "produce/another-instance")
    assert not runner.wait(30)
    failure = runner.failure()
    assert failure is not None and failure.startswith("stage 'produce' is superseded"), failure
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()


def test_the_latency_histogram_counts_a_batch_as_one_observe_per_latency_would() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest
    from prometheus_client.registry import Collector

    from waymark.pipeline.runner import LATENCY_BUCKETS_S, LatencyHistogram

    latencies_ms = [0, 1, 5, 6, 10, 11, 250, 251, 30_000, 30_001, 99_999]
    ours = LatencyHistogram()
    ours.observe_ms("before", latencies_ms[:4])
    ours.observe_ms("before", latencies_ms[4:])

    class Ours(Collector):
        def collect(self) -> Any:
            yield ours.family()

    mine, reference = CollectorRegistry(), CollectorRegistry()
    mine.register(Ours())
    theirs = Histogram("waymark_pipeline_latency_seconds",
                       "End-to-end latency at the sink, before and after the first failover.",
                       ["phase"], buckets=LATENCY_BUCKETS_S, registry=reference)  # fmt: skip
    for ms in latencies_ms:
        theirs.labels("before").observe(ms / 1000)
    expected = [line for line in generate_latest(reference).decode().splitlines()
                if "_created" not in line]  # fmt: skip
    assert generate_latest(mine).decode().splitlines() == expected


def test_an_idle_stage_waits_a_quarter_of_the_time_it_has_been_idle_within_bounds() -> None:
    # docs/pipeline.md, "Running it": soon after work a stage looks again every 10 ms, so
    # the end of a run is seen hop by hop within a quarter of the time it took; a stage
    # idle for long asks at most ten times a second
    from waymark.pipeline.runner import idle_wait_ms

    waits = [idle_wait_ms(ms) for ms in range(0, 2_000, 5)]
    assert waits[0] == idle_wait_ms(40) == 10 and idle_wait_ms(200) == 50
    assert waits == sorted(waits) and max(waits) == idle_wait_ms(10**9) == 100


def test_a_save_landing_is_told_to_the_runner_and_a_failed_one_is_not() -> None:
    # docs/pipeline.md, "Flow control": the write-behind's save thread calls its hook
    # after each save that landed; the runner wakes the stages waiting for
    # acknowledgements on it
    from waymark.pipeline.behind import Behind

    landed = threading.Semaphore(0)
    behind = Behind("test", landed.release)
    done: list[int] = []
    behind.submit(lambda: behind.checkpoint(lambda: done.append(1)))
    behind.flush()
    assert done == [1] and landed.acquire(timeout=10)

    def failing() -> None:
        raise OSError("disk full")

    behind.submit(lambda: behind.checkpoint(failing))
    with pytest.raises(OSError, match="disk full"):
        behind.flush()
    assert not landed.acquire(blocking=False)
    behind.close()


def test_a_stage_waiting_for_acknowledgements_wakes_on_a_save_and_misses_none(
    tmp_path: Path,
) -> None:
    # A held-back or finished source waits for its consumer's save, not for a step of
    # any stage (which made it step idle thousands of times a run); a save that landed
    # after it looked (counted before its step) ends the wait at once.
    runner = PipelineRunner(_dead_edge_spec(tmp_path))
    seen = runner._saves  # noqa: SLF001 -- what a stage counts before its step
    waited = threading.Event()

    def wait() -> None:
        runner._wait_for_save(seen, 60)  # noqa: SLF001
        waited.set()

    threading.Thread(target=wait, daemon=True).start()
    runner._saved()  # noqa: SLF001 -- a save landing (before or during the wait)
    assert waited.wait(10)
    waited.clear()
    threading.Thread(target=wait, daemon=True).start()  # a save landed since it looked
    assert waited.wait(10)
