"""The topic log engine: synchronous, in-process, no I/O.

The engine owns every topic. Every mutation is validated first, then handed to
the journal as frame bytes (when the engine has one), then applied: a mutation
that fails validation, or that the journal cannot take, changes nothing.
Callers that wake on new data register a listener with :meth:`Engine.add_listener`;
it runs synchronously after each commit.

Durability classes (§2.2) decide what reaches the journal and what an
acknowledgement waits for; results carry the :class:`~waymark.log.journal.Commit`
to wait on and whether the class requires waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..clock import Clock, SystemClock
from . import journal as frames
from .config import ConfigPatch, Durability, TopicConfig, TopicType
from .deletion import TagMatch
from .errors import ErrorCode, TopicError
from .journal import Commit, Journal
from .queue import ClaimedJob, ClaimRequest, Queues, Redriven, Settled, check_queue_config
from .records import EncodedRecord, Limits, RecordIn, check_topic_name, encode_batch
from .results import AppendResult, DeleteResult, DiffResult, TopicState
from .router import Forwarded, Router, Routers
from .staging import Staging
from .topic import Hole, Topic

if TYPE_CHECKING:
    from .gradual import GradualRecovery

Listener = Callable[[str], None]

# disk and fsync topics reserve seqs in blocks, syncing the ceiling before handing any
# out, so a crash that loses acknowledged records never lets their seqs be reused.
SEQ_RESERVE = 4096


class Engine:
    def __init__(
        self,
        clock: Clock | None = None,
        defaults: TopicConfig | None = None,
        limits: Limits | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.clock = clock or SystemClock()
        self.journal = journal
        self.defaults = defaults or TopicConfig()
        self.limits = limits or Limits()
        self._topics: dict[str, Topic] = {}
        self._last_epoch = 0  # topic-instance epochs are unique for the engine's life
        self._listeners: list[Listener] = []
        self.staging = Staging(self)  # exactly-once sinks: stage, then publish atomically
        self.queues = Queues(self)  # lease state of queue topics (§10)
        self.routers = Routers(self)  # forwarding rules and their cursors (§8)
        # memory topics whose WAL frames recovery set aside; applied before any use (§2.2)
        self.recovering: GradualRecovery | None = None

    # --- topics -----------------------------------------------------------------
    def list_topics(self) -> list[TopicState]:
        """Every topic's state, sorted by name; a queue's internal leases log is not one."""
        now = self.clock.now_ms()
        return [self._state(self._topics[n], now) for n in sorted(self._topics) if "$" not in n]

    def put_topic(
        self, name: str, patch: ConfigPatch, type: TopicType | None = None
    ) -> tuple[TopicState, bool]:
        """Create or update a topic; returns (state, created). The type is immutable:
        a different type for an existing topic is 409 topic_exists_incompatible."""
        check_topic_name(name)
        now = self.clock.now_ms()
        self._recover(name)
        topic = self._topics.get(name)
        if topic is None:
            config = self.defaults.apply(patch)
            if type is TopicType.QUEUE:
                check_queue_config(name, config)
            topic = Topic(name, type or TopicType.LOG, config, 0, now)
            topic.epoch = self._last_epoch + 1
            self._write_topic(topic)
            self._register(topic)
            if topic.type is TopicType.QUEUE:
                self.queues.configured(topic)
            self._commit(topic)
            return self._state(topic, now), True
        if type is not None and type is not topic.type:
            raise TopicError(
                ErrorCode.TOPIC_EXISTS_INCOMPATIBLE,
                f"topic {name!r} exists with type {topic.type!s}; a topic's type never changes",
                {"topic": name, "type": str(topic.type), "requested": str(type)},
            )
        config = topic.config.apply(patch)
        if topic.type is TopicType.QUEUE:
            check_queue_config(name, config)
        frame = frames.topic_frame(
            name, topic.type, topic.epoch, config, topic.created_ts, now=now
        )
        self._write(name, frame)
        topic.reconfigure(config, now)
        if topic.type is TopicType.QUEUE:
            self.queues.configured(topic)
        self._commit(topic)
        return self._state(topic, now), False

    def get_topic(self, name: str, *, touch: bool = True) -> TopicState:
        """State of a topic (404 topic_not_found); ``touch`` counts as consumption (§3)."""
        topic = self._existing(name, recover=False)  # a recovering topic says so
        now = self.clock.now_ms()
        if touch:
            topic.consumed(now)
        return self._state(topic, now)

    def delete_topic(self, name: str) -> None:
        """Tear a topic down: records, tag index, dedupe state (404 if missing)."""
        topic = self._existing(name, recover=False)  # what is still set aside never applies
        self._write(name, frames.drop_frame(name, topic.epoch))
        del self._topics[name]
        self.routers.topic_dropped(name, topic.epoch)  # §8.6: its routers go with it
        if topic.type is TopicType.QUEUE:
            self.queues.dropped(topic)
        self._commit(topic)

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
        if not records:
            raise TopicError(ErrorCode.INVALID_REQUEST, "a write carries at least one record")
        if len(records) > self.limits.max_records_per_write:
            raise TopicError(
                ErrorCode.TOO_MANY_RECORDS,
                f"a write carries at most {self.limits.max_records_per_write} records",
                {"records": len(records), "max_records": self.limits.max_records_per_write},
            )
        encoded = encode_batch(records, self.limits)
        return self.append_encoded(name, encoded, create=create, config=config)

    # --- staged sink writes: waymark.log.staging publishes through here ------------
    def append_encoded(
        self,
        name: str,
        encoded: list[EncodedRecord],
        *,
        create: bool | None = None,
        config: ConfigPatch | None = None,
        extra: dict[str, object] | None = None,
        derived_from: str | None = None,
    ) -> AppendResult:
        """The atomic append of already validated records (see :meth:`append`).

        A sink batch published by :mod:`waymark.log.staging` is many staged parts
        committed together, so it is not bound by ``max_records_per_write``;
        ``extra`` travels in the same journal frame (a publish's ledger entry).
        ``derived_from`` names the source of a router's copies (§8.1): they are not
        journaled (a crash re-derives them from the router cursor), only the seqs
        they take are reserved, and an fsync dest shows them once the source records
        they copy are durable.
        """
        if self.recovering is not None:  # (inlined: every append passes here)
            self.recovering.finish(name)
        now = self.clock.now_ms()
        topic = self._topics.get(name)
        created = topic is None
        if topic is None:
            check_topic_name(name)  # an existing topic's name was checked when it was made
            topic_config = self.defaults.apply(config) if config else self.defaults
            if not (topic_config.auto_create if create is None else create):
                raise TopicError(
                    ErrorCode.TOPIC_NOT_FOUND, f"topic {name!r} does not exist", {"topic": name}
                )
            # Not registered until the write is known to fit: a refused write creates nothing.
            topic = Topic(name, TopicType.LOG, topic_config, self._last_epoch + 1, now)
        plan = topic.plan_append(encoded, now)
        durability = topic.config.durability
        must_sync = durability is Durability.FSYNC
        if self.journal is not None:
            self.journal.check_available(name)
            if created:
                self._write_topic(topic)
            if self._reserve(topic, plan.first_seq + len(plan.fresh) - 1):
                # disk and fsync ack no seq above a durable ceiling; ephemeral is never
                # fsync-gated, so its ceiling is best effort.
                must_sync = must_sync or durability is Durability.DISK
            if plan.fresh and durability is not Durability.EPHEMERAL and derived_from is None:
                self._write(
                    name,
                    frames.records_frame(
                        name, topic.epoch, plan.first_seq, plan.ts, plan.fresh, extra, now=now
                    ),
                )
        if created:
            self._register(topic)
        topic.apply_append(plan, now)
        commit = self._latest(name)
        if durability is Durability.FSYNC and commit is not None and plan.fresh:
            topic.note_unsynced(plan.first_seq, commit)
            source = self._latest(derived_from) if derived_from is not None else None
            if source is not None:
                topic.note_unsynced(plan.first_seq, source)
        self._commit(topic)
        return AppendResult(plan.seqs, topic.head_seq, durability, created, commit, must_sync)

    def skip_derived(self, name: str, n: int, reason: str) -> Hole:
        """Hand out ``n`` seqs of a router dest that hold no record: the range of source
        records it can no longer derive, read as a ``reason`` tombstone (§8.4).
        Like the copies, the range is not journaled; its seqs are reserved."""
        topic = self._existing(name)
        if self.journal is not None:
            self.journal.check_available(name)
            self._reserve(topic, topic.next_seq + n - 1)
        hole = topic.skip(n, reason)
        commit = self._latest(name)
        if topic.config.durability is Durability.FSYNC and commit is not None:
            topic.note_unsynced(hole.lo, commit)
        self._commit(topic)
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
    ) -> DiffResult:
        """Records with seq > from_seq, in seq order, at most ``limit`` scanned.

        ``nodes`` drops records whose $node is in the set (§6); ``epoch`` names the
        topic instance the cursor belongs to, so a recreated topic is detected (§5.5).
        ``touch`` counts the read as consumption (§3); the engine's own readers (a
        router forwarding) pass False, so only consumers make a topic look consumed.
        """
        if from_seq < 0:
            raise TopicError(ErrorCode.INVALID_REQUEST, "from_seq is a seq: 0 or more")
        if limit < 1:
            raise TopicError(ErrorCode.INVALID_REQUEST, "limit is at least 1")
        topic = self._existing(name)
        now = self.clock.now_ms()
        page = topic.read(from_seq, limit, nodes, epoch, now, per_record)
        if touch:
            topic.consumed(now)
        return page

    def delete(
        self, name: str, *, before_seq: int | None = None, match: TagMatch | None = None
    ) -> DeleteResult:
        """Permanent, point-in-time deletion (§7)."""
        if before_seq is None and match is None:
            raise TopicError(
                ErrorCode.INVALID_REQUEST, "a delete names before_seq, match, or both"
            )
        if before_seq is not None and before_seq < 0:
            raise TopicError(ErrorCode.INVALID_REQUEST, "before_seq is a seq: 0 or more")
        topic = self._existing(name)
        bound = topic.next_seq if before_seq is None else min(topic.next_seq, before_seq)
        now = self.clock.now_ms()
        frame = frames.delete_frame(name, topic.epoch, before_seq, match, bound, now=now)
        self._write(name, frame)
        result = topic.delete(bound, match, now)
        self._commit(topic)
        return result

    def delete_seqs(self, name: str, seqs: list[int]) -> DeleteResult:
        """Permanently delete exactly ``seqs`` (§7): how a queue acks and dead-letters."""
        topic = self._existing(name)
        self._write(name, frames.delete_frame(name, topic.epoch, None, None, 0, seqs))
        result = topic.delete_seqs(seqs, self.clock.now_ms())
        self._commit(topic)
        return result

    # --- queues (§10): thin entry points; the lease logic is waymark.log.queue -------
    def claim(
        self, name: str, node: str, max: int, lease_ms: int | None = None
    ) -> list[ClaimedJob]:
        """Lease up to ``max`` jobs to ``node`` now (a cohort of one)."""
        return self.queues.claim(name, [ClaimRequest(node, max, lease_ms)])[0]

    def claim_cohort(self, name: str, requests: Sequence[ClaimRequest]) -> list[list[ClaimedJob]]:
        """One coordinator pass sharing the available jobs across a cohort (§10.3)."""
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

    def redrive(self, name: str, max: int = 1000) -> Redriven:
        return self.queues.redrive(name, max)

    # --- routers (§8): thin entry points; the logic is waymark.log.router -------------
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
        filter: dict[str, Any] | None = None,
    ) -> tuple[Router, bool]:
        self._recover(source)  # a new router starts at the source's whole head
        return self.routers.put(
            name, source, dest, preserve_node=preserve_node, preserve_tag=preserve_tag,
            allow_cycle=allow_cycle, guarantee=guarantee, create_dest=create_dest, filter=filter,
        )  # fmt: skip

    def get_router(self, name: str) -> Router:
        return self.routers.get(name)

    def list_routers(self) -> list[Router]:
        return self.routers.list()

    def delete_router(self, name: str) -> None:
        self.routers.delete(name)

    def forward(self, max_records: int = 1000) -> Forwarded:
        """One forwarding step over every router (off every append's ack path)."""
        return self.routers.forward(max_records)

    def sync_ms(self, name: str) -> int:
        """How long making ``name``'s journal frames durable takes lately, in ms (0 in
        memory): what an fsync topic reports as fsync_ms (§2.2)."""
        return self.journal.sync_ms(name) if self.journal is not None else 0

    def commit_point(self, name: str) -> Commit | None:
        """The journal commit covering every mutation of ``name`` so far (None in memory).

        Control mutations (topic config, topic deletion, record deletion) always
        survive a crash once this commit is durable.
        """
        return self._latest(name)

    def close(self) -> None:
        """Record every topic's exact head, so a clean restart continues seqs without a gap."""
        if self.journal is None:
            return
        for topic in self._topics.values():
            if topic.config.durability is not Durability.MEMORY:
                topic.ceiling = topic.head_seq
                self._write(topic.name, frames.head_frame(topic.name, topic.epoch, topic.ceiling))

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(topic)`` after every commit that changes ``topic``."""
        self._listeners.append(listener)

    # --- internals ----------------------------------------------------------------
    def _state(self, topic: Topic, now: int) -> TopicState:
        recovering = self.recovering
        if recovering is not None and recovering.holds(topic):
            state = recovering.state(topic, now)
        else:
            state = topic.state(now)
        if topic.config.durability is Durability.FSYNC:
            state = replace(state, fsync_ms=self.sync_ms(topic.name))
        if topic.type is TopicType.QUEUE:
            state = replace(state, queue=self.queues.counts(topic))
        return state

    def _existing(self, name: str, *, recover: bool = True) -> Topic:
        if recover and self.recovering is not None:
            self.recovering.finish(name)
        topic = self._topics.get(name)
        if topic is None:
            check_topic_name(name)
            raise TopicError(
                ErrorCode.TOPIC_NOT_FOUND, f"topic {name!r} does not exist", {"topic": name}
            )
        return topic

    def _recover(self, name: str) -> None:
        """Apply what recovery set aside for ``name`` before it is used, so nothing is
        appended or read out of order."""
        if self.recovering is not None:
            self.recovering.finish(name)

    def _write(self, name: str, frame: bytes) -> None:
        if self.journal is not None:
            self.journal.write(name, frame)

    def _write_topic(self, topic: Topic) -> None:
        self._write(
            topic.name,
            frames.topic_frame(
                topic.name, topic.type, topic.epoch, topic.config, topic.created_ts,
                now=topic.created_ts,
            ),
        )

    def _reserve(self, topic: Topic, last: int) -> bool:
        """Journal a seq ceiling above ``last`` unless one covers it; True if written.
        memory topics keep none: their head may regress after a crash (§2.2)."""
        if topic.config.durability is Durability.MEMORY or last <= topic.ceiling:
            return False
        topic.ceiling = last + SEQ_RESERVE
        self._write(topic.name, frames.head_frame(topic.name, topic.epoch, topic.ceiling))
        return True

    def _latest(self, name: str) -> Commit | None:
        return self.journal.latest(name) if self.journal is not None else None

    def _register(self, topic: Topic) -> None:
        self._last_epoch = topic.epoch
        self._topics[topic.name] = topic

    def _commit(self, topic: Topic) -> None:
        """The single commit point: every applied mutation passes here."""
        for listener in self._listeners:
            listener(topic.name)
