"""The pipeline's invariants as a hypothesis state machine against the production
code and real servers (docs/semantics/pipeline.md §6): two producers, a transform
and a sink; server deaths and revivals, relocation races, stage restarts.

- the sink holds every event exactly once (docs/semantics/pipeline.md §6.1);
- no consumer accepts a record of a generation older than a handoff it has seen
  (docs/semantics/pipeline.md §6.2);
- two producers never both win one generation of an edge (docs/semantics/pipeline.md §6.3);
- the sink stage has two shards run by three instances (processes that die and come
  back, and race to take a shard over): no two instances hold one shard at one epoch,
  and a dead holder's shard is taken over (docs/semantics/pipeline.md §11).

Every stage writes behind (docs/semantics/pipeline.md §4.5) through a fault injector
that holds each step's writes until the stage's next step and the save they hand over
a step longer (group commit, docs/semantics/pipeline.md §4.6): a stage restarted in
between loses them, as a process killed with a batch in the air does.

The mutation tests break one guard each and require the machine to fail.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from tests.conftest import only_rules
from tests.pipeline.conftest import Fleet

from waymark.client import Client
from waymark.clock import ManualClock
from waymark.objstore import OVERWRITE, open_store
from waymark.pipeline import (
    EdgeUnavailable,
    RelocatableQueueEdge,
    Sink,
    Stage,
    StageStateStore,
    client_factory,
)
from waymark.pipeline import locator as locator_module
from waymark.pipeline import shard as shard_module
from waymark.pipeline.runner import physical_edges
from waymark.pipeline.shard import ShardedEdge, ShardLeases, read_lease
from waymark.pipeline.state import StageFenced

EVENTS = 8
PRODUCERS = ("p0", "p1")
STAGES = (*PRODUCERS, "t")
SHARDS = 2  # of the sink stage "s"
INSTANCES = ("i0", "i1", "i2")  # i0 and i1 claim their shard at once, i2 is a standby
LEASE_MS = 1000


def identity(value: Any) -> list[Any]:
    return [value]


class HeldWrites:
    """Fault injector for a stage's write-behind: a step's writes run only when the
    stage comes back for them (its next step), and the save they hand over later still
    (the step after, or a flush), a newer one replacing it meanwhile as group commit
    does; never if the stage is dropped first (docs/semantics/pipeline.md §4.6)."""

    def __init__(self) -> None:
        self.task: Callable[[], None] | None = None
        self.save: Callable[[], None] | None = None

    def submit(self, task: Callable[[], None]) -> None:
        self.join()
        self.task = task

    def checkpoint(self, save: Callable[[], None]) -> None:
        self.save = save

    def join(self) -> None:
        save, self.save = self.save, None
        if save is not None:
            save()
        task, self.task = self.task, None
        if task is not None:
            task()

    def flush(self) -> None:
        self.join()
        save, self.save = self.save, None
        if save is not None:
            save()

    def close(self) -> None:
        self.task = self.save = None


def machine_for(fleet: Fleet) -> type[RuleBasedStateMachine]:
    proxies = fleet.proxies

    class PipelineMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            run = uuid.uuid4().hex[:8]
            self.store = open_store(f"file://{tempfile.mkdtemp(prefix='handoff-')}")
            self.states = StageStateStore(self.store)
            self.clock = ManualClock()
            self.connect = client_factory(timeout_s=5.0, connect_s=1.0)
            self.e1, self.e2 = f"a-{run}", f"b-{run}"
            self.sink_topic = f"sink-{run}"
            self.stages: dict[str, Stage | None] = dict.fromkeys(STAGES)
            self.winners: dict[tuple[str, int], set[str]] = {}
            # the sink's instances: their leases (None: dead) and the shards they run
            self.leases: dict[str, ShardLeases | None] = {}
            self.shards: dict[tuple[str, int], Stage | None] = {}
            self.lives = 0
            for proxy in proxies:
                proxy.up()
            for name in STAGES:
                self._start(name)
            for inst in INSTANCES:
                self._instance_starts(inst)

        # --- building stages as a user would, with two checks wrapped around ----------
        def _edge(self, name: str, edge: str, urls: list[str], consumer: str) -> Any:
            e = RelocatableQueueEdge(
                edge, urls, self.store, consumer=consumer, connect=self.connect,
                clock=self.clock, sleep=lambda s: self.clock.advance(int(s * 1000)),
                retries=3, poll_interval_ms=0,
            )  # fmt: skip
            commit = e.commit_relocation

            def checked_commit(plan: Any) -> bool:
                won = commit(plan)
                if won:
                    key = (edge, plan.locator.generation)
                    self.winners.setdefault(key, set()).add(name)
                    assert len(self.winners[key]) == 1, f"two producers won {key}: {self.winners}"
                return won

            e.commit_relocation = checked_commit  # type: ignore[method-assign]
            pop = e.pop

            def checked_pop(max_items: int = 1000, *, wait_ms: int = 0) -> Any:
                seen = e.reader.seen.value
                out = pop(max_items, wait_ms=wait_ms)
                for i in range(len(out)):
                    at = out.position(i)  # its generation: the one the record was written under
                    assert at is not None
                    assert at.generation >= seen, (
                        f"{name} accepted a stale generation {at.generation} "
                        f"after seeing generation {seen}"
                    )
                    assert at.generation == e.generation().value, (
                        f"{name} accepted a stale generation {at.generation} "
                        f"while bound to {e.generation().value}"
                    )
                return out

            e.pop = checked_pop  # type: ignore[method-assign]
            return e

        def _start(self, name: str) -> None:
            a, b, c = (p.url for p in proxies)
            stage: Stage
            if name in PRODUCERS:
                out = self._edge(name, self.e1, [a, b], "t")
                stage = Stage(
                    name, lambda n, p=name: {"event": f"{p}:{n}"}, states=self.states,
                    output=out, events=EVENTS, batch=3, clock=self.clock, behind=HeldWrites(),
                )  # fmt: skip
            else:
                parts = [self._edge("t", f"{self.e2}.{k}", [b, c], f"s.{k}") for k in range(SHARDS)]
                stage = Stage(
                    "t", identity, states=self.states, clock=self.clock, behind=HeldWrites(),
                    input=self._edge("t", self.e1, [a, b], "t"),
                    output=ShardedEdge(self.e2, parts),
                )  # fmt: skip
            try:
                stage.start()
            except EdgeUnavailable:
                self.stages[name] = None  # it could not place its output: still down
                return
            self.stages[name] = stage

        # --- the sharded sink stage, as the runner drives it -------------------------
        def _instance_starts(self, inst: str) -> None:
            """A new process of instance ``inst`` (what an old one ran is gone)."""
            self.lives += 1
            home = [INSTANCES.index(inst)] if INSTANCES.index(inst) < SHARDS else []
            self.leases[inst] = ShardLeases(
                self.store, "s", SHARDS, owner=f"{inst}/{self.lives}", home=home,
                clock=self.clock, lease_ms=LEASE_MS,
            )  # fmt: skip
            for k in range(SHARDS):
                self.shards[inst, k] = None

        def _shard_stage(self, k: int) -> Stage:
            b, c = proxies[1].url, proxies[2].url
            # its own states, as a process of its own: its saves compare against the
            # versions it wrote itself
            return Stage(
                "s", identity, states=StageStateStore(self.store), clock=self.clock, key=f"s.{k}",
                behind=HeldWrites(),
                input=self._edge(f"s.{k}", f"{self.e2}.{k}", [b, c], f"s.{k}"),
                sink=Sink(fleet.sink.url, self.sink_topic, connect=self.connect,
                          sleep=lambda s: None, retries=2),
            )  # fmt: skip

        def _instance_runs(self, inst: str, *, tick: bool = True) -> None:
            """One round of the runner's shard loop: renew and take over leases, start
            the shards held, drop those taken over, step the rest. Without ``tick``, a
            stalled instance that wakes and steps before it learns of a takeover: its
            state's fence stops it (docs/semantics/pipeline.md §11.2)."""
            leases = self.leases[inst]
            if leases is None:
                return
            if tick:
                leases.tick()
            for k in range(SHARDS):
                stage = self.shards[inst, k]
                if not leases.owns(k):
                    self.shards[inst, k] = None  # taken over: dropped
                    continue
                try:
                    if stage is None:
                        stage = self._shard_stage(k)
                        stage.start()
                        self.shards[inst, k] = stage
                    stage.step()
                except StageFenced:
                    leases.lose(k)
                    self.shards[inst, k] = None
                except EdgeUnavailable:
                    self.shards[inst, k] = None  # restarted from its checkpoint later

        def _step(self, name: str) -> None:
            stage = self.stages[name]
            if stage is None:
                self._start(name)
                return
            try:
                stage.step()
            except EdgeUnavailable:
                self.stages[name] = None  # the stage gave up: a crash, restarted later

        # --- rules --------------------------------------------------------------------
        @rule(name=st.sampled_from(STAGES))
        def step(self, name: str) -> None:
            self._step(name)

        @rule(i=st.integers(0, len(proxies) - 1))
        def server_dies(self, i: int) -> None:
            proxies[i].down()

        @rule(i=st.integers(0, len(proxies) - 1))
        def server_returns(self, i: int) -> None:
            proxies[i].up()

        @rule(name=st.sampled_from(STAGES))
        def stage_restarts(self, name: str) -> None:
            self._start(name)  # the old instance and everything in its memory are gone

        @rule(inst=st.sampled_from(INSTANCES))
        def instance_runs(self, inst: str) -> None:
            self._instance_runs(inst)

        @rule(inst=st.sampled_from(INSTANCES))
        def stalled_instance_steps(self, inst: str) -> None:
            self._instance_runs(inst, tick=False)

        @rule(ms=st.sampled_from([300, LEASE_MS]))
        def time_passes(self, ms: int) -> None:
            self.clock.advance(ms)

        @precondition(lambda self: sum(v is not None for v in self.leases.values()) > 1)
        @rule(inst=st.sampled_from(INSTANCES))
        def instance_is_killed(self, inst: str) -> None:
            self.leases[inst] = None  # SIGKILL: nothing of it renews or writes again
            for k in range(SHARDS):
                self.shards[inst, k] = None

        @precondition(lambda self: any(v is None for v in self.leases.values()))
        @rule(inst=st.sampled_from(INSTANCES))
        def instance_comes_back(self, inst: str) -> None:
            if self.leases[inst] is None:
                self._instance_starts(inst)

        @rule(k=st.integers(0, SHARDS - 1))
        def takeover_race(self, k: int) -> None:
            """The live instances not holding shard ``k`` read its lease, then all try
            to take it over from what they read."""
            racing = [(inst, lease) for inst, lease in self.leases.items()
                      if lease is not None and not lease.owns(k)]  # fmt: skip
            seen = [read_lease(self.store, "s", k) for _ in racing]
            for (_, lease), (held, version) in zip(racing, seen, strict=True):
                lease.take(k, held, version, self.clock.now_ms())
            for inst, lease in racing:  # the winner starts the shard: it claims its state
                if lease.owns(k):
                    self._instance_runs(inst, tick=False)

        @invariant()
        def one_holder_per_shard_and_epoch(self) -> None:
            holders: dict[tuple[int, int], list[str]] = {}
            for inst, lease in self.leases.items():
                for k, epoch in (lease.held() if lease is not None else {}).items():
                    holders.setdefault((k, epoch), []).append(inst)
            for (k, epoch), insts in holders.items():
                assert len(insts) == 1, f"two instances hold shard {k} at epoch {epoch}: {insts}"

        @rule(name=st.sampled_from(PRODUCERS))
        def producer_relocates(self, name: str) -> None:
            stage = self.stages[name]
            if stage is not None and stage.output is not None:
                with contextlib.suppress(EdgeUnavailable):
                    stage.output.relocate()

        @precondition(lambda self: all(self.stages[p] is not None for p in PRODUCERS))
        @rule(paused=st.sampled_from(PRODUCERS))
        def split_brain(self, paused: str) -> None:
            """A producer stalls (a pause, a partition) while the other moves the edge
            away and back; it wakes and writes under the generation it knew."""
            other = self.stages[next(p for p in PRODUCERS if p != paused)]
            assert other is not None and other.output is not None
            try:
                other.output.relocate()
                other.output.relocate()
            except EdgeUnavailable:
                return
            self._step(paused)

        @precondition(lambda self: all(self.stages[p] is not None for p in PRODUCERS))
        @rule()
        def relocation_race(self) -> None:
            """Both producers read the handoff, then both try to publish over it."""
            edges = [self.stages[p].output for p in PRODUCERS]  # type: ignore[union-attr]
            try:
                plans = [edge.prepare_relocation() for edge in edges]  # type: ignore[union-attr]
            except EdgeUnavailable:
                return
            won = [edge.commit_relocation(plan) for edge, plan in zip(edges, plans, strict=True)]  # type: ignore[union-attr]
            if plans[0].locator.generation == plans[1].locator.generation:
                assert won.count(True) <= 1

        @invariant()
        def generations_only_grow(self) -> None:
            for stage in (*self.stages.values(), *self.shards.values()):
                for edge in physical_edges(stage) if stage is not None else ():
                    if edge.locator is not None:
                        assert edge.generation() <= edge.reader.seen

        # --- the end: every server back, run until the producers are acknowledged ------
        def teardown(self) -> None:
            try:
                # The middle server comes back; the others stay as they are, so a
                # producer with nothing left to write still finds its edge dead and
                # moves it (docs/semantics/pipeline.md §3.4).
                proxies[1].up()
                self.check_shards_taken_over()
                for _ in range(100):
                    producers = [self.stages[p] for p in PRODUCERS]
                    if all(p is not None and p.finished() for p in producers):
                        break
                    for name in STAGES:
                        self._step(name)
                    for inst in INSTANCES:
                        self._instance_runs(inst)
                    self.clock.advance(LEASE_MS // 4)  # a dead holder's shard is taken over
                else:
                    raise AssertionError("the pipeline never finished once every server was back")
                self.check_sink()
            finally:
                for proxy in proxies:
                    proxy.up()

        def check_shards_taken_over(self) -> None:
            """The live instances alone, on the clock: within a few leases every shard is
            held by one of them, whoever held it before (docs/semantics/pipeline.md §11.2)."""
            live = {inst: lease for inst, lease in self.leases.items() if lease is not None}
            for _ in range(12):
                for lease in live.values():
                    lease.tick()
                held = {k for lease in live.values() for k in lease.held()}
                if held == set(range(SHARDS)):
                    return
                self.clock.advance(LEASE_MS // 4)
            raise AssertionError(f"a shard was dropped: the live instances hold only {held}")

        def check_sink(self) -> None:
            with Client(fleet.sink.url) as client:
                events = Counter(_all_records(client, self.sink_topic))
            expected = Counter(f"{p}:{n}" for p in PRODUCERS for n in range(EVENTS))
            assert events == expected, f"sink {events} != expected {expected}"

    return PipelineMachine


def _all_records(client: Client, topic: str) -> list[str]:
    """The event id of every record in the sink topic (carried as the record's data)."""
    out: list[str] = []
    cursor = 0
    while True:
        page = client.diff(topic, cursor, limit=1000)
        out += [r.data["event"] for r in page.records]
        cursor = page.next_from_seq
        if page.caught_up:
            return out


SETTINGS = settings(
    max_examples=12, stateful_step_count=25, deadline=None, derandomize=True, database=None,
    suppress_health_check=list(HealthCheck),
)  # fmt: skip


def test_the_pipeline_invariants_hold(fleet: Fleet) -> None:
    run_state_machine_as_test(machine_for(fleet), settings=SETTINGS)


# A mutant is caught once a failing example is found; shrinking it over a network
# would take minutes.
MUTANT_SETTINGS = settings(SETTINGS, max_examples=40, phases=[Phase.generate])


def _fails(fleet: Fleet, *rules: str) -> str:
    """The machine's failure on a mutant; with ``rules``, a hunt with only those rules
    (every invariant, check and the teardown stay): the steps that can expose the
    mutant's bug, so it is found within a few examples, not dozens."""
    machine = machine_for(fleet)
    if rules:
        machine = only_rules(machine, *rules)
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(machine, settings=MUTANT_SETTINGS)
    return str(failure.value)


# The rules of the edges (relocation, races, server deaths), and of the sink's shards.
EDGE_RULES = ("step", "server_dies", "server_returns", "stage_restarts", "producer_relocates",
              "split_brain", "relocation_race")  # fmt: skip
SHARD_RULES = ("step", "instance_runs", "stalled_instance_steps", "time_passes",
               "instance_is_killed", "instance_comes_back", "takeover_race")  # fmt: skip


@pytest.mark.usefixtures("fixed_constants")
def test_a_consumer_that_skips_the_staleness_check_is_caught(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RelocatableQueueEdge, "stale", lambda self, stamped: False)
    # caught at the pop, or by what the stale records it took cost at the sink
    failure = _fails(fleet, *EDGE_RULES)
    assert any(m in failure for m in ("accepted a stale generation", "!= expected"))


@pytest.mark.usefixtures("fixed_constants")
def test_a_handoff_published_without_the_conditional_write_is_caught(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_mode: Callable[[Any], Any] = lambda observed: OVERWRITE  # noqa: E731
    monkeypatch.setattr(locator_module, "put_mode", put_mode)
    assert "two producers won" in _fails(fleet)


@pytest.mark.usefixtures("fixed_constants")
def test_a_checkpoint_saved_before_its_batch_is_written_is_caught(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/semantics/pipeline.md §4.5: the save runs after the batch's writes, in the
    # same task. Saved at once instead, a sink restarted before its writes ran has
    # acknowledged records it never wrote.
    decide = Stage._checkpoint  # noqa: SLF001 -- the guard a mutant breaks

    def save_at_once(self: Stage, *, now: bool = True) -> None:
        save = decide(self, now=now)
        if save is not None:
            save()

    monkeypatch.setattr(Stage, "_checkpoint", save_at_once)
    # The machine's own rules in the order that exposes it (random runs reach it too
    # rarely for a mutant hunt): data reaches the sink's shards, and the instance holding
    # shard 0 is killed with a batch held; the teardown runs the pipeline to the end and
    # checks the sink.
    machine = machine_for(fleet)()
    for _ in range(3):
        for name in STAGES:
            machine.step(name)
        for inst in INSTANCES:
            machine.instance_runs(inst)
    machine.instance_is_killed("i0")
    with pytest.raises(AssertionError, match="!= expected"):
        machine.teardown()


def test_a_shard_lease_taken_without_the_conditional_write_is_caught(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_mode: Callable[[Any], Any] = lambda version: OVERWRITE  # noqa: E731
    monkeypatch.setattr(shard_module, "put_mode", put_mode)
    assert "two instances hold shard" in _fails(fleet, *SHARD_RULES)


@pytest.mark.usefixtures("fixed_constants")
def test_a_shard_a_dead_instance_held_and_nobody_takes_over_is_caught(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    take = ShardLeases.take

    def take_only_free_shards(self: ShardLeases, shard: int, lease: Any, *args: Any) -> None:
        if lease is None:  # a shard once held is never taken over: dropped on rebalance
            take(self, shard, lease, *args)

    monkeypatch.setattr(ShardLeases, "take", take_only_free_shards)
    assert "a shard was dropped" in _fails(fleet, *SHARD_RULES)
