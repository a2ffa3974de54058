"""Queues (docs/semantics/topics.md §10): lease-based job delivery layered on a topic of type
``queue``.

A queue is two logs. The jobs log is the topic itself. The leases log is an
internal companion topic, ``<queue>$leases`` (a ``$`` is never valid in a user
topic name, so nobody can create, write or read it through the API), holding one
record per lifecycle event: claimed, released, extended, acked, dead_lettered,
parked (a dead job the dead-letter topic refused).
The lease state — lease table, reclaim freelist, delivery counters — is the
:class:`Projection` of those events, held in memory and rebuilt from the leases
log the first time a queue is used after a restart. Because the leases log is an
ordinary topic it is journaled, sealed and recovered like any other, in
class ``memory`` unless the queue sets ``leases_durable``.

Pure like the engine: time is ``engine.clock``, and every live mutation is an
event appended to the leases log and then applied through the same
:meth:`Projection.apply` that a rebuild replays.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from ..protocol import (
    DeadLetterError,
    Durability,
    QueueCounts,
    Record,
    RecordIn,
    TopicConfig,
    TopicType,
)
from . import lease_events
from .errors import ErrorCode, TopicError
from .journal import DropFrame, TopicFrame
from .lease_events import (
    Acked,
    Claimed,
    DeadLettered,
    Extended,
    LeaseEvent,
    Parked,
    Released,
)
from .records import EncodedRecord
from .topic import Topic

if TYPE_CHECKING:
    from .journal import Commit
    from .topiclog import TopicLog

LEASES_SUFFIX = "$leases"
DEAD_LETTER_META = "$dead_letter_"
# Events kept in the leases log beyond those still needed before it is trimmed.
TRIM_SLACK = 4096
# Fresh jobs read from the jobs log per page of a claim pass.
CLAIM_PAGE = 1000
# Parked jobs (their dead-letter topic refused them) are tried again by the first claim
# pass this long after the last refusal: never a retry per claim (docs/queues.md).
DEAD_LETTER_RETRY_MS = 1000


def lease_expired(deadline: int, now: int) -> bool:
    """A lease is live through its deadline and reclaimable once now > deadline
    (docs/semantics/topics.md §10.6)."""
    return now > deadline


def leases_name(queue: str) -> str:
    return queue + LEASES_SUFFIX


def check_queue_config(name: str, config: TopicConfig) -> None:
    """A queue may not dead-letter into itself: the move would deliver the job again."""
    if config.dead_letter == name:
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            "a queue's dead_letter topic must be another topic",
            {"topic": name, "dead_letter": name},
        )


# --- the projection -------------------------------------------------------------------


@dataclass(slots=True)
class Lease:
    node: str
    lease_id: str
    deadline: int  # absolute ms; live while now <= deadline (docs/semantics/topics.md §10.6)


@dataclass(slots=True)
class JobState:
    """Lease state of a job claimed at least once and not yet acked or dead-lettered."""

    delivery: int
    lease: Lease | None = None  # None: released, on the reclaim freelist
    available_at: int = 0  # a nack's delay: not claimable before this
    event_seq: int = 0  # leases-log seq of its latest event: what trimming must keep


@dataclass(slots=True)
class Projection:
    """Who holds what: the materialized view of one queue instance's leases log."""

    epoch: int
    jobs: dict[int, JobState] = field(default_factory=dict)
    freelist: list[tuple[int, int]] = field(default_factory=list)  # heap of (available_at, seq)
    expiry: list[tuple[int, int, str]] = field(default_factory=list)  # (deadline, seq, lease_id)
    # The claim cursor: fresh jobs are those above it. It is not rebuilt from the log
    # (a rebuild starts at 0 and skips seqs with lease state) because an acked event
    # can outlive its jobs-log delete in a crash; a job is then redelivered, never lost.
    cursor: int = 0
    in_flight: int = 0
    dead_lettered: int = 0
    events_since_trim: int = 0
    # Dead jobs the dead-letter topic refused (full, missing): neither delivered nor
    # retried until a claim pass at or after retry_at. retry_at and the error are in
    # memory only: after a rebuild the first claim pass tries again and finds out.
    parked: set[int] = field(default_factory=set)
    retry_at: int = 0
    dead_letter_error: DeadLetterError | None = None

    def apply(self, event: LeaseEvent, event_seq: int) -> None:
        seq = event.seq
        self.dead_lettered = max(self.dead_lettered, event.dead_lettered)
        job = self.jobs.get(seq)
        if job is None:
            if not isinstance(event, Claimed | Released | Parked):
                return  # a later event for a job whose state is gone: nothing to undo
            # A claim starts a job's state; a released or parked restatement (_trim) may
            # have outlived the job's earlier events, and carries its state itself.
            job = self.jobs[seq] = JobState(event.delivery)
        match event:
            case Claimed():
                if job.lease is None:
                    self.in_flight += 1
                job.delivery = event.delivery
                job.lease = Lease(event.node, event.lease_id, event.deadline)
                heapq.heappush(self.expiry, (event.deadline, seq, event.lease_id))
            case Extended():
                if job.lease is not None:
                    job.lease.deadline = event.deadline
                    heapq.heappush(self.expiry, (event.deadline, seq, job.lease.lease_id))
            case Released():
                if job.lease is not None:
                    self.in_flight -= 1
                job.lease = None
                job.available_at = event.deadline
                heapq.heappush(self.freelist, (job.available_at, seq))
                self.parked.discard(seq)
            case Parked():
                self.parked.add(seq)  # off the freelist already: the claim pass popped it
            case Acked() | DeadLettered():
                if job.lease is not None:
                    self.in_flight -= 1
                del self.jobs[seq]
                self.parked.discard(seq)
        if seq in self.jobs:
            job.event_seq = event_seq

    def earliest_deadline(self) -> int | None:
        """The deadline of the oldest lease in flight, expired or not; None without one.

        The expiry heap keeps entries a later event superseded (an extend, a release,
        an ack); those at its top are dropped here, as the reclaim pass would skip them.
        """
        while self.expiry:
            deadline, seq, lease_id = self.expiry[0]
            job = self.jobs.get(seq)
            lease = job.lease if job is not None else None
            if lease is not None and lease.lease_id == lease_id and lease.deadline == deadline:
                return deadline
            heapq.heappop(self.expiry)
        return None

    def forget(self, seq: int) -> None:
        """Drop a job the jobs log no longer holds (TTL, cap or a user's delete)."""
        job = self.jobs.pop(seq, None)
        if job is not None and job.lease is not None:
            self.in_flight -= 1
        self.parked.discard(seq)

    def holder(self, seq: int, node: str, lease_id: str | None, now: int) -> Lease | None:
        """The live lease ``node`` holds on ``seq`` (matching ``lease_id`` when given)."""
        job = self.jobs.get(seq)
        lease = job.lease if job is not None else None
        if lease is None or lease.node != node or lease_expired(lease.deadline, now):
            return None
        if lease_id is not None and lease_id != lease.lease_id:
            return None  # a stale token: that lease was superseded (docs/semantics/topics.md §10.2)
        return lease

    def fresh(self, seq: int) -> bool:
        """Never leased (as far as the surviving events tell): the claim cursor may take it."""
        return seq not in self.jobs

    def next_due(self, now: int) -> int | None:
        """The earliest time a lease may expire, a delayed job become claimable or parked
        jobs be tried again (only a retry still ahead: one due waits for a claim pass)."""
        times = [t for heap in (self.freelist, self.expiry) if heap for t in (heap[0][0],)]
        if self.parked and self.retry_at > now:
            times.append(self.retry_at)
        return min(times) if times else None


# --- results --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    node: str
    max: int
    lease_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    seq: int
    record: bytes  # the job's wire JSON, as a diff returns it
    lease_id: str
    deadline: int
    delivery: int

    def to_json(self) -> bytes:
        """The wire record plus its lease: ``{..., "lease_id", "deadline", "delivery"}``."""
        return self.record[:-1] + b',"lease_id":"%b","deadline":%d,"delivery":%d}' % (
            self.lease_id.encode(),
            self.deadline,
            self.delivery,
        )


@dataclass(frozen=True, slots=True)
class Settled:
    """An ack, nack or extend: the seqs it applied to and those it skipped."""

    done: list[int]
    skipped: list[int]
    deadlines: list[int] | None = None  # extend: each done seq's new deadline
    commit: Commit | None = None  # an ack of an fsync queue is acknowledged once durable
    must_sync: bool = False


@dataclass(frozen=True, slots=True)
class Redriven:
    seqs: list[int]  # the jobs' new seqs in the source queue
    commit: Commit | None = None
    must_sync: bool = False


# --- the queue layer ------------------------------------------------------------------


class Queues:
    def __init__(self, engine: TopicLog) -> None:
        self.engine = engine
        self._projections: dict[str, Projection] = {}
        self.dead_letter_refused = 0  # claim passes whose dead-letter move was refused

    # --- hooks from the engine ---------------------------------------------------------
    def configured(self, topic: Topic) -> None:
        """A queue was created or reconfigured: give its leases log the right class."""
        engine = self.engine
        name = leases_name(topic.name)
        kernel = engine.kernel
        kernel.finish_replay(name)  # a reconfiguration applies after every replayed event
        config = _leases_config(topic.config)
        leases = kernel.get(name)
        now = engine.clock.now_ms()
        if leases is None:
            kernel.create(Topic(name, TopicType.LOG, config, kernel.next_epoch(), now))
        elif leases.config != config:
            kernel.write(name, TopicFrame.of(name, leases.type, leases.epoch, config,
                                             leases.created_ts).encode())  # fmt: skip
            leases.reconfigure(config, now)

    def dropped(self, topic: Topic) -> None:
        """A queue was deleted: its leases log and lease state go with it."""
        self._projections.pop(topic.name, None)
        name = leases_name(topic.name)
        leases = self.engine.kernel.drop(name)
        if leases is not None:
            self.engine.kernel.write(name, DropFrame(name, leases.epoch).encode())

    def counts(self, topic: Topic) -> QueueCounts:
        """The queue object of a topic's state (docs/semantics/topics.md §10.5). in_flight
        counts leases not yet reclaimed; an expired lease is reclaimed lazily by the next
        claim pass. dead_letter_parked counts dead jobs the dead-letter topic refused, and
        dead_letter_error is its last refusal while any are parked."""
        p = self._projection(topic)
        return QueueCounts(
            ready=max(0, topic.live_count - p.in_flight - len(p.parked)),
            in_flight=p.in_flight,
            dead_lettered=p.dead_lettered,
            dead_letter_parked=len(p.parked),
            dead_letter_error=p.dead_letter_error if p.parked else None,
            earliest_lease_deadline=p.earliest_deadline(),
        )

    def parked(self) -> int:
        """Parked jobs across the queues whose lease state is loaded (for /metrics)."""
        return sum(len(p.parked) for p in self._projections.values())

    def jitter_ms(self, name: str) -> int:
        """The queue's coalescing window (404 if missing, 409 not_a_queue on a log)."""
        return self._queue(name).config.claim_jitter_ms

    def next_due(self, name: str) -> int | None:
        """When a lease of ``name`` may expire or a delayed nack become claimable."""
        topic = self.engine.kernel.get(name)
        if topic is None or topic.type is not TopicType.QUEUE:
            return None
        return self._projection(topic).next_due(self.engine.clock.now_ms())

    def holds(self, name: str, seq: int, node: str, lease_id: str) -> bool:
        topic = self.engine.kernel.get(name)
        if topic is None or topic.type is not TopicType.QUEUE:
            return False
        lease = self._projection(topic).holder(seq, node, lease_id, self.engine.clock.now_ms())
        return lease is not None

    # --- claim (docs/semantics/topics.md §10.3) --------------------------------------------------
    def claim(self, name: str, requests: Sequence[ClaimRequest]) -> list[list[ClaimedJob]]:
        """One coordinator pass: expire, drain the freelist, then fresh jobs by the claim
        cursor, and share what was found across ``requests`` in proportion to their max."""
        for request in requests:
            _check_claim(request)
        topic = self._queue(name)
        self._check_available(topic)
        now = self.engine.clock.now_ms()
        p = self._projection(topic)
        self._expire(topic, p, now)
        events: list[LeaseEvent] = []
        wanted = sum(r.max for r in requests)
        picked, dead = self._reclaimable(topic, p, wanted, now)
        picked += self._fresh(topic, p, wanted - len(picked), now)
        grants: list[list[ClaimedJob]] = [[] for _ in requests]
        owners = _deal(len(picked), [r.max for r in requests])
        for (seq, record, delivery), owner in zip(picked, owners, strict=True):
            request = requests[owner]
            lease_id = self.engine.ids.token(8)
            deadline = now + (request.lease_ms or topic.config.lease_ms)
            events.append(_event(Claimed, p, seq, request.node, lease_id, deadline, delivery))
            grants[owner].append(ClaimedJob(seq, record, lease_id, deadline, delivery))
        moved, parked, released = self._dead_letter(topic, p, dead, now)
        for count, (seq, delivery) in enumerate(moved, p.dead_lettered + 1):
            events.append(_event(DeadLettered, p, seq, "", "", now, delivery, count))
        events += [_event(Parked, p, seq, "", "", now, delivery) for seq, delivery in parked]
        events += [_event(Released, p, seq, "", "", now, d) for seq, d in released]
        self._record(topic, p, events)
        if moved:
            self.engine.delete_seqs(name, [seq for seq, _ in moved])
        return grants

    def _expire(self, topic: Topic, p: Projection, now: int) -> None:
        """Lazy visibility timeout (docs/semantics/topics.md §10.6): leases past their deadline
        are released onto the freelist, recorded before this pass hands the jobs out again."""
        events = []
        released: set[int] = set()  # the heap may hold one lease twice (an extend to the
        while p.expiry and lease_expired(p.expiry[0][0], now):  # same deadline, a restatement)
            deadline, seq, lease_id = heapq.heappop(p.expiry)
            job = p.jobs.get(seq)
            lease = job.lease if job is not None else None
            if (
                job is None
                or lease is None
                or lease.lease_id != lease_id
                or lease.deadline != deadline
            ):
                continue  # superseded by an extend, an ack or a later claim
            if seq in released:
                continue
            released.add(seq)
            events.append(_event(Released, p, seq, lease.node, lease_id, now, job.delivery))
        self._record(topic, p, events)

    def _reclaimable(
        self, topic: Topic, p: Projection, wanted: int, now: int
    ) -> tuple[list[tuple[int, bytes, int]], list[tuple[int, bytes, int]]]:
        """Drain the reclaim freelist first (docs/semantics/topics.md §10.3); jobs past
        max_deliveries go to ``dead``."""
        config = topic.config
        limit = config.max_deliveries if config.dead_letter is not None else 0
        picked: list[tuple[int, bytes, int]] = []
        dead: list[tuple[int, bytes, int]] = []
        taken: set[int] = set()  # a job may sit on the freelist twice with the same time
        while len(picked) < wanted and p.freelist and p.freelist[0][0] <= now:
            available_at, seq = heapq.heappop(p.freelist)
            job = p.jobs.get(seq)
            if job is None or job.lease is not None or job.available_at != available_at:
                continue  # a stale entry: the job was claimed, acked or released again since
            if seq in p.parked:
                continue  # a rebuild replayed its release before its parking
            if seq in taken:
                continue
            taken.add(seq)
            record = _read_one(topic, seq, now)
            if record is None:
                p.forget(seq)
                continue
            if limit and job.delivery >= limit:
                dead.append((seq, record, job.delivery))
            else:
                picked.append((seq, record, job.delivery + 1))
        return picked, dead

    def _fresh(
        self, topic: Topic, p: Projection, wanted: int, now: int
    ) -> list[tuple[int, bytes, int]]:
        """Never-leased jobs, in seq order from the claim cursor."""
        picked: list[tuple[int, bytes, int]] = []
        page_size = min(wanted, CLAIM_PAGE)  # a page costs a copy per record: read no more
        while wanted > len(picked):
            page = topic.read(p.cursor, page_size, None, None, now, True)
            page_size = CLAIM_PAGE  # seqs with lease state were skipped: read on in bulk
            cursor = page.next_from_seq
            for run, seq in zip(page.runs, page.seqs, strict=True):
                if len(picked) == wanted:
                    cursor = seq - 1
                    break
                if p.fresh(seq):
                    picked.append((seq, bytes(run[:-1]), 1))
            stalled = cursor <= p.cursor
            p.cursor = max(p.cursor, cursor)
            if stalled or (page.caught_up and cursor >= page.next_from_seq):
                break
        return picked

    def _dead_letter(
        self, topic: Topic, p: Projection, dead: list[tuple[int, bytes, int]], now: int
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
        """Move dead jobs to the dead-letter topic (docs/semantics/topics.md §10.7), parked ones
        first when their retry is due; returns (seq, delivery) of those moved, newly
        parked and released.

        The copy is appended before the job is deleted, so a crash in between leaves a
        duplicate, never a loss. Jobs the dead-letter topic refuses (full, missing) are
        parked: not delivered again, and tried again by the first claim pass
        DEAD_LETTER_RETRY_MS after the refusal, so a broken dead-letter topic costs one
        append attempt per interval, never one per claim. Until then new dead jobs join
        the parked ones untried, keeping their order. A parked job that the queue no
        longer dead-letters (dead_letter or max_deliveries changed) is released.
        """
        if p.parked and now < p.retry_at:
            return [], [(seq, delivery) for seq, _, delivery in dead], []
        config = topic.config
        limit = config.max_deliveries if config.dead_letter is not None else 0
        jobs: list[tuple[int, bytes, int]] = []
        released: list[tuple[int, int]] = []
        for seq in sorted(p.parked):
            delivery = p.jobs[seq].delivery
            record = _read_one(topic, seq, now)
            if record is None:
                p.forget(seq)  # deleted from the jobs log while parked
            elif limit and delivery >= limit:
                jobs.append((seq, record, delivery))
            else:
                released.append((seq, delivery))
        jobs += dead
        if not jobs:
            return [], [], released
        done = self._move(topic, p, jobs, now)
        moved = [(seq, delivery) for seq, _, delivery in jobs[:done]]
        parked = [(seq, delivery) for seq, _, delivery in jobs[done:] if seq not in p.parked]
        return moved, parked, released

    def _move(self, topic: Topic, p: Projection, jobs: list[tuple[int, bytes, int]],
              now: int) -> int:  # fmt: skip
        """Append the dead letters of ``jobs``, in order; how many were appended (a
        prefix). An append is atomic, so a refused batch is retried one by one: a full
        dead-letter topic fills up to its cap, then the rest waits."""
        records = [_dead_letter_record(topic.name, *job) for job in jobs]
        assert topic.config.dead_letter is not None
        target = topic.config.dead_letter
        try:
            self.engine.append(target, records)
            return len(records)
        except TopicError as error:
            refused = error
        done = 0
        if len(records) > 1:
            for record in records:
                try:
                    self.engine.append(target, [record])
                except TopicError as error:
                    refused = error
                    break
                done += 1
            if done == len(records):
                return done
        self.dead_letter_refused += 1
        p.retry_at = now + DEAD_LETTER_RETRY_MS
        p.dead_letter_error = DeadLetterError(
            code=str(refused.code), message=refused.message, topic=target, ts=now
        )
        return done

    # --- ack, nack, extend (docs/semantics/topics.md §10.2, §10.5, §10.6) ----------------------
    def ack(
        self, name: str, node: str, seqs: Sequence[int], lease_ids: Sequence[str] | None
    ) -> Settled:
        """Release and permanently delete the jobs ``node`` holds; skip the others."""
        topic, p, now, held, skipped = self._held(name, node, seqs, lease_ids)
        events = [_event(Acked, p, s, node, lease.lease_id, now, p.jobs[s].delivery)
                  for s, lease in held]  # fmt: skip
        self._record(topic, p, events)
        done = [s for s, _ in held]
        if not done:
            return Settled(done, skipped)
        self.engine.delete_seqs(name, done)
        must_sync = topic.config.durability is Durability.FSYNC
        return Settled(done, skipped, None, self.engine.commit_point(name), must_sync)

    def nack(
        self,
        name: str,
        node: str,
        seqs: Sequence[int],
        lease_ids: Sequence[str] | None,
        delay_ms: int,
    ) -> Settled:
        """Release early; the jobs are claimable again after ``delay_ms``."""
        if delay_ms < 0:
            raise TopicError(ErrorCode.INVALID_REQUEST, "delay_ms is 0 or more")
        topic, p, now, held, skipped = self._held(name, node, seqs, lease_ids)
        at = now + delay_ms
        events = [_event(Released, p, s, node, lease.lease_id, at, p.jobs[s].delivery)
                  for s, lease in held]  # fmt: skip
        self._record(topic, p, events)
        if events:
            self.engine.kernel.commit(topic)
        return Settled([s for s, _ in held], skipped)

    def extend(
        self,
        name: str,
        node: str,
        seqs: Sequence[int],
        lease_ids: Sequence[str] | None,
        lease_ms: int | None,
    ) -> Settled:
        """Heartbeat: a new deadline now + lease_ms; the delivery counter is untouched."""
        if lease_ms is not None and lease_ms < 1:
            raise TopicError(ErrorCode.INVALID_REQUEST, "lease_ms is at least 1")
        topic, p, now, held, skipped = self._held(name, node, seqs, lease_ids)
        deadline = now + (lease_ms or topic.config.lease_ms)
        events = [_event(Extended, p, s, node, lease.lease_id, deadline,
                         p.jobs[s].delivery) for s, lease in held]  # fmt: skip
        self._record(topic, p, events)
        return Settled([s for s, _ in held], skipped, [deadline] * len(held))

    def _held(
        self, name: str, node: str, seqs: Sequence[int], lease_ids: Sequence[str] | None
    ) -> tuple[Topic, Projection, int, list[tuple[int, Lease]], list[int]]:
        if lease_ids is not None and len(lease_ids) != len(seqs):
            raise TopicError(
                ErrorCode.INVALID_REQUEST,
                "lease_ids, when given, has one entry per seq",
                {"seqs": len(seqs), "lease_ids": len(lease_ids)},
            )
        topic = self._queue(name)
        self._check_available(topic)
        now = self.engine.clock.now_ms()
        p = self._projection(topic)
        held: list[tuple[int, Lease]] = []
        skipped: list[int] = []
        seen: set[int] = set()
        for i, seq in enumerate(seqs):
            lease = p.holder(seq, node, lease_ids[i] if lease_ids else None, now)
            if lease is None or seq in seen:
                skipped.append(seq)  # not (or no longer) this node's: idempotent skip
            else:
                seen.add(seq)
                held.append((seq, lease))
        return topic, p, now, held, skipped

    # --- redrive ----------------------------------------------------------------------------
    def redrive(self, name: str, max_jobs: int) -> Redriven:
        """Move up to ``max_jobs`` dead letters of queue ``name`` back into it, as new jobs.

        Reads the queue's dead_letter topic for records whose provenance names this
        queue, appends them to the queue without the ``$dead_letter_*`` meta, then
        permanently deletes them from the dead-letter topic (append first: a crash in
        between duplicates, never loses).
        """
        if max_jobs < 1:
            raise TopicError(ErrorCode.INVALID_REQUEST, "max is at least 1")
        topic = self._queue(name)
        target = topic.config.dead_letter
        source = None if target is None else self.engine.kernel.get(target)
        if target is None or source is None:  # no source without a target
            return Redriven([])
        now = self.engine.clock.now_ms()
        moved: list[int] = []
        records: list[RecordIn] = []
        cursor = 0
        while len(records) < max_jobs:
            page = source.read(cursor, CLAIM_PAGE, None, None, now, True)
            for run in page.runs:
                letter = _stored_record.decode(run[:-1])
                meta = letter.meta or {}
                if meta.get(f"{DEAD_LETTER_META}queue") != name or len(records) == max_jobs:
                    continue
                kept = {k: v for k, v in meta.items() if not k.startswith(DEAD_LETTER_META)}
                records.append(RecordIn(letter.data, tag=letter.tag, node=letter.node,
                                        meta=kept or None))  # fmt: skip
                moved.append(letter.seq)
            if page.caught_up or page.next_from_seq == cursor:
                break
            cursor = page.next_from_seq
        if not records:
            return Redriven([])
        result = self.engine.append(name, records)
        self.engine.delete_seqs(target, moved)
        return Redriven(list(result.seqs), result.commit, result.must_sync)

    # --- internals ----------------------------------------------------------------------
    def _queue(self, name: str) -> Topic:
        topic = self.engine.kernel.existing(name)
        if topic.type is not TopicType.QUEUE:
            raise TopicError(
                ErrorCode.NOT_A_QUEUE,
                f'topic {name!r} is a log, not a queue; create it with type "queue"',
                {"topic": name, "type": str(topic.type)},
            )
        return topic

    def _check_available(self, topic: Topic) -> None:
        # Checked before the projection changes: a pass never half-happens on a full disk.
        journal = self.engine.journal
        if journal is not None:
            journal.check_available(topic.name)
            journal.check_available(leases_name(topic.name))

    def _projection(self, topic: Topic) -> Projection:
        p = self._projections.get(topic.name)
        if p is None or p.epoch != topic.epoch:
            p = self._projections[topic.name] = self._rebuild(topic)
        return p

    def _rebuild(self, topic: Topic) -> Projection:
        """Replay the surviving lease events (docs/semantics/topics.md §10.1). Lost events are
        self-healing: a job without a replayed live lease is simply claimable again
        (docs/semantics/topics.md §10.6)."""
        p = Projection(topic.epoch)
        name = leases_name(topic.name)
        # from every event that survived, not those applied so far
        self.engine.kernel.finish_replay(name)
        leases = self.engine.kernel.get(name)
        if leases is None:
            return p
        now = self.engine.clock.now_ms()
        cursor = 0
        while True:
            page = leases.read(cursor, CLAIM_PAGE, None, None, now, True)
            for run, seq in zip(page.runs, page.seqs, strict=True):
                event = lease_events.decode_stored(run[:-1])  # (a run ends in a comma)
                if event.epoch == topic.epoch:
                    p.apply(event, seq)
            if page.caught_up or page.next_from_seq == cursor:
                return p
            cursor = page.next_from_seq

    def _record(self, topic: Topic, p: Projection, events: list[LeaseEvent]) -> None:
        """Append events to the leases log, then apply them to the projection."""
        if not events:
            return
        name = leases_name(topic.name)
        if name not in self.engine.kernel:
            self.configured(topic)
        encoded = []
        for event in events:
            data = lease_events.encode(event)
            encoded.append(EncodedRecord(b',"data":%b}' % data, len(data), None, None, None))
        result = self.engine.append_encoded(name, encoded)
        for event, seq in zip(events, result.seqs, strict=True):
            p.apply(event, seq)
        p.events_since_trim += len(events)
        if p.events_since_trim > TRIM_SLACK + 2 * len(p.jobs):
            self._trim(topic, p)

    def _trim(self, topic: Topic, p: Projection) -> None:
        """Keep the leases log about as long as the live lease state, not its history.

        Jobs whose latest event is old are restated (the same lease, or the same
        freelist place) so one long-held lease never pins the log; then every event
        below the oldest one still needed is deleted (docs/semantics/topics.md §7).
        """
        p.events_since_trim = 0
        name = leases_name(topic.name)
        leases = self.engine.kernel.existing(name, replay=False)
        horizon = leases.next_seq - TRIM_SLACK
        restate = []
        for seq, job in p.jobs.items():
            if job.event_seq >= horizon:
                continue
            if job.lease is not None:
                lease = job.lease
                restate.append(_event(Claimed, p, seq, lease.node, lease.lease_id,
                                      lease.deadline, job.delivery))  # fmt: skip
            elif seq in p.parked:
                restate.append(_event(Parked, p, seq, "", "", job.available_at, job.delivery))
            else:
                restate.append(_event(Released, p, seq, "", "", job.available_at, job.delivery))
        self._record(topic, p, restate)
        keep = min((job.event_seq for job in p.jobs.values()), default=leases.next_seq)
        if keep > leases.earliest_seq:
            self.engine.delete(name, before_seq=keep)


def _leases_config(queue: TopicConfig) -> TopicConfig:
    durability = queue.durability if queue.leases_durable else Durability.MEMORY
    return TopicConfig(
        durability=durability, idempotency_window_ms=0, auto_priority=False, auto_create=False
    )


def _event(
    kind: type[LeaseEvent],
    p: Projection,
    seq: int,
    node: str,
    lease_id: str,
    deadline: int,
    delivery: int,
    dead_lettered: int | None = None,
) -> LeaseEvent:
    # A released event's deadline is when the job becomes claimable again.
    total = p.dead_lettered if dead_lettered is None else dead_lettered
    return kind(p.epoch, seq, node, lease_id, deadline, delivery, total)


# A stored record with its data kept as the stored bytes: a dead letter and a redriven
# job carry the job's data byte for byte (decoding it would turn 2**64+1 into a float,
# and data a reader cannot decode would fail the claim pass that moves it).
_stored_record = msgspec.json.Decoder(Record[msgspec.Raw])


def _dead_letter_record(queue: str, seq: int, record: bytes, delivery: int) -> RecordIn:
    """The dead letter of a job: its tag, node, meta and data, plus its provenance."""
    job = _stored_record.decode(record)
    meta = {
        **(job.meta or {}),
        f"{DEAD_LETTER_META}queue": queue,
        f"{DEAD_LETTER_META}seq": str(seq),
        f"{DEAD_LETTER_META}deliveries": str(delivery),
        f"{DEAD_LETTER_META}reason": "max_deliveries",
    }
    return RecordIn(job.data, tag=job.tag, node=job.node, meta=meta)


def _read_one(topic: Topic, seq: int, now: int) -> bytes | None:
    """The job's wire record, or None if the jobs log no longer holds it."""
    if seq < topic.earliest_seq or seq > topic.head_seq:
        return None
    page = topic.read(seq - 1, 1, None, None, now, True)
    if page.seqs and page.seqs[0] == seq:
        return bytes(page.runs[0][:-1])
    return None


def _check_claim(request: ClaimRequest) -> None:
    if request.max < 1:
        raise TopicError(ErrorCode.INVALID_REQUEST, "max is at least 1", {"max": request.max})
    if request.lease_ms is not None and request.lease_ms < 1:
        raise TopicError(ErrorCode.INVALID_REQUEST, "lease_ms is at least 1")


def _deal(available: int, maxes: list[int]) -> list[int]:
    """Owner index of each of ``available`` jobs, shared in proportion to ``maxes``.

    Shares are the largest-remainder apportionment of ``available`` (never above a
    claimer's max); the jobs are then dealt round-robin, so each claimer gets a
    spread of the freelist-first order rather than a contiguous block.
    """
    total = sum(maxes)
    if available >= total:
        shares = list(maxes)
    else:
        exact = [available * m / total for m in maxes]
        shares = [int(x) for x in exact]
        order = sorted(range(len(maxes)), key=lambda i: (shares[i] - exact[i], i))
        for i in order[: available - sum(shares)]:
            shares[i] += 1
    owners: list[int] = []
    left = list(shares)
    while len(owners) < available:
        for i, n in enumerate(left):
            if n:
                owners.append(i)
                left[i] -= 1
    return owners
