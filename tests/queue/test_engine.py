"""Queues (docs/semantics/topics.md §10) in-process with a manual clock: exact time boundaries,
the cohort pass, the leases log (trimming, rebuild) and the ack delete through durable storage."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from waymark.clock import CountingIds, ManualClock
from waymark.log import ConfigPatch, Engine, ErrorCode, RecordIn, TopicError, TopicType
from waymark.log.config import StorageConfig
from waymark.log.queue import DEAD_LETTER_RETRY_MS, ClaimRequest, leases_name
from waymark.log.storage.restore import open_engine
from waymark.protocol import Discard, QueueCounts


def queue(engine: Engine, jobs: int = 0, **config: object) -> None:
    engine.put_topic("q", ConfigPatch(**config), TopicType.QUEUE)  # type: ignore[arg-type]
    if jobs:
        engine.append("q", [RecordIn.of(i) for i in range(jobs)])


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def engine(clock: ManualClock) -> Engine:
    return Engine(clock=clock)


def test_a_lease_is_live_through_its_deadline_and_reclaimable_just_after(
    engine: Engine, clock: ManualClock
) -> None:
    queue(engine, 1, lease_ms=100)
    [job] = engine.claim("q", "w", 1)
    assert job.deadline == clock.now_ms() + 100
    clock.advance(100)  # now == deadline: still held
    assert engine.claim("q", "x", 1) == []
    assert engine.extend("q", "w", [1]).done == [1]
    clock.advance(101)  # now == new deadline + 1: reclaimable
    assert engine.ack("q", "w", [1]).skipped == [1]
    [again] = engine.claim("q", "x", 1)
    assert (again.seq, again.delivery) == (1, 2)


def test_a_nack_delay_ends_exactly_at_now_plus_delay(engine: Engine, clock: ManualClock) -> None:
    queue(engine, 1)
    engine.claim("q", "w", 1)
    engine.nack("q", "w", [1], delay_ms=50)
    clock.advance(49)
    assert engine.claim("q", "w", 1) == []
    clock.advance(1)
    assert [j.seq for j in engine.claim("q", "w", 1)] == [1]


def test_a_cohort_pass_splits_evenly_reclaimed_first(engine: Engine, clock: ManualClock) -> None:
    queue(engine, 50, lease_ms=10)
    engine.claim("q", "early", 4)  # seqs 1-4, left to expire
    clock.advance(11)
    grants = engine.claim_cohort("q", [ClaimRequest(f"w{i}", 10) for i in range(10)])
    assert [len(g) for g in grants] == [5] * 10
    dealt = sorted((j for g in grants for j in g), key=lambda j: j.seq)
    assert [j.seq for j in dealt] == list(range(1, 51))
    assert [j.delivery for j in dealt[:4]] == [2] * 4 and all(j.delivery == 1 for j in dealt[4:])
    assert {grants[i][0].seq for i in range(4)} == {1, 2, 3, 4}  # reclaimed dealt first


def test_a_cohort_share_follows_each_claimers_max(engine: Engine) -> None:
    queue(engine, 11)
    small, large = engine.claim_cohort("q", [ClaimRequest("s", 1), ClaimRequest("l", 21)])
    assert (len(small), len(large)) == (1, 10)  # 11 * 1/22 rounds up to 1 for the small one


def test_queue_routes_refuse_log_topics(engine: Engine) -> None:
    engine.put_topic("log", ConfigPatch())
    for call in (lambda: engine.claim("log", "w", 1), lambda: engine.ack("log", "w", [1]),
                 lambda: engine.nack("log", "w", [1]), lambda: engine.extend("log", "w", [1]),
                 lambda: engine.redrive("log")):  # fmt: skip
        with pytest.raises(TopicError) as refused:
            call()
        assert refused.value.code is ErrorCode.NOT_A_QUEUE and refused.value.status == 409


def test_jobs_removed_from_the_log_are_forgotten(engine: Engine, clock: ManualClock) -> None:
    queue(engine, 3, lease_ms=10)
    engine.claim("q", "w", 3)
    # A user's delete (docs/semantics/topics.md §7) of two leased jobs.
    engine.delete("q", before_seq=3)
    clock.advance(11)
    assert [j.seq for j in engine.claim("q", "w", 5)] == [3]
    assert engine.get_topic("q").queue == QueueCounts(
        0, 1, 0, earliest_lease_deadline=clock.now_ms() + 10
    )


def test_the_leases_log_is_trimmed_and_still_rebuilds(engine: Engine, clock: ManualClock) -> None:
    queue(engine, 0, lease_ms=1000)
    for _ in range(40):
        engine.append("q", [RecordIn.of(i) for i in range(500)])
        jobs = engine.claim("q", "w", 500)
        engine.ack("q", "w", [j.seq for j in jobs[:-1]])  # one job stays leased each round
    leases = engine.kernel.existing(leases_name("q"))
    assert leases.live_count < 12_000  # 40 000 events written, most of them trimmed
    engine.queues._projections.clear()  # rebuild from what the log kept
    assert engine.get_topic("q").queue == QueueCounts(
        0, 40, 0, earliest_lease_deadline=clock.now_ms() + 1000
    )
    clock.advance(1001)
    assert len(engine.claim("q", "x", 100)) == 40


def test_queue_config_is_reported_and_validated(engine: Engine) -> None:
    state, _ = engine.put_topic("q", ConfigPatch(), TopicType.QUEUE)
    config = msgspec.to_builtins(state)["config"]
    assert {k: config[k] for k in ("lease_ms", "max_deliveries", "dead_letter",
                                   "claim_jitter_ms", "leases_durable")} == {
        "lease_ms": 30_000, "max_deliveries": 0, "dead_letter": None, "claim_jitter_ms": 0,
        "leases_durable": False,
    }  # fmt: skip
    log_state = engine.put_topic("log", ConfigPatch())[0]
    assert "lease_ms" not in msgspec.to_builtins(log_state)["config"]
    with pytest.raises(TopicError) as refused:
        engine.put_topic("q", ConfigPatch(dead_letter="q"))
    assert refused.value.code is ErrorCode.INVALID_REQUEST


def test_acks_and_durable_leases_survive_a_restart(tmp_path: Path, clock: ManualClock) -> None:
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    queue(engine, 5, leases_durable=True, lease_ms=1000)
    assert engine.kernel.existing(leases_name("q")).config.durability.value == "disk"
    jobs = engine.claim("q", "w", 3)
    engine.ack("q", "w", [jobs[0].seq])
    store.sync_blocking()
    store.close()  # no seal: the WAL alone carries the delete and the lease events
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    try:
        assert engine.diff("q", 0).seqs == [2, 3, 4, 5]  # the acked job stays deleted
        assert engine.get_topic("q").queue == QueueCounts(
            2, 2, 0, earliest_lease_deadline=jobs[1].deadline
        )
        assert [j.seq for j in engine.claim("q", "x", 5)] == [4, 5]  # 2, 3 are still leased
        assert engine.ack("q", "w", [2]).done == [2]  # by the holder from before the restart
        store.seal(engine)
    finally:
        store.close()
    engine, store, _ = open_engine(
        StorageConfig(tmp_path), clock=clock
    )  # now from segments + flipped flags
    try:
        assert engine.diff("q", 0).seqs == [3, 4, 5]
    finally:
        store.close()


def park_one(engine: Engine) -> None:
    """A job dead-lettered into a full discard:reject topic: it is parked."""
    engine.put_topic("dlq", ConfigPatch(cap_records=1, discard=Discard.REJECT))
    engine.append("dlq", [RecordIn.of("already here")])
    queue(engine, 1, max_deliveries=1, dead_letter="dlq")
    engine.claim("q", "w", 1)
    engine.nack("q", "w", [1])
    assert engine.claim("q", "w", 1) == []


def test_a_parked_job_never_makes_a_pushed_worker_wake_at_once(
    engine: Engine, clock: ManualClock
) -> None:
    # /work waits until next_due: one in the past would have it claim in a loop.
    park_one(engine)

    def ahead() -> bool:
        due = engine.queues.next_due("q")
        return due is None or due > clock.now_ms()

    assert engine.queues.next_due("q") == clock.now_ms() + DEAD_LETTER_RETRY_MS
    for _ in range(3):
        clock.advance(DEAD_LETTER_RETRY_MS)
        assert ahead()  # due, yet no wake-up: the next claim pass (any) tries again
        assert engine.claim("q", "w", 1) == []
        assert ahead()
    assert engine.queues.dead_letter_refused == 4


def _counts(engine: Engine) -> QueueCounts:
    counts = engine.get_topic("q").queue
    assert counts is not None
    return counts


def test_parked_jobs_stay_parked_through_trimming_and_a_rebuild(
    engine: Engine, clock: ManualClock
) -> None:
    park_one(engine)
    for _ in range(10):  # enough events to trim the leases log past the parked event
        engine.append("q", [RecordIn.of(i) for i in range(500)])
        jobs = engine.claim("q", "w", 500)
        engine.ack("q", "w", [j.seq for j in jobs])
    engine.queues._projections.clear()
    assert _counts(engine).dead_letter_parked == 1
    engine.delete("dlq", before_seq=2)
    assert engine.claim("q", "w", 1) == []  # a rebuilt projection tries at once
    assert [r["data"] for r in engine.diff("dlq", 0).records()] == [0]
    assert _counts(engine).dead_lettered == 1


def test_a_parked_job_rebuilt_from_its_events_is_dead_lettered_once(engine: Engine) -> None:
    park_one(engine)
    engine.queues._projections.clear()  # replays claimed, released, parked for job 1
    engine.put_topic("dlq", ConfigPatch(cap_records=10))
    assert engine.claim("q", "w", 5) == []
    assert [r["data"] for r in engine.diff("dlq", 0).records()] == ["already here", 0]
    assert _counts(engine).dead_lettered == 1


def test_a_released_jobs_delivery_count_survives_trimming_and_a_rebuild(
    engine: Engine, clock: ManualClock
) -> None:
    queue(engine, 1, lease_ms=1000)
    engine.claim("q", "w", 1)
    engine.nack("q", "w", [1], delay_ms=60_000)
    for _ in range(10):  # the claimed event of job 1 is trimmed; its restatement stays
        engine.append("q", [RecordIn.of(i) for i in range(500)])
        jobs = engine.claim("q", "w", 500)
        assert 1 not in [j.seq for j in jobs]
        engine.ack("q", "w", [j.seq for j in jobs])
    engine.queues._projections.clear()
    assert engine.claim("q", "w", 1) == []  # still waiting out its nack delay
    clock.advance(60_000)
    [job] = engine.claim("q", "w", 1)
    assert (job.seq, job.delivery) == (1, 2)


def test_claims_and_the_lease_replay_are_not_consumption(engine: Engine) -> None:
    queue(engine, 3)
    engine.claim("q", "w", 2)
    engine.queues._projections.clear()  # the next pass replays the leases log
    assert len(engine.claim("q", "w", 2)) == 1
    # docs/semantics/topics.md §3: neither log was read by a consumer: no read time,
    # no recency bonus.
    for name in ("q", leases_name("q")):
        state = engine.get_topic(name, touch=False)
        assert (state.last_read_ts, state.effective_priority) == (0, 0)


def test_lease_ids_come_from_the_injected_id_source(clock: ManualClock, tmp_path: Path) -> None:
    # The queue is pure: its lease ids are drawn from the engine's IdSource, not from
    # os.urandom, so a restart replays them exactly and a test can predict them.
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock, ids=CountingIds())
    # The engine draws an in-memory instance id, then the new directory's replaces it.
    assert engine.instance == "0000000000000002"
    queue(engine, jobs=2, leases_durable=True)
    jobs = engine.claim("q", "n1", 2)
    assert [j.lease_id for j in jobs] == ["0000000000000003", "0000000000000004"]
    store.close()
    again, store, _ = open_engine(StorageConfig(tmp_path), clock=clock, ids=CountingIds())
    assert again.instance == "0000000000000002"  # read back, not drawn again
    assert again.ack("q", "n1", [jobs[1].seq], [jobs[1].lease_id]).done == [jobs[1].seq]
    store.close()
