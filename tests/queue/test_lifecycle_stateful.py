"""The lease lifecycle (docs/semantics/topics.md §10.2) against an independent model, on the
production engine.

A hypothesis state machine produces jobs, claims (alone and as cohorts), acks,
nacks (with delays), extends, advances a manual clock and restarts the lease
projection from the leases log, and fills (discard:"reject") or opens the
dead-letter topic. After every step: no job is lost (each is in the queue, acked,
or in the dead-letter topic — exactly one of them, and there once), no job is
handed out while another live lease holds it, every ack/nack/extend applies to
exactly the seqs whose lease the caller holds, a dead letter was delivered
exactly max_deliveries times, and a refused dead-letter move is tried again at
most once per DEAD_LETTER_RETRY_MS (or after a rebuild), never per claim. A drain
rule checks nothing is stuck: far past every deadline and retry, one claim gets
every job still in the queue but those delivered max_deliveries times, which are
dead-lettered, or parked while the dead-letter topic is full.

Three deliberate mutations of the guards (an expiry check off by one; a claim cursor
that does not skip leased jobs; a refused dead-letter move retried on every claim)
are each caught.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Engine, RecordIn, TopicType
from waymark.log import queue as queue_module
from waymark.log.queue import DEAD_LETTER_RETRY_MS
from waymark.protocol import Discard

Q, DLQ = "jobs", "dead"
MAX_DELIVERIES = 3
NODES = st.sampled_from(["a", "b", "c"])
LEASE = st.sampled_from([10, 20])
STEP = st.sampled_from([0, 1, 5, 10, 11, 20, 21])


@dataclass
class ModelLease:
    node: str
    lease_id: str
    deadline: int


class LeaseLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.engine = Engine(clock=self.clock)
        config = ConfigPatch(lease_ms=10, max_deliveries=MAX_DELIVERIES, dead_letter=DLQ)
        self.engine.put_topic(Q, config, TopicType.QUEUE)
        self.engine.put_topic(DLQ, ConfigPatch(discard=Discard.REJECT))
        self.dead_letter_open = True
        self.refused = 0  # the engine's count of refused dead-letter moves, last seen
        self.retry_from = 0  # no refused move may be tried again before this
        self.produced: set[int] = set()
        self.acked: set[int] = set()
        self.leases: dict[int, ModelLease] = {}
        self.deliveries: dict[int, int] = {}
        self.max_delay = 0

    def now(self) -> int:
        return self.clock.now_ms()

    def live(self, seq: int) -> ModelLease | None:
        lease = self.leases.get(seq)
        return lease if lease is not None and self.now() <= lease.deadline else None

    def queued(self) -> set[int]:
        page = self.engine.diff(Q, 0, limit=10_000)
        return set(page.seqs)

    def dead_letters(self) -> dict[int, int]:
        records = self.engine.diff(DLQ, 0, limit=10_000).records()
        letters = [(int(r["meta"]["$dead_letter_seq"]), int(r["meta"]["$dead_letter_deliveries"]))
                   for r in records if "meta" in r]  # fmt: skip
        assert len({seq for seq, _ in letters}) == len(letters), "a job dead-lettered twice"
        return dict(letters)

    def claimed(self) -> None:
        """After a claim pass: it tried a refused dead-letter move again only when due."""
        refused = self.engine.queues.dead_letter_refused
        if refused > self.refused:
            assert refused == self.refused + 1 and self.now() >= self.retry_from
            self.refused, self.retry_from = refused, self.now() + DEAD_LETTER_RETRY_MS

    def take(self, node: str, jobs: list) -> None:
        for job in jobs:
            assert self.live(job.seq) is None, f"seq {job.seq} handed out under a live lease"
            assert job.seq in self.produced and job.seq not in self.acked
            self.deliveries[job.seq] = self.deliveries.get(job.seq, 0) + 1
            assert job.delivery == self.deliveries[job.seq]
            assert job.delivery <= MAX_DELIVERIES
            self.leases[job.seq] = ModelLease(node, job.lease_id, job.deadline)

    # --- rules --------------------------------------------------------------------------
    @rule(n=st.integers(1, 4))
    def produce(self, n: int) -> None:
        result = self.engine.append(Q, [RecordIn.of(i) for i in range(n)])
        self.produced.update(result.seqs)

    @rule(node=NODES, most=st.integers(1, 4), lease_ms=LEASE)
    def claim(self, node: str, most: int, lease_ms: int) -> None:
        self.take(node, self.engine.claim(Q, node, most, lease_ms))
        self.claimed()

    @rule(maxes=st.lists(st.tuples(NODES, st.integers(1, 3)), min_size=2, max_size=4))
    def cohort(self, maxes: list[tuple[str, int]]) -> None:
        requests = [queue_module.ClaimRequest(node, most) for node, most in maxes]
        grants = self.engine.claim_cohort(Q, requests)
        self.claimed()
        total = sum(len(g) for g in grants)
        for (node, most), jobs in zip(maxes, grants, strict=True):
            assert len(jobs) <= most
            self.take(node, jobs)
        if total < sum(m for _, m in maxes):
            # Short of work: nobody got more than its proportional share, rounded up.
            for (_, most), jobs in zip(maxes, grants, strict=True):
                assert len(jobs) <= total * most / sum(m for _, m in maxes) + 1

    def _settle_args(self, data: st.DataObject) -> tuple[str, list[int], list[str] | None, dict]:
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.produced)), max_size=3))
        node = data.draw(NODES)
        fenced = data.draw(st.booleans())
        ids = None
        if fenced:
            ids = [data.draw(st.sampled_from([self.leases[s].lease_id, "stale"]))
                   if s in self.leases else "stale" for s in seqs]  # fmt: skip
        expected: dict[int, bool] = {}
        for i, seq in enumerate(seqs):
            lease = self.live(seq)
            holds = lease is not None and lease.node == node
            if holds and ids is not None:
                holds = ids[i] == lease.lease_id
            # A seq named twice applies once, if any of its entries holds the lease.
            expected[seq] = expected.get(seq, False) or holds
        return node, seqs, ids, expected

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        if not self.produced:
            return
        node, seqs, ids, expected = self._settle_args(data)
        settled = self.engine.ack(Q, node, seqs, ids)
        assert sorted(settled.done) == sorted(s for s in expected if expected[s])
        for seq in settled.done:
            self.acked.add(seq)
            del self.leases[seq]

    @rule(data=st.data(), delay=st.sampled_from([0, 0, 7, 30]))
    def nack(self, data: st.DataObject, delay: int) -> None:
        if not self.produced:
            return
        node, seqs, ids, expected = self._settle_args(data)
        settled = self.engine.nack(Q, node, seqs, ids, delay)
        assert sorted(settled.done) == sorted(s for s in expected if expected[s])
        for seq in settled.done:
            del self.leases[seq]
        self.max_delay = max(self.max_delay, delay)

    @rule(data=st.data(), lease_ms=LEASE)
    def extend(self, data: st.DataObject, lease_ms: int) -> None:
        if not self.produced:
            return
        node, seqs, ids, expected = self._settle_args(data)
        settled = self.engine.extend(Q, node, seqs, ids, lease_ms)
        assert sorted(settled.done) == sorted(s for s in expected if expected[s])
        for seq in settled.done:
            self.leases[seq].deadline = self.now() + lease_ms

    @rule(ms=STEP)
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def advance_to_a_deadline(self) -> None:
        # Boundaries are where expiry bugs live: land exactly on a live lease's deadline.
        deadlines = [lease.deadline for lease in self.leases.values()
                     if lease.deadline >= self.now()]  # fmt: skip
        if deadlines:
            self.clock.set(min(deadlines))

    @rule()
    def restart(self) -> None:
        # The projection is rebuilt from the leases log, as after a restart that kept it.
        self.engine.queues._projections.clear()
        self.retry_from = 0  # a rebuilt projection tries parked jobs at its first pass

    @rule()
    def fill_dead_letters(self) -> None:
        count = self.engine.get_topic(DLQ, touch=False).count
        if not count:
            self.engine.append(DLQ, [RecordIn.of("filler")])
            count = 1
        self.engine.put_topic(DLQ, ConfigPatch(cap_records=count))
        self.dead_letter_open = False

    @rule()
    def open_dead_letters(self) -> None:
        self.engine.put_topic(DLQ, ConfigPatch(cap_records=0))
        self.dead_letter_open = True

    @rule()
    def drain(self) -> None:
        self.clock.advance(max(self.max_delay, 20, DEAD_LETTER_RETRY_MS) + 1)
        self.leases.clear()  # every lease is past its deadline now
        self.max_delay = 0
        before = self.queued()
        spent = {s for s in before if self.deliveries.get(s) == MAX_DELIVERIES}
        jobs = self.engine.claim(Q, "drainer", 10_000, 10)
        self.claimed()
        self.take("drainer", jobs)
        dead_now = {s for s in before if s in self.dead_letters()}
        spent -= dead_now
        assert {j.seq for j in jobs} == before - dead_now - spent, "a job was not claimable"
        # Delivered max_deliveries times and still here: only while dead letters are refused.
        counts = self.engine.get_topic(Q, touch=False).queue
        assert counts is not None and counts.dead_letter_parked == len(spent)
        assert not spent or not self.dead_letter_open

    # --- invariants -----------------------------------------------------------------------
    @invariant()
    def no_job_lost(self) -> None:
        queued, dead = self.queued(), set(self.dead_letters())
        assert not (queued & self.acked) and not (queued & dead) and not (dead & self.acked)
        assert queued | self.acked | dead == self.produced

    @invariant()
    def dead_letters_had_exactly_max_deliveries(self) -> None:
        for seq, deliveries in self.dead_letters().items():
            assert deliveries == MAX_DELIVERIES == self.deliveries[seq]

    @invariant()
    def counts_agree(self) -> None:
        counts = self.engine.get_topic(Q, touch=False).queue
        assert counts is not None
        assert counts.dead_lettered == len(self.dead_letters())


SETTINGS = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
# A mutant only has to be caught, not explained: no shrinking, so it fails fast.
MUTANT = settings(SETTINGS, max_examples=300, phases=[Phase.generate], derandomize=True)


def test_lease_lifecycle() -> None:
    run_state_machine_as_test(LeaseLifecycle, settings=SETTINGS)


def test_expiry_off_by_one_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_module, "lease_expired", lambda deadline, now: now >= deadline)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(LeaseLifecycle, settings=MUTANT)


def test_claim_cursor_taking_leased_jobs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_module.Projection, "fresh", lambda self, seq: True)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(LeaseLifecycle, settings=MUTANT)


def test_retrying_a_refused_dead_letter_on_every_claim_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(queue_module, "DEAD_LETTER_RETRY_MS", 0)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(LeaseLifecycle, settings=MUTANT)
