"""Pipeline identity (docs/semantics/pipeline.md §8).

Through the CLI, as a user runs it: a rerun with a fresh handoff store delivers every
event again, two pipelines with the same edge names on the same servers each deliver
exactly their own events, and a server refuses a second owner of an edge topic.

Then a hypothesis state machine against the production code and real servers
(docs/semantics/pipeline.md §6.4): runs of two pipelines, ``alpha`` and ``beta``, with
the same edge and stage names on the same servers and one shared sink topic; reruns
with fresh handoff stores, stages crashing and resuming, servers dying (the edge
relocates) and coming back; against a model of the sink: each run's events exactly
once, nothing else. The mutation tests break one part of the scope each and require
the machine to fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)
from tests.conftest import ServerProcess
from tests.pipeline.conftest import Fleet, StoreFaults
from tests.pipeline.test_processes import sink_events

from waymark.client import ApiError, Client, ConfigPatch, ErrorCode
from waymark.clock import ManualClock
from waymark.objstore import ObjectStore, ObjectStoreError, open_store
from waymark.pipeline import (
    EdgeUnavailable,
    RelocatableQueueEdge,
    Sink,
    Stage,
    StageStateStore,
    client_factory,
)
from waymark.pipeline.identity import PipelineIdentity, establish
from waymark.pipeline.patience import PatientStore

WAYMARK = str(Path(sys.executable).parent / "waymark")


def write_spec(
    root: Path, fleet: Fleet, tag: str, *, name: str, sink_topic: str, events: int
) -> Path:
    """The docs' three-stage pipeline: produce -> raw -> transform -> enriched -> sink,
    in ``root/<tag>.toml`` with its handoff store in ``root/handoff-<tag>``."""
    path, handoff = root / f"{tag}.toml", root / f"handoff-{tag}"
    a, b = fleet.urls[:2]
    path.write_text(f"""
[pipeline]
name = "{name}"
handoff = "{handoff.as_uri()}"
servers = ["{a}", "{b}"]

[[edge]]
name = "raw"

[[edge]]
name = "enriched"
candidates = ["{b}", "{a}"]

[[stage]]
name = "produce"
function = "waymark.pipeline.demo:produce"
events = {events}
output = "raw"

[[stage]]
name = "transform"
function = "waymark.pipeline.demo:enrich"
input = "raw"
output = "enriched"

[[stage]]
name = "sink"
function = "waymark.pipeline.demo:deliver"
input = "enriched"
sink = {{ url = "{fleet.sink.url}", topic = "{sink_topic}" }}
""")
    return path


def run(spec: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [WAYMARK, "pipeline", "run", str(spec), "--timeout-s", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
    )  # fmt: skip


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    return out


def exactly(events: int) -> Counter[int]:
    return Counter(range(events))


def test_a_rerun_with_a_fresh_handoff_store_delivers_every_event(
    tmp_path: Path, fleet: Fleet
) -> None:
    first = write_spec(tmp_path, fleet, "1", name="clicks", sink_topic="rerun-1", events=1000)
    finish(run(first))
    assert sink_events(fleet.sink.url, "rerun-1") == exactly(1000)
    # The same spec, only the handoff store and the sink topic changed.
    second = write_spec(tmp_path, fleet, "2", name="clicks", sink_topic="rerun-2", events=1000)
    finish(run(second))
    assert sink_events(fleet.sink.url, "rerun-2") == exactly(1000)


def test_two_pipelines_sharing_edge_names_and_servers_each_get_their_own_events(
    tmp_path: Path, fleet: Fleet
) -> None:
    alpha = write_spec(tmp_path, fleet, "a", name="alpha", sink_topic="alpha-out", events=300)
    beta = write_spec(tmp_path, fleet, "b", name="beta", sink_topic="beta-out", events=500)
    procs = [run(alpha), run(beta)]
    for proc in procs:
        finish(proc)
    assert sink_events(fleet.sink.url, "alpha-out") == exactly(300)
    assert sink_events(fleet.sink.url, "beta-out") == exactly(500)


def test_a_handoff_store_of_another_pipeline_is_refused(tmp_path: Path, fleet: Fleet) -> None:
    alpha = write_spec(tmp_path, fleet, "a", name="alpha", sink_topic="one-store", events=1)
    establish(open_store((tmp_path / "handoff-a").as_uri()), "alpha")
    beta = alpha.read_text().replace('name = "alpha"', 'name = "beta"')
    (tmp_path / "beta.toml").write_text(beta)
    done = subprocess.run([WAYMARK, "pipeline", "run", str(tmp_path / "beta.toml")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(
        "the handoff store belongs to pipeline 'alpha', not 'beta': give each pipeline its "
        "own handoff store"
    ), done.stderr


def test_a_server_refuses_a_second_owner_of_a_topic_even_after_a_restart(
    tmp_path: Path, spawn_server: Callable[..., ServerProcess]
) -> None:
    server = spawn_server(tmp_path / "data")
    with Client(server.url) as client:
        state, created = client.put_topic("edge.alpha.0123456789ab.raw", ConfigPatch(owner="alpha"))
        assert created and state.config.owner == "alpha"
        client.put_topic("edge.alpha.0123456789ab.raw", ConfigPatch(owner="alpha"))  # idempotent
        client.put_topic("edge.alpha.0123456789ab.raw", ConfigPatch(cap_records=10))  # no claim
    server.stop(signal.SIGKILL)
    server = spawn_server(tmp_path / "data")
    with Client(server.url) as client:
        with pytest.raises(ApiError) as refused:
            client.put_topic("edge.alpha.0123456789ab.raw", ConfigPatch(owner="beta"))
        assert refused.value.status == 409
        assert refused.value.code == ErrorCode.TOPIC_EXISTS_INCOMPATIBLE
        assert refused.value.detail == {"topic": "edge.alpha.0123456789ab.raw",
                                        "reason": "topic_owned", "owner": "alpha",
                                        "requested": "beta"}  # fmt: skip
        state = client.get_topic("edge.alpha.0123456789ab.raw")
        assert state.config.owner == "alpha" and state.config.cap_records == 10


def test_a_pipeline_whose_edge_topic_another_owns_stops_naming_it(
    tmp_path: Path, fleet: Fleet
) -> None:
    spec = write_spec(tmp_path, fleet, "t", name="taken", sink_topic="taken-out", events=10)
    topic = establish(open_store((tmp_path / "handoff-t").as_uri()), "taken").edge_topic("raw")
    with Client(fleet.urls[0]) as client:
        client.put_topic(topic, ConfigPatch(owner="someone-else"))
    proc = run(spec)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "stage 'produce'" in out and "owned by 'someone-else'" in out, out


# --- the state machine ---------------------------------------------------------------
EVENTS = 5
PIPELINES = ("alpha", "beta")
STAGES = ("produce", "sink")


def deliver(value: Any) -> list[Any]:
    return [value]


@dataclass
class Run:
    """One run of a pipeline: its handoff store and its two stages."""

    tag: str  # what its events carry, for the model
    store: ObjectStore
    identity: PipelineIdentity
    stages: dict[str, Stage | None] = field(default_factory=dict)


def machine_for(fleet: Fleet) -> type[RuleBasedStateMachine]:
    proxies = fleet.proxies

    class IdentityMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.sink_topic = f"shared-{uuid.uuid4().hex[:8]}"  # every run writes here
            self.clock = ManualClock()
            self.connect = client_factory(timeout_s=5.0, connect_s=1.0)
            self.runs: list[Run] = []
            self.faults = StoreFaults()  # every run's handoff store goes through it
            for proxy in proxies:
                proxy.up()

        def _sleep(self, seconds: float) -> None:
            self.clock.advance(int(seconds * 1000))

        def _start(self, run: Run, name: str) -> None:
            """A stage of ``run`` as the runner builds it; any earlier instance and its
            memory are gone (a crash, or the run resumed on its store)."""
            a, b, c = (p.url for p in proxies)
            edge = RelocatableQueueEdge(
                "raw", [a, b, c], run.store, consumer="sink", connect=self.connect,
                clock=self.clock, sleep=lambda s: self.clock.advance(int(s * 1000)),
                retries=2, poll_interval_ms=0, identity=run.identity,
            )  # fmt: skip
            states = StageStateStore(run.store)
            stage: Stage
            if name == "produce":
                stage = Stage(
                    "produce", lambda n, tag=run.tag: {"run": tag, "n": n}, states=states,
                    output=edge, events=EVENTS, batch=2, clock=self.clock,
                    identity=run.identity,
                )  # fmt: skip
            else:
                stage = Stage(
                    "sink", deliver, states=states, input=edge, batch=3, clock=self.clock,
                    sink=Sink(fleet.sink.url, self.sink_topic, connect=self.connect,
                              sleep=lambda s: None, retries=2),
                    identity=run.identity,
                )  # fmt: skip
            try:
                stage.start()
            except (EdgeUnavailable, ObjectStoreError):
                run.stages[name] = None  # it could not place its edge: started again later
                return
            run.stages[name] = stage

        def _step(self, run: Run, name: str) -> None:
            stage = run.stages.get(name)
            if stage is None:
                self._start(run, name)
                return
            try:
                stage.step()
            except (EdgeUnavailable, ObjectStoreError):
                run.stages[name] = None  # the stage gave up: a crash, restarted later

        # --- rules --------------------------------------------------------------------
        @precondition(lambda self: not self.faults.down)
        @rule(pipeline=st.sampled_from(PIPELINES))
        def new_run(self, pipeline: str) -> None:
            """A run on a fresh handoff store: the first of ``pipeline`` or a rerun."""
            # as the runner opens it: outages waited out within a budget
            # (docs/semantics/pipeline.md §10), here 2 s of the injected clock
            raw = open_store(f"file://{tempfile.mkdtemp(prefix='handoff-')}")
            store = PatientStore(self.faults.wrap(raw), clock=self.clock, sleep=self._sleep,
                                 budget_s=2.0)  # fmt: skip
            run = Run(f"{pipeline}#{len(self.runs)}", store, establish(store, pipeline))
            self.runs.append(run)
            for name in STAGES:
                self._start(run, name)

        @rule(data=st.data(), name=st.sampled_from(STAGES), times=st.integers(1, 3))
        def step(self, data: st.DataObject, name: str, times: int) -> None:
            if self.runs:
                run = data.draw(st.sampled_from(self.runs))
                for _ in range(times):
                    self._step(run, name)

        @rule(data=st.data(), name=st.sampled_from(STAGES))
        def stage_crashes(self, data: st.DataObject, name: str) -> None:
            if self.runs:
                self._start(data.draw(st.sampled_from(self.runs)), name)

        @rule(i=st.integers(0, len(proxies) - 1))
        def server_dies(self, i: int) -> None:
            proxies[i].down()

        @rule(i=st.integers(0, len(proxies) - 1))
        def server_returns(self, i: int) -> None:
            proxies[i].up()

        @rule()
        def store_goes_down(self) -> None:
            self.faults.down = True

        @rule()
        def store_comes_back(self) -> None:
            self.faults.down = False

        @rule(n=st.integers(1, 3))
        def store_loses_answers(self, n: int) -> None:
            """The next n writes land, but their answers are lost: the retries must
            find and accept their own writes (docs/semantics/pipeline.md §10)."""
            self.faults.lose = n

        # --- the end: every server back, every run to its end ----------------------------
        def teardown(self) -> None:
            try:
                for proxy in proxies:
                    proxy.up()
                self.faults.down, self.faults.lose = False, 0
                for _ in range(60):
                    unfinished = [
                        run for run in self.runs
                        if not ((p := run.stages.get("produce")) is not None and p.finished())
                    ]  # fmt: skip
                    if not unfinished:
                        break
                    for run in unfinished:
                        for name in STAGES:
                            self._step(run, name)
                else:
                    raise AssertionError("a run never finished once every server was back")
                self.check_sink()
            finally:
                for proxy in proxies:
                    proxy.up()

        def check_sink(self) -> None:
            expected = Counter((run.tag, n) for run in self.runs for n in range(EVENTS))
            if not expected:
                return
            with Client(fleet.sink.url) as client:
                got: Counter[tuple[str, int]] = Counter()
                cursor = 0
                while True:
                    page = client.diff(self.sink_topic, cursor, limit=1000)
                    got.update((r.data["run"], r.data["n"]) for r in page.records)
                    cursor = page.next_from_seq
                    if page.caught_up:
                        break
            missing, extra = expected - got, got - expected
            assert not missing and not extra, (
                f"sink: missing {sorted(missing)}, unexpected or repeated {sorted(extra)}"
            )

    return IdentityMachine


SETTINGS = settings(
    max_examples=6, stateful_step_count=12, deadline=None, derandomize=True, database=None,
    suppress_health_check=list(HealthCheck),
)  # fmt: skip


def test_each_run_gets_its_own_events_exactly_once(fleet: Fleet) -> None:
    run_state_machine_as_test(machine_for(fleet), settings=SETTINGS)


# A mutant is caught once a failing example is found; shrinking over a network is slow.
MUTANT_SETTINGS = settings(SETTINGS, max_examples=30, phases=[Phase.generate])


def _fails(fleet: Fleet) -> str:
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(machine_for(fleet), settings=MUTANT_SETTINGS)
    return str(failure.value)


@pytest.mark.usefixtures("fixed_constants")
def test_event_ids_without_the_pipeline_scope_are_caught(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ids as they were: "<stage>:<n>", the same in every run and pipeline
    monkeypatch.setattr(PipelineIdentity, "event_prefix", lambda self, stage: f"{stage}:")
    assert "sink: missing" in _fails(fleet)


@pytest.mark.usefixtures("fixed_constants")
def test_a_scope_without_the_stores_id_is_caught(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a rerun's fresh store starts its generations at 1 again in the same topic
    monkeypatch.setattr(PipelineIdentity, "scope", property(lambda self: self.pipeline))
    assert "sink: missing" in _fails(fleet)
