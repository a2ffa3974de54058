"""The delivery scheduler (higher P_eff served first, aging, no starvation), as a
hypothesis state machine over the production scheduler and engine, under a manual clock.

Topics get random manual priorities (clamped ones included), auto on or off; delivery
work for them is added, time passes, consumers read, priorities change, and rounds of
``budget`` pops serve the work. Checked at every pop and after every round:

(a) ordering: no pending item ranks above the popped one. Ranks are P_eff computed by
    the priority formula from the model's configs at the scheduler's evaluation instant; an
    item whose aging is saturated (starving) ranks above all, the longest-waiting first;
(b) no starvation: once an item has waited AGE_CAP_MS + TICK_MS, it is served within
    ceil(K / budget) rounds (K: distinct keys);
(c) priority changes neither the order of records within a topic nor what is visible:
    one topic's work is served in the order it was added, every item exactly once, and
    each topic's reader, woken by the scheduler, reads every record in seq order.

Consumption (a reader's read, a touching GET) and reconfiguration change a topic's
P_eff; the scheduler sees such changes at its next aging tick, so the machine lets a
tick pass after each one, and the oracle is exact.

The mutation tests at the bottom break the scheduler and assert the machine notices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Engine, RecordIn
from waymark.log import scheduler as scheduler_module
from waymark.log.priority import AGE_CAP_MS, effective_priority
from waymark.log.scheduler import RANKED, TICK_MS, DeliveryScheduler

KINDS = ("wake", "forward")
PRIORITIES = [None, 0, -1000, -300, 300, 1000, 5000, -5000]
WAITS = [0, 1, 10, 49, 50, 51, 500, 3_000, 9_999, AGE_CAP_MS, AGE_CAP_MS + TICK_MS, 30_000]


@dataclass
class Pending:
    topic: str
    enqueued_at: int
    order: int  # add order: the scheduler's tie-break after enqueued_at
    starved_rounds: int = 0  # rounds survived after waiting AGE_CAP_MS + TICK_MS


@dataclass
class TopicModel:
    priority: int | None
    auto: bool
    appended: list[int] = field(default_factory=list)  # record data, in seq order
    cursor: int = 0
    delivered: list[int] = field(default_factory=list)


class Scheduling(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.engine = Engine(clock=self.clock)
        self.scheduler: DeliveryScheduler[tuple[str, str]] = DeliveryScheduler(
            self.clock, self.engine.delivery_priority
        )
        self.topics: dict[str, TopicModel] = {}
        self.pending: dict[tuple[str, str], Pending] = {}
        self.adds = 0
        self.budget = 1
        self.data = 0

    @initialize(
        configs=st.lists(
            st.tuples(st.sampled_from(PRIORITIES), st.booleans()), min_size=2, max_size=4
        ),
        budget=st.integers(1, 3),
    )
    def create(self, configs: list[tuple[int | None, bool]], budget: int) -> None:
        self.budget = budget
        for i, (priority, auto) in enumerate(configs):
            name = f"t{i}"
            self.engine.put_topic(name, ConfigPatch(priority=priority, auto_priority=auto))
            self.topics[name] = TopicModel(priority, auto)

    # --- work arrives ------------------------------------------------------------------
    def _add(self, kind: str, topic: str) -> None:
        key = (kind, topic)
        added = self.scheduler.add(key, topic)
        assert added == (key not in self.pending)  # a pending key coalesces
        if added:
            self.adds += 1
            self.pending[key] = Pending(topic, self.clock.now_ms(), self.adds)

    @rule(i=st.integers(0, 3), n=st.integers(1, 3))
    def commit(self, i: int, n: int) -> None:
        """Records land in a topic: its readers' wakeup is delivery work."""
        name = f"t{i % len(self.topics)}"
        values = list(range(self.data, self.data + n))
        self.data += n
        self.engine.append(name, [RecordIn.of(v) for v in values])
        self.topics[name].appended += values
        self._add("wake", name)

    @rule(i=st.integers(0, 3))
    def forward_step(self, i: int) -> None:
        """Other work of a topic (a router source's forwarding step)."""
        self._add("forward", f"t{i % len(self.topics)}")

    @rule(i=st.integers(0, 3))
    def load(self, i: int) -> None:
        """Sustained load: every kind of work of a topic, then a round."""
        name = f"t{i % len(self.topics)}"
        for kind in KINDS:
            self._add(kind, name)
        self.serve()

    # --- time and P_eff inputs ------------------------------------------------------
    @rule(ms=st.sampled_from(WAITS))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(i=st.integers(0, 3))
    def consume(self, i: int) -> None:
        self.engine.get_topic(f"t{i % len(self.topics)}")  # a touching GET consumes
        self.clock.advance(TICK_MS)  # seen at the next tick

    @rule(i=st.integers(0, 3), priority=st.sampled_from(PRIORITIES), auto=st.booleans())
    def reprioritize(self, i: int, priority: int | None, auto: bool) -> None:
        name = f"t{i % len(self.topics)}"
        self.engine.put_topic(name, ConfigPatch(priority=priority, auto_priority=auto))
        self.topics[name].priority, self.topics[name].auto = priority, auto
        self.clock.advance(TICK_MS)

    # --- serving -----------------------------------------------------------------------
    @precondition(lambda self: bool(self.pending))
    @rule()
    def serve(self) -> None:
        """One round: at most ``budget`` pops; then the woken readers read."""
        start = self.clock.now_ms()
        woken: list[str] = []
        for _ in range(self.budget):
            if not self.pending:
                break
            key = self.scheduler.pop()
            assert key in self.pending, f"popped {key}, never added or already served"
            self.check_order(key)
            popped = self.pending.pop(key)
            same_topic = [p.order for p in self.pending.values() if p.topic == popped.topic]
            assert all(popped.order < o for o in same_topic), "a topic's work out of order"
            if key[0] == "wake":
                woken.append(key[1])
        for p in self.pending.values():
            if start - p.enqueued_at >= AGE_CAP_MS + TICK_MS:
                p.starved_rounds += 1
        for name in woken:
            self.read(name)
        if woken:
            self.clock.advance(TICK_MS)  # the reads consumed: seen at the next tick

    def rank(self, p: Pending, at: int) -> tuple[int, ...]:
        """The delivery order, from the model: starving first (longest wait first), then
        highest P_eff, then longest wait, then add order."""
        if at - p.enqueued_at >= AGE_CAP_MS:
            return (0, p.enqueued_at, p.order)
        model = self.topics[p.topic]
        consumed = self.engine.kernel.existing(p.topic).last_consumed_at
        p_eff = effective_priority(model.priority, model.auto, at, consumed, p.enqueued_at)
        return (RANKED, -p_eff, p.enqueued_at, p.order)

    def check_order(self, key: tuple[str, str]) -> None:
        at = self.scheduler.evaluated_at
        assert self.clock.now_ms() - at < TICK_MS, "the aging tick is overdue"
        served = self.rank(self.pending[key], at)
        for other, p in self.pending.items():
            if other != key:
                assert served < self.rank(p, at), (
                    f"served {key} {served} before {other} {self.rank(p, at)} at {at}"
                )

    def read(self, name: str) -> None:
        model = self.topics[name]
        page = self.engine.diff(name, model.cursor)
        assert page.tombstone is None
        model.delivered += [record["data"] for record in page.records()]
        model.cursor = page.next_from_seq
        # (c) in seq order, gap-free, byte-identical: what was appended, and all of it.
        assert model.delivered == model.appended

    # --- invariants ------------------------------------------------------------------
    @invariant()
    def nothing_lost_or_duplicated(self) -> None:
        assert len(self.scheduler) == len(self.pending)  # and each pop is a pending key

    @invariant()
    def no_starvation(self) -> None:
        if not self.topics:
            return
        bound = math.ceil(len(self.topics) * len(KINDS) / self.budget)
        for key, p in self.pending.items():
            assert p.starved_rounds < bound, f"{key} starved for {p.starved_rounds} rounds"


SETTINGS = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_scheduler_orders_by_priority_ages_and_never_starves() -> None:
    run_state_machine_as_test(Scheduling, settings=SETTINGS)


# --- the machine catches broken scheduling ----------------------------------------------

# Finding one failure is the point; the search is fixed (no database, derandomized), so
# whether a mutant is caught never depends on what an earlier run found.
MUTATION_SETTINGS = settings(
    SETTINGS, max_examples=400, database=None, derandomize=True, phases=[Phase.generate]
)


def _fifo(self, key, topic, enqueued_at, serial):  # type: ignore[no-untyped-def]
    return (RANKED, 0, enqueued_at, serial, key, topic)


@pytest.mark.usefixtures("fixed_constants")
def test_catches_fifo_instead_of_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DeliveryScheduler, "_entry", _fifo)
    with pytest.raises(AssertionError, match="served"):
        run_state_machine_as_test(Scheduling, settings=MUTATION_SETTINGS)


@pytest.mark.usefixtures("fixed_constants")
def test_catches_no_aging(monkeypatch: pytest.MonkeyPatch) -> None:
    # Mutation: P_eff without its age term, and no starving tier.
    def ageless(self, key, topic, enqueued_at, serial):  # type: ignore[no-untyped-def]
        p_eff = self._rank(topic, self.evaluated_at, self.evaluated_at)
        return (RANKED, -p_eff, enqueued_at, serial, key, topic)

    monkeypatch.setattr(DeliveryScheduler, "_entry", ageless)
    with pytest.raises(AssertionError, match="served"):
        run_state_machine_as_test(Scheduling, settings=MUTATION_SETTINGS)


def _rounds_until_served(low_priority: int, rounds: int) -> int | None:
    """A priority ``low_priority`` topic's one item against two +1000 topics that have
    fresh work every round (budget 1, 100 ms a round): the round that serves it."""
    clock = ManualClock()
    engine = Engine(clock=clock)
    engine.put_topic("low", ConfigPatch(priority=low_priority, auto_priority=False))
    for name in ("hi0", "hi1"):
        engine.put_topic(name, ConfigPatch(priority=1000, auto_priority=False))
    scheduler: DeliveryScheduler[str] = DeliveryScheduler(clock, engine.delivery_priority)
    scheduler.add("low", "low")
    for n in range(rounds):
        scheduler.add(f"hi{n % 2}", f"hi{n % 2}")
        if scheduler.pop() == "low":
            return n
        clock.advance(100)
    return None


def test_low_priority_work_is_served_under_sustained_high_priority_load() -> None:
    # Waiting AGE_CAP_MS makes it starving, and starving work goes first.
    served = _rounds_until_served(-1000, rounds=500)
    assert served is not None and served <= (AGE_CAP_MS + TICK_MS) // 100 + 1


def test_catches_aging_that_cannot_prevent_starvation(monkeypatch: pytest.MonkeyPatch) -> None:
    # Mutation: aging as the formula has it (capped at +1000), no starving tier: a
    # priority -1000 topic's work waits forever behind busy +1000 topics. A fixed
    # scenario, because the machine's search did not reach it in every run.
    monkeypatch.setattr(scheduler_module, "AGE_CAP_MS", 10**12)
    assert _rounds_until_served(-1000, rounds=500) is None


@pytest.mark.usefixtures("fixed_constants")
def test_catches_a_stale_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    # Mutation: P_eff evaluated once, at enqueue, never re-aged.
    monkeypatch.setattr(scheduler_module, "TICK_MS", 10**12)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(Scheduling, settings=MUTATION_SETTINGS)
