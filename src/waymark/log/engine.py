"""The topic log engine: synchronous, in-process, no I/O.

The engine owns every topic, through its :class:`~waymark.log.kernel.Kernel` (the
topic table, epochs, journal and listeners, which queues, routers, writers, replay
and sealing use too). Every mutation is validated first, then handed to the journal
as frame bytes (when the engine has one), then applied: a mutation that fails
validation, or that the journal cannot take, changes nothing. Callers that wake on
new data register a listener with :meth:`Engine.add_listener`; it runs synchronously
after each commit.

Durability classes (docs/semantics/topics.md §2.2) decide what reaches the journal and
what an acknowledgement waits for; results carry the :class:`~waymark.log.journal.Commit`
to wait on and whether the class requires waiting.
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from ..clock import Clock, IdSource, RandomIds, SystemClock
from ..protocol import (
    CheckpointData,
    ConfigPatch,
    DeleteResponse,
    Durability,
    PublishResponse,
    RecordIn,
    TopicConfig,
    TopicState,
    TopicType,
    WriterState,
)
from .changes import CHANGES_TOPIC, Changes, deleted_keys, dropped_keys
from .config import EngineConfig
from .deletion import TagMatch
from .errors import ErrorCode, TopicError
from .journal import (
    BodyRun,
    Commit,
    DeleteFrame,
    DropFrame,
    HeadFrame,
    Journal,
    PublishFrame,
    TopicFrame,
    records_frame_parts,
)
from .kernel import Kernel, Listener
from .origin import Derived, Origin, Published, StagedChunks
from .prebuilt import Layout, Prebuilt
from .priority import effective_priority
from .queue import (
    ClaimedJob,
    ClaimRequest,
    Queues,
    Redriven,
    Settled,
    check_queue_config,
    leases_name,
)
from .records import EncodedRecord, PlainRecords, Records, check_topic_name, encode_batch
from .results import AppendResult, DeleteResult, DiffResult
from .router import Forwarded, Router, Routers
from .topic import Hole, Topic
from .writers import PartKey, Writers

if TYPE_CHECKING:
    from .gradual import GradualReplay


class Engine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        clock: Clock | None = None,
        journal: Journal | None = None,
        ids: IdSource | None = None,
    ) -> None:
        config = config or EngineConfig()
        self.clock = clock or SystemClock()
        self.ids = ids or RandomIds()  # lease ids, the instance id
        self.kernel = Kernel(journal)
        self.defaults = config.defaults or TopicConfig()
        self.limits = config.limits
        self.writers = Writers(self)  # exactly-once sinks: stage, then publish atomically
        self.queues = Queues(self)  # lease state of queue topics (docs/semantics/topics.md §10)
        self.routers = Routers(self)  # forwarding rules and cursors (docs/semantics/topics.md §8)
        # Topics whose ceiling leads their head or is not durable yet: what trim_ceilings
        # looks at, so its cost follows the topics written lately, not all of them.
        self._ahead: dict[str, int] = {}  # name -> epoch of the instance
        # Committed changes per key, for change checkpoints
        # (docs/semantics/recovery.md §1); None until track_changes.
        self.changes: Changes | None = None
        # Names this engine's history, which checkpoint ids count in: a new one per
        # in-memory engine, the data directory's for a restored one
        # (docs/semantics/recovery.md §3.5).
        self.instance = self.ids.token(8)

    @property
    def journal(self) -> Journal | None:
        return self.kernel.journal

    @journal.setter
    def journal(self, journal: Journal | None) -> None:
        self.kernel.journal = journal

    @property
    def replaying(self) -> GradualReplay | None:
        """memory topics whose WAL frames replay set aside; applied before any use
        (docs/semantics/topics.md §2.2)."""
        return self.kernel.replaying

    @replaying.setter
    def replaying(self, replaying: GradualReplay | None) -> None:
        self.kernel.replaying = replaying

    def replay_pending(self) -> list[str]:
        """The topics gradual replay still holds, in the order their first frame was read
        (none once it is done)."""
        replaying = self.kernel.replaying
        return [] if replaying is None else replaying.names()

    def replay_step(self, name: str) -> bool:
        """Apply one step of what gradual replay holds for ``name``; whether more is left."""
        replaying = self.kernel.replaying
        return replaying is not None and replaying.step_topic(name)

    def replay_backlog(self) -> tuple[int, int]:
        """The topics and WAL frames gradual replay has yet to apply (0, 0: none)."""
        replaying = self.kernel.replaying
        return (0, 0) if replaying is None else (replaying.topics, replaying.frames)

    # --- topics -----------------------------------------------------------------
    @property
    def topic_count(self) -> int:
        """Topics a user made (internal logs are not counted)."""
        return self.kernel.user_topics

    def list_topics(
        self,
        *,
        after: str | None = None,
        limit: int | None = None,
        visible: Callable[[str], bool] | None = None,
    ) -> list[TopicState]:
        """The states of topics named after ``after`` (all: None), sorted by name, at
        most ``limit`` of them, only those ``visible`` admits; a queue's internal leases
        log is not one. Only the page's states are built: a state costs far more than
        its name (docs/http-api.md, listing topics)."""
        now = self.clock.now_ms()
        names = sorted(n for n in self.kernel.names() if "$" not in n)
        if after is not None:
            names = names[bisect.bisect_right(names, after) :]
        if visible is not None:
            names = [n for n in names if visible(n)]
        if limit is not None:
            names = names[:limit]
        get = self.kernel.get
        return [self._state(t, now) for n in names if (t := get(n)) is not None]

    def _check_room(self, name: str) -> None:
        """Refuse a new topic past ``Limits.max_topics`` (docs/security.md, Limits)."""
        limit = self.limits.max_topics
        if self.kernel.user_topics >= limit:  # internal logs do not count
            raise TopicError(
                ErrorCode.TOO_MANY_TOPICS,
                f"the server holds its limit of {limit} topics",
                {"topic": name, "max_topics": limit},
            )

    def put_topic(
        self, name: str, patch: ConfigPatch, topic_type: TopicType | None = None
    ) -> tuple[TopicState, bool]:
        """Create or update a topic; returns (state, created). The type is immutable:
        a different type for an existing topic is 409 topic_exists_incompatible."""
        check_topic_name(name)
        now = self.clock.now_ms()
        kernel = self.kernel
        kernel.finish_replay(name)
        topic = kernel.get(name)
        if topic is None:
            self._check_room(name)
            config = self.defaults.apply(patch)
            if topic_type is TopicType.QUEUE:
                check_queue_config(name, config)
            topic = Topic(name, topic_type or TopicType.LOG, config, kernel.next_epoch(), now)
            with self._admit(topic):
                kernel.create(topic)
                if topic.type is TopicType.QUEUE:
                    self.queues.configured(topic)
            kernel.commit(topic)
            return self._state(topic, now), True
        if topic_type is not None and topic_type is not topic.type:
            raise TopicError(
                ErrorCode.TOPIC_EXISTS_INCOMPATIBLE,
                f"topic {name!r} exists with type {topic.type!s}; a topic's type never changes",
                {"topic": name, "type": str(topic.type), "requested": str(topic_type)},
            )
        owner = topic.config.owner
        if patch.owner is not UNSET and owner is not UNSET and patch.owner != owner:
            # An owned topic is never claimed by another (docs/semantics/topics.md §2.2).
            raise TopicError(
                ErrorCode.TOPIC_EXISTS_INCOMPATIBLE,
                f"topic {name!r} is owned by {owner!r}; {patch.owner!r} cannot claim it",
                {"topic": name, "reason": "topic_owned", "owner": owner,
                 "requested": patch.owner},
            )  # fmt: skip
        config = topic.config.apply(patch)
        if topic.type is TopicType.QUEUE:
            check_queue_config(name, config)
        frame = TopicFrame.of(name, topic.type, topic.epoch, config, topic.created_ts, now=now)
        with self._admit(topic):
            kernel.write(name, frame.encode())
            topic.reconfigure(config, now)
            if topic.type is TopicType.QUEUE:
                self.queues.configured(topic)
        kernel.commit(topic)
        return self._state(topic, now), False

    def get_topic(self, name: str, *, touch: bool = True) -> TopicState:
        """State of a topic (404 topic_not_found); ``touch`` counts as consumption
        (docs/semantics/topics.md §3)."""
        topic = self.kernel.existing(name, replay=False)  # a recovering topic says so
        now = self.clock.now_ms()
        if touch:
            topic.consumed(now)
        return self._state(topic, now)

    def delivery_priority(self, name: str, now: int, enqueued_at: int) -> int:
        """The effective priority of delivery work for ``name`` waiting since
        ``enqueued_at`` (docs/topics.md, Priority): the topic's manual priority and
        consumer recency, plus that work's own aging. A recovering topic counts with the
        config it is recovering to; a topic gone meanwhile with none (its work finds it
        gone)."""
        topic = self.kernel.get(name)
        if topic is None:
            return effective_priority(None, False, now, 0, enqueued_at)
        config = topic.config
        replaying = self.replaying
        if replaying is not None and replaying.holds(topic):
            config = replaying.config(topic)
        return effective_priority(
            config.priority, config.auto_priority, now, topic.last_consumed_at, enqueued_at
        )

    def delete_topic(self, name: str) -> None:
        """Tear a topic down: records, tag index, dedupe state (404 if missing)."""
        kernel = self.kernel
        topic = kernel.existing(name, replay=False)  # what is still set aside never applies
        with self._admit(topic):  # a queue's drop drops its leases log too
            commit = kernel.write(name, DropFrame(name, topic.epoch, topic.next_seq).encode())
            if topic.type is TopicType.QUEUE:
                self.queues.dropped(topic)
        kernel.drop(name)
        if topic.head_seq > 0 and (changes := self.changes_of(topic)) is not None:
            # A drop's version is the instance's next seq, which it never hands out: later
            # than every change of the instance (docs/semantics/recovery.md §1.3).
            changes.removed(topic, dropped_keys(topic), topic.next_seq, commit)
        # Its routers go with it (docs/semantics/topics.md §8.6).
        self.routers.topic_dropped(name, topic.epoch)
        kernel.commit(topic)

    # --- records ----------------------------------------------------------------
    def append(
        self,
        name: str,
        records: Sequence[RecordIn],
        *,
        create: bool | None = None,
        config: ConfigPatch | None = None,
    ) -> AppendResult:
        """Append atomically: all records get contiguous seqs, or none is stored.

        ``create`` None follows the topic defaults' ``auto_create``; ``config`` is
        applied only when this write creates the topic.
        """
        return self.append_encoded(name, self.encode(records), create=create, config=config)

    def encode(self, records: Sequence[RecordIn]) -> list[EncodedRecord]:
        """Validate a write's records and encode their bodies, as :meth:`append` does
        first. It reads only the engine's fixed limits, so it may run on another thread:
        the server validates a large body there, off the event loop (docs/security.md,
        Limits), and appends the result with :meth:`append_encoded`."""
        if not records:
            raise TopicError(ErrorCode.INVALID_REQUEST, "a write carries at least one record")
        if len(records) > self.limits.max_records_per_write:
            raise TopicError(
                ErrorCode.TOO_MANY_RECORDS,
                f"a write carries at most {self.limits.max_records_per_write} records",
                {"records": len(records), "max_records": self.limits.max_records_per_write},
            )
        return encode_batch(records, self.limits)

    # --- staged sink writes: waymark.log.writers publishes through here ------------
    def append_encoded(
        self,
        name: str,
        encoded: Records,
        *,
        create: bool | None = None,
        config: ConfigPatch | None = None,
        origin: Origin | None = None,
        prebuilt: Prebuilt | None = None,
        staged: StagedChunks | None = None,
    ) -> AppendResult:
        """The atomic append of already validated records (see :meth:`append`).

        ``origin`` (:mod:`waymark.log.origin`): a sink batch :class:`Published` by
        :mod:`waymark.log.writers` is many staged parts committed together, so it is not
        bound by ``max_records_per_write``, and its mark travels in the same journal
        frame (the publish ledger's entry). A router's copies are :class:`Derived` from
        their source (docs/semantics/topics.md §8.1): they are not journaled (a crash
        re-derives them from the router cursor), only the seqs they take are reserved,
        and an fsync dest shows them once the source records they copy are durable.

        ``prebuilt``: this append's chunks and frame, built off the event loop from
        :meth:`lay_out` (:mod:`waymark.log.prebuilt`); adopted only if they still fit.
        ``staged``: a published batch's chunks as their stage frames journaled them; if
        those still lie in the WAL file this append's frame goes to, the frame names
        them instead of holding the records (docs/durability.md, "Staged chunks").
        """
        derived_from = origin.source if type(origin) is Derived else None
        kernel = self.kernel
        if kernel.replaying is not None:  # (inlined: every append passes here)
            kernel.replaying.finish(name)
        now = self.clock.now_ms()
        topic = kernel.get(name)
        created = topic is None
        if topic is None:
            topic = self._new_topic(name, create, config, now)
        plan = topic.plan_append(encoded, now)
        if prebuilt is not None:
            if prebuilt.fits(topic.epoch, plan, topic.last_ts):
                plan.ts = prebuilt.layout.ts  # what its bytes say: the ts proposed
            else:  # something was appended meanwhile: this append lays itself out
                prebuilt = None
        durability = topic.config.durability
        must_sync = durability is Durability.FSYNC
        journal = kernel.journal
        if journal is not None:
            # Admitted once for all its frames (create, ceiling, records): a 503 leaves
            # none queued (docs/durability.md, "Full disk").
            with journal.admit(name):
                if created:
                    kernel.write_topic(topic)
                if self._reserve(topic, plan.first_seq + len(plan.fresh) - 1, now):
                    # disk and fsync ack no seq above a durable ceiling; ephemeral is never
                    # fsync-gated, so its ceiling is best effort.
                    must_sync = must_sync or durability is Durability.DISK
                if plan.fresh and durability is not Durability.EPHEMERAL and derived_from is None:
                    frame: bytes | list[bytes] | None = None
                    by_reference = _by_reference(journal, name, plan.fresh, encoded, staged)
                    if type(origin) is Published and staged is not None and by_reference:
                        frame = PublishFrame(
                            name, topic.epoch, plan.first_seq, plan.ts,
                            now if prebuilt is None else prebuilt.layout.now,
                            origin.writer, origin.batch_id, staged.chunks,
                        ).encode()  # fmt: skip
                    elif prebuilt is not None:
                        frame = prebuilt.frame
                    if frame is None:
                        frame = records_frame_parts(
                            name,
                            topic.epoch,
                            plan.first_seq,
                            plan.ts,
                            plan.fresh,
                            origin if type(origin) is Published else None,
                            now=now,
                        )
                    journal.write(name, frame)
        if created:
            kernel.register(topic)
        topic.apply_append(plan, now, None if prebuilt is None else prebuilt.chunks)
        commit = kernel.latest(name)
        if durability is Durability.FSYNC and commit is not None and plan.fresh:
            topic.note_unsynced(plan.first_seq, commit)
            source = kernel.latest(derived_from) if derived_from is not None else None
            if source is not None:
                topic.note_unsynced(plan.first_seq, source)
        if plan.fresh and (changes := self.changes_of(topic)) is not None:
            # A router's copies are as durable as the source records they copy.
            latest = kernel.latest(derived_from) if derived_from is not None else commit
            changes.appended(name, topic.epoch, plan.first_seq, plan.fresh, latest)
        kernel.commit(topic)
        return AppendResult(plan.seqs, topic.head_seq, durability, created, commit, must_sync)

    def lay_out(
        self,
        name: str,
        encoded: Records,
        *,
        create: bool | None = None,
        config: ConfigPatch | None = None,
        publish: Published | None = None,
        runs: list[BodyRun] | None = None,
        staged: StagedChunks | None = None,
    ) -> Layout:
        """Where :meth:`append_encoded` would put ``encoded`` now, changing nothing but
        what any append would (TTL expiry): its topic instance, first seq and ts. The
        server builds the append's bytes from it on a worker thread
        (:mod:`waymark.log.prebuilt`). Refuses what the append would refuse.
        ``runs``: ``encoded``'s bodies already joined, in order (a sink's staged chunks);
        ``staged``: their stage frames (no records frame is built for a publish that will
        name them, see :meth:`append_encoded`)."""
        kernel = self.kernel
        if kernel.replaying is not None:
            kernel.replaying.finish(name)
        now = self.clock.now_ms()
        topic = kernel.get(name)
        if topic is None:  # a throwaway: the append makes the topic it creates
            topic = self._new_topic(name, create, config, now)
        plan = topic.plan_append(encoded, now)
        journal = kernel.journal
        # (a publish that will name its stage frames builds no records frame)
        by_reference = journal is not None and _by_reference(
            journal, name, plan.fresh, encoded, staged
        )
        journaled = (
            journal is not None
            and topic.config.durability is not Durability.EPHEMERAL
            and not (publish is not None and by_reference)
        )
        if plan.fresh is not encoded:  # repeats of ids dropped: the runs hold them too
            runs = None
        return Layout(name, topic.epoch, plan.first_seq, plan.ts, now, plan.fresh,
                      plan.fresh_bytes, journaled, publish, runs)  # fmt: skip

    def _new_topic(
        self, name: str, create: bool | None, config: ConfigPatch | None, now: int
    ) -> Topic:
        """The topic an append to missing ``name`` creates, not registered yet: a
        refused write creates nothing."""
        check_topic_name(name)  # an existing topic's name was checked when it was made
        topic_config = self.defaults.apply(config) if config else self.defaults
        if not (topic_config.auto_create if create is None else create):
            raise TopicError(
                ErrorCode.TOPIC_NOT_FOUND, f"topic {name!r} does not exist", {"topic": name}
            )
        self._check_room(name)
        return Topic(name, TopicType.LOG, topic_config, self.kernel.next_epoch(), now)

    def skip_derived(self, name: str, n: int, reason: str) -> Hole:
        """Hand out ``n`` seqs of a router dest that hold no record: the range of source
        records it can no longer derive, read as a ``reason`` tombstone
        (docs/semantics/topics.md §8.4).
        Like the copies, the range is not journaled; its seqs are reserved."""
        topic = self.kernel.existing(name)
        if self.kernel.journal is not None:
            self.kernel.journal.check_available(name)
            self._reserve(topic, topic.next_seq + n - 1, self.clock.now_ms())
        hole = topic.skip(n, reason)
        commit = self.kernel.latest(name)
        if topic.config.durability is Durability.FSYNC and commit is not None:
            topic.note_unsynced(hole.lo, commit)
        self.kernel.commit(topic)
        return hole

    def diff(
        self,
        name: str,
        from_seq: int,
        *,
        limit: int = 1000,
        nodes: frozenset[str] | None = None,
        epoch: int | None = None,
        per_record: bool = False,
        touch: bool = True,
        columns: bool = False,
    ) -> DiffResult:
        """Records with seq > from_seq, in seq order, at most ``limit`` scanned.

        ``nodes`` drops records whose $node is in the set (docs/semantics/topics.md §6);
        ``epoch`` names the topic instance the cursor belongs to, so a recreated topic
        is detected (docs/semantics/topics.md §5.5). ``touch`` counts the read as
        consumption (docs/semantics/topics.md §3); the engine's own readers (a router
        forwarding) pass False, so only consumers make a topic look consumed.
        ``columns`` reads the page for an Arrow answer (:mod:`waymark.log.pages`).
        """
        if from_seq < 0:
            raise TopicError(ErrorCode.INVALID_REQUEST, "from_seq is a seq: 0 or more")
        if limit < 1:
            raise TopicError(ErrorCode.INVALID_REQUEST, "limit is at least 1")
        topic = self.kernel.existing(name)
        now = self.clock.now_ms()
        page = topic.read(from_seq, limit, nodes, epoch, now, per_record, columns)
        if touch:
            topic.consumed(now)
        return page

    def delete(
        self, name: str, *, before_seq: int | None = None, match: TagMatch | None = None
    ) -> DeleteResult:
        """Permanent, point-in-time deletion (docs/semantics/topics.md §7)."""
        if before_seq is None and match is None:
            raise TopicError(ErrorCode.INVALID_REQUEST, "a delete names before_seq, match, or both")
        if before_seq is not None and before_seq < 0:
            raise TopicError(ErrorCode.INVALID_REQUEST, "before_seq is a seq: 0 or more")
        topic = self.kernel.existing(name)
        bound = topic.next_seq if before_seq is None else min(topic.next_seq, before_seq)
        now = self.clock.now_ms()
        # A deletion that removes anything is a change with its own seq, born deleted
        # (docs/semantics/topics.md §7.1): change checkpoints name it as a version later
        # than every record it removed (docs/semantics/recovery.md §1.3).
        slot = topic.next_seq if topic.removes_any(bound, match, now) else None
        kernel = self.kernel
        commit = None
        durability = topic.config.durability
        journaled = durability is not Durability.EPHEMERAL  # (its deletes skip the WAL)
        if kernel.journal is not None and (journaled or slot is not None):
            with kernel.journal.admit(name):  # its ceiling and its frame, or neither
                if slot is not None:
                    self._reserve(topic, slot, now)  # a journaled delete's ack waits for its frame
                if journaled:
                    frame = DeleteFrame.of(name, topic.epoch, before_seq, match, bound, now=now,
                                           slot=slot)  # fmt: skip
                    commit = kernel.write(name, frame.encode())
        changes = self.changes_of(topic) if slot is not None else None
        keys = deleted_keys(topic, bound, match) if changes is not None else None
        result = topic.delete(bound, match, now, slot)
        if slot is not None and commit is not None and durability is Durability.FSYNC:
            topic.note_unsynced(slot, commit)  # readers pass it once it is synced
        if changes is not None and slot is not None and keys:  # changes come with a slot
            changes.removed(topic, keys, slot, commit)
        kernel.commit(topic)
        return DeleteResult(result, commit)

    def delete_seqs(self, name: str, seqs: list[int]) -> DeleteResponse:
        """Permanently delete exactly ``seqs`` (docs/semantics/topics.md §7): how a queue acks
        and dead-letters."""
        topic = self.kernel.existing(name)
        if topic.config.durability is not Durability.EPHEMERAL:  # its deletes skip the WAL
            frame = DeleteFrame.of(name, topic.epoch, None, None, 0, seqs)
            self.kernel.write(name, frame.encode())
        result = topic.delete_seqs(seqs, self.clock.now_ms())
        self.kernel.commit(topic)
        return result

    # --- queues (docs/semantics/topics.md §10): thin entry points; the logic is waymark.log.queue
    def claim(
        self, name: str, node: str, max_jobs: int, lease_ms: int | None = None
    ) -> list[ClaimedJob]:
        """Lease up to ``max_jobs`` jobs to ``node`` now (a cohort of one)."""
        return self.queues.claim(name, [ClaimRequest(node, max_jobs, lease_ms)])[0]

    def claim_cohort(self, name: str, requests: Sequence[ClaimRequest]) -> list[list[ClaimedJob]]:
        """One coordinator pass sharing the available jobs across a cohort
        (docs/semantics/topics.md §10.3)."""
        return self.queues.claim(name, requests)

    def ack(
        self, name: str, node: str, seqs: Sequence[int], lease_ids: Sequence[str] | None = None
    ) -> Settled:
        return self.queues.ack(name, node, seqs, lease_ids)

    def nack(
        self,
        name: str,
        node: str,
        seqs: Sequence[int],
        lease_ids: Sequence[str] | None = None,
        delay_ms: int = 0,
    ) -> Settled:
        return self.queues.nack(name, node, seqs, lease_ids, delay_ms)

    def extend(
        self,
        name: str,
        node: str,
        seqs: Sequence[int],
        lease_ids: Sequence[str] | None = None,
        lease_ms: int | None = None,
    ) -> Settled:
        return self.queues.extend(name, node, seqs, lease_ids, lease_ms)

    def redrive(self, name: str, max_jobs: int = 1000) -> Redriven:
        return self.queues.redrive(name, max_jobs)

    def claim_jitter_ms(self, name: str) -> int:
        """The queue's claim_jitter_ms: how long claims gather into one cohort
        (404 / 409 not_a_queue first)."""
        return self.queues.jitter_ms(name)

    def holds_lease(self, name: str, seq: int, node: str, lease_id: str) -> bool:
        """Whether ``node`` still holds the live lease ``lease_id`` on job ``seq``."""
        return self.queues.holds(name, seq, node, lease_id)

    def next_due(self, name: str) -> int | None:
        """When the queue's next lease may expire or delayed job become claimable."""
        return self.queues.next_due(name)

    def dead_letter_counts(self) -> tuple[int, int]:
        """Jobs parked because their dead-letter topic refused them, and claim passes
        whose dead-letter move was refused (docs/queues.md)."""
        return self.queues.parked(), self.queues.dead_letter_refused

    # --- exactly-once writers (docs/semantics/topics.md §12): the logic is waymark.log.writers
    def open_writer(self, writer: str) -> int:
        """The writer's next epoch, fencing every earlier one (journaled first)."""
        return self.writers.open_writer(writer)

    def stage(
        self,
        topic: str,
        writer: str,
        epoch: int,
        batch_id: int,
        part: PartKey,
        records: Sequence[RecordIn] | PlainRecords,
        *,
        chunk: int = 0,
    ) -> bool:
        """Stage a chunk of a batch's part; False if the batch is already published."""
        return self.writers.stage(topic, writer, epoch, batch_id, part, records, chunk=chunk)

    def publish(
        self,
        topic: str,
        writer: str,
        epoch: int,
        batch_id: int,
        parts: Sequence[tuple[PartKey, int]],
        prebuilt: Prebuilt | None = None,
    ) -> PublishResponse:
        """Append a batch's staged parts atomically, once per ``(writer, batch_id)``;
        ``prebuilt`` from :meth:`lay_out_publish` (see :meth:`append_encoded`)."""
        return self.writers.publish(topic, writer, epoch, batch_id, parts, prebuilt)

    def lay_out_publish(
        self,
        topic: str,
        writer: str,
        epoch: int,
        batch_id: int,
        parts: Sequence[tuple[PartKey, int]],
    ) -> Layout | None:
        """Where :meth:`publish` would append now (:meth:`lay_out`); None if it would
        append nothing."""
        return self.writers.lay_out(topic, writer, epoch, batch_id, parts)

    def writer_topics(self, writer: str) -> list[str]:
        """The topics ``writer`` stages or published to."""
        return self.writers.topics_of(writer)

    def writer_states(self) -> list[WriterState]:
        return self.writers.states()

    # --- routers (docs/semantics/topics.md §8): thin entry points; the logic is waymark.log.router
    def put_router(
        self,
        name: str,
        source: str,
        dest: str,
        *,
        preserve_node: bool = True,
        preserve_tag: bool = True,
        allow_cycle: bool = False,
        guarantee: str = "at_least_once",
        create_dest: bool = True,
        record_filter: dict[str, Any] | None = None,
    ) -> tuple[Router, bool]:
        self.kernel.finish_replay(source)  # a new router starts at the source's whole head
        return self.routers.put(
            name, source, dest, preserve_node=preserve_node, preserve_tag=preserve_tag,
            allow_cycle=allow_cycle, guarantee=guarantee, create_dest=create_dest,
            record_filter=record_filter,
        )  # fmt: skip

    def get_router(self, name: str) -> Router:
        return self.routers.get(name)

    def list_routers(self) -> list[Router]:
        return self.routers.list()

    def delete_router(self, name: str) -> None:
        self.routers.delete(name)

    def has_routers(self) -> bool:
        return self.routers.has_routers()

    def router_sources(self) -> set[str]:
        """The topics some router reads."""
        return self.routers.sources()

    def forward(self, max_records: int = 1000, source: str | None = None) -> Forwarded:
        """One forwarding step over every router, or those reading ``source`` (off every
        append's ack path)."""
        return self.routers.forward(max_records, source)

    def sync_ms(self, name: str) -> int:
        """How long making ``name``'s journal frames durable takes lately, in ms (0 in
        memory): what an fsync topic reports as fsync_ms (docs/semantics/topics.md §2.2)."""
        return self.kernel.sync_ms(name)

    def commit_point(self, name: str) -> Commit | None:
        """The journal commit covering every mutation of ``name`` so far (None in memory).

        Control mutations (topic config, topic deletion, record deletion) always
        survive a crash once this commit is durable.
        """
        return self.kernel.latest(name)

    def trim_ceilings(self) -> int:
        """Lower to its exact head the seq ceiling of every topic that handed out no seq
        since the previous call, so a crash while it is idle reports nothing as lost
        (docs/durability.md). ``waymark serve`` calls this every 50 ms; embedded, call it
        now and then. Returns how many ceilings were lowered.

        Safe at any moment: the frame follows every earlier frame of the topic in its
        WAL shard, so if it survives a crash they all did. Its cost is that the topic's
        next append waits for a sync, as one that raises the ceiling always does.
        """
        trimmed = 0
        for name, epoch in list(self._ahead.items()):
            topic = self.kernel.get(name)
            if topic is None or topic.epoch != epoch:
                del self._ahead[name]  # dropped or recreated
                continue
            try:
                done = topic.trim_ceiling(self._write_head)
            except TopicError:
                continue  # its WAL shard cannot write now: the wider ceiling stays
            if done is None:
                del self._ahead[name]  # exact and durable: nothing left to do
            elif done:
                trimmed += 1
        return trimmed

    def close(self) -> None:
        """Record every topic's exact head, so a clean restart continues seqs without a gap."""
        if self.kernel.journal is None:
            return
        for topic in self.kernel.topics():
            frame = topic.close_ceiling()
            if frame is not None:
                self.kernel.write(topic.name, frame.encode())
        self._ahead.clear()

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(topic)`` after every commit that changes ``topic``."""
        self.kernel.add_listener(listener)

    # --- change checkpoints (docs/semantics/recovery.md §1) -------------------------
    def track_changes(self, window_ms: int) -> Topic:
        """Start noting committed changes for change checkpoints, kept for
        ``window_ms`` (the recovery window) in the internal checkpoint topic, which this
        creates or reconfigures. Its seqs are the checkpoint ids."""
        if self.changes is None:
            self.changes = Changes()
        config = self.defaults.apply(
            ConfigPatch(durability=Durability.FSYNC, ttl_ms=window_ms, cap_records=0,
                        cap_bytes=0, auto_create=False)
        )  # fmt: skip
        kernel = self.kernel
        kernel.finish_replay(CHANGES_TOPIC)
        topic = kernel.get(CHANGES_TOPIC)
        now = self.clock.now_ms()
        if topic is None:
            topic = Topic(CHANGES_TOPIC, TopicType.LOG, config, kernel.next_epoch(), now)
            kernel.create(topic)
        elif topic.config != config:
            frame = TopicFrame.of(CHANGES_TOPIC, topic.type, topic.epoch, config,
                                  topic.created_ts, now=now)  # fmt: skip
            kernel.write(CHANGES_TOPIC, frame.encode())
            topic.reconfigure(config, now)
        return topic

    @property
    def tracks_changes(self) -> bool:
        """Whether committed changes are noted for change checkpoints (track_changes)."""
        return self.changes is not None

    def unsynced_change_topics(self) -> set[str]:
        """The topics with a change noted for the next checkpoint that is not durable yet
        (none when no changes are tracked)."""
        return set() if self.changes is None else self.changes.unsynced_topics()

    def emit_checkpoint(self) -> AppendResult | None:
        """Write one change checkpoint of every change durable now (None when there is
        none): the server calls this once per checkpoint interval. The append's seq is
        the checkpoint's id."""
        if self.changes is None:
            return None
        if self.journal is not None:
            # Refused (503) before anything is taken: the changes wait for the next try.
            self.journal.check_available(CHANGES_TOPIC)
        changes, covered = self.changes.take()
        if not changes:
            return None
        data = msgspec.json.encode(CheckpointData(self.clock.now_ms(), changes, covered))
        # Not bound by max_record_bytes: a checkpoint names every key of its interval.
        record = EncodedRecord(b',"data":%b}' % data, len(data), None, None, None)
        result = self.append_encoded(CHANGES_TOPIC, [record], create=False)
        self.changes.cover(covered)
        return result

    def internal_log(self, name: str, durability: Durability) -> Topic:
        """The internal log ``name`` (a ``$`` in it: no request can reach it, and it
        counts toward no limit), created if missing: where the server keeps its own
        records, e.g. status reports (docs/reports.md)."""
        assert "$" in name, name
        kernel = self.kernel
        kernel.finish_replay(name)
        topic = kernel.get(name)
        if topic is None:
            config = self.defaults.apply(
                ConfigPatch(durability=durability, ttl_ms=0, cap_records=0, cap_bytes=0,
                            auto_create=False)
            )  # fmt: skip
            topic = Topic(name, TopicType.LOG, config, kernel.next_epoch(), self.clock.now_ms())
            kernel.create(topic)
        return topic

    # --- internals ----------------------------------------------------------------
    def _admit(self, topic: Topic) -> contextlib.AbstractContextManager[object]:
        """Admit one change of ``topic`` at its WAL shard, and a queue's at its leases
        log's too (the change journals a frame for each, perhaps on two shards): its
        frames are all taken, or, refused with 503, none is (docs/durability.md, "Full
        disk")."""
        journal = self.kernel.journal
        if journal is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        with stack:
            stack.enter_context(journal.admit(topic.name))
            if topic.type is TopicType.QUEUE:
                stack.enter_context(journal.admit(leases_name(topic.name)))
            return stack.pop_all()

    def changes_of(self, topic: Topic) -> Changes | None:
        """Where ``topic``'s changes are noted for checkpoints: only log topics that keep
        their records (not ephemeral ones), never internal ones
        (docs/semantics/recovery.md §1.4)."""
        if (
            self.changes is None
            or topic.type is not TopicType.LOG
            or topic.config.durability is Durability.EPHEMERAL
            or "$" in topic.name
        ):
            return None
        return self.changes

    def _state(self, topic: Topic, now: int) -> TopicState:
        replaying = self.replaying
        if replaying is not None and replaying.holds(topic):
            state = replaying.state(topic, now)
        else:
            state = topic.state(now)
        if state.durability is Durability.FSYNC:
            state = msgspec.structs.replace(state, fsync_ms=self.sync_ms(topic.name))
        if topic.type is TopicType.QUEUE:
            state = msgspec.structs.replace(state, queue=self.queues.counts(topic))
        return state

    def _reserve(self, topic: Topic, last: int, now: int) -> bool:
        """Make ``topic``'s journaled seq ceiling cover ``last`` (the rule is
        :meth:`Topic.reserve`); True while no durable one does."""
        return topic.reserve(last, now, self._write_head)

    def _write_head(self, frame: HeadFrame) -> Commit | None:
        """Journal a topic's new seq ceiling; its topic is one :meth:`trim_ceilings`
        looks at from now on."""
        commit = self.kernel.write(frame.name, frame.encode())
        self._ahead[frame.name] = frame.epoch
        return commit


def _by_reference(
    journal: Journal, name: str, fresh: Records, encoded: Records, staged: StagedChunks | None
) -> bool:
    """Whether a publish of ``encoded`` writes a frame naming its staged chunks' stage
    frames instead of its records: all of them are fresh (none dropped as a repeat) and
    their stage frames lie in the WAL file the publish's frame goes to. One in an older
    file may be trimmed by a seal (which holds the publish's records only if it began
    after it), so that publish writes its records (docs/durability.md, "Staged chunks")."""
    return staged is not None and fresh is encoded and staged.file == journal.file(name)
