"""A queue's ``earliest_lease_deadline`` (docs/queues.md, "The oldest lease") is the
earliest deadline of the leases in flight, in a generated history of claims, acks,
nacks, extends and clock moves, checked against a model kept from the engine's
answers; and a mutant that trusts the expiry heap's stale top is caught."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Engine, RecordIn, TopicType
from waymark.log.queue import Projection

NODES = ("a", "b")


class OldestLease(RuleBasedStateMachine):
    """``held`` maps each seq in flight to its lease deadline, as the answers say."""

    @initialize()
    def start(self) -> None:
        self.clock = ManualClock()
        self.engine = Engine(clock=self.clock)
        self.engine.put_topic("q", ConfigPatch(lease_ms=100), TopicType.QUEUE)
        self.held: dict[int, tuple[str, int]] = {}  # seq -> (node, deadline)

    @rule(n=st.integers(1, 4))
    def append(self, n: int) -> None:
        self.engine.append("q", [RecordIn.of(i) for i in range(n)])

    @rule(node=st.sampled_from(NODES), n=st.integers(1, 3),
          lease_ms=st.none() | st.sampled_from([1, 50, 100, 250]))  # fmt: skip
    def claim(self, node: str, n: int, lease_ms: int | None) -> None:
        now = self.clock.now_ms()
        # A claim pass first reclaims every lease past its deadline (docs/queues.md).
        self.held = {s: h for s, h in self.held.items() if h[1] >= now}
        for job in self.engine.claim("q", node, n, lease_ms):
            self.held[job.seq] = (node, job.deadline)

    @rule(data=st.data(), node=st.sampled_from(NODES), verb=st.sampled_from(["ack", "nack"]))
    def settle(self, data: st.DataObject, node: str, verb: str) -> None:
        if not self.held:
            return
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=3,
                                  unique=True))  # fmt: skip
        done = getattr(self.engine, verb)("q", node, seqs)
        for seq in done.done:
            del self.held[seq]

    @rule(data=st.data(), node=st.sampled_from(NODES), lease_ms=st.sampled_from([1, 30, 400]))
    def extend(self, data: st.DataObject, node: str, lease_ms: int) -> None:
        if not self.held:
            return
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=3,
                                  unique=True))  # fmt: skip
        done = self.engine.extend("q", node, seqs, lease_ms=lease_ms)
        for seq, deadline in zip(done.done, done.deadlines or [], strict=True):
            self.held[seq] = (node, deadline)

    @rule(ms=st.sampled_from([0, 1, 49, 100, 101, 300]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @invariant()
    def the_oldest_lease_is_the_earliest_deadline_in_flight(self) -> None:
        counts = self.engine.get_topic("q", touch=False).queue
        assert counts is not None
        assert counts.in_flight == len(self.held)
        want = min((d for _, d in self.held.values()), default=None)
        assert counts.earliest_lease_deadline == want


TestOldestLease = OldestLease.TestCase
TestOldestLease.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                   database=None, derandomize=True)  # fmt: skip


def test_a_guard_that_trusts_the_heap_s_top_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the oldest lease read from the expiry heap without dropping the entries a
    later ack, nack or extend superseded."""

    def stale(self: Projection) -> int | None:
        return self.expiry[0][0] if self.expiry else None

    monkeypatch.setattr(Projection, "earliest_deadline", stale)
    mutant = OldestLease.TestCase("runTest")
    mutant.settings = settings(max_examples=200, stateful_step_count=30, deadline=None,
                               database=None, derandomize=True)  # fmt: skip
    with pytest.raises(AssertionError):
        mutant.runTest()
