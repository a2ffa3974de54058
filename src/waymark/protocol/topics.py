"""Topics: configuration, state, and the bodies of the topic routes.

A :class:`ConfigPatch` is what a client sends (every field optional); a
:class:`TopicConfig` is the resolved configuration a topic runs with (the engine
keeps and persists it); a :class:`ConfigView` is that configuration as a topic's
state reports it (``durable`` included, the queue fields on queue topics only).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Generic, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from .limits import (
    DEFAULT_DIFF_LIMIT,
    MAX_ARROW_DIFF_LIMIT,
    MAX_WAIT_MS,
    NonNegative,
    Positive,
    Seq,
)
from .limits import TopicName as DeadLetterName
from .records import Record, RecordIn, TagRule, Tombstone

T = TypeVar("T")

# An owner is an opaque name (a pipeline's identity, docs/pipeline.md), 1-255 printable
# characters.
OwnerName = Annotated[str, Meta(min_length=1, max_length=255, pattern=r"^[!-~]+$")]


class Discard(StrEnum):
    OLD = "old"
    REJECT = "reject"


class Durability(StrEnum):
    """The four commit classes, weakest first."""

    EPHEMERAL = "ephemeral"
    MEMORY = "memory"
    DISK = "disk"
    FSYNC = "fsync"


class TopicType(StrEnum):
    LOG = "log"
    QUEUE = "queue"


# --- configuration ---------------------------------------------------------------------


class ConfigPatch(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Config fields a request sets; absent fields keep their current value."""

    ttl_ms: NonNegative | UnsetType = UNSET
    cap_records: NonNegative | UnsetType = UNSET
    cap_bytes: NonNegative | UnsetType = UNSET
    discard: Discard | UnsetType = UNSET
    durable: bool | UnsetType = UNSET
    durability: Durability | UnsetType | None = UNSET
    priority: Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)] | UnsetType | None = UNSET
    auto_priority: bool | UnsetType = UNSET
    auto_create: bool | UnsetType = UNSET
    idempotency_window_ms: NonNegative | UnsetType = UNSET
    dedupe_node: bool | UnsetType = UNSET
    # Who the topic belongs to; set once, a PUT naming another owner is refused
    # (docs/semantics/topics.md §2.2).
    owner: OwnerName | UnsetType = UNSET
    # --- queues (docs/semantics/topics.md §10); accepted on any topic, used only by "queue" ---
    lease_ms: Positive | UnsetType = UNSET
    max_deliveries: NonNegative | UnsetType = UNSET
    dead_letter: DeadLetterName | UnsetType | None = UNSET
    claim_jitter_ms: NonNegative | UnsetType = UNSET
    leases_durable: bool | UnsetType = UNSET


class TopicConfig(Struct, frozen=True):
    """The resolved configuration of one topic, every field with its default
    (docs/semantics/topics.md §2.2).

    Its fields, in this order, are also what the engine persists for a topic.
    """

    ttl_ms: int = 0
    cap_records: int = 0
    cap_bytes: int = 0
    discard: Discard = Discard.OLD
    durability: Durability = Durability.DISK
    priority: int | None = None
    auto_priority: bool = True
    auto_create: bool = True
    idempotency_window_ms: int = 120_000
    dedupe_node: bool = True
    # --- queues (docs/semantics/topics.md §10) ---
    lease_ms: int = 30_000  # a claim's lease (the visibility timeout) unless it names one
    max_deliveries: int = 0  # 0: reclaimed indefinitely; n: the (n+1)-th delivery dead-letters
    dead_letter: str | None = None
    claim_jitter_ms: int = 0  # 0: greedy claims; > 0: the coalescing window of a cohort
    leases_durable: bool = False  # the leases log follows the jobs' class instead of memory
    # Set once: a PUT naming another owner is refused. UNSET (never encoded) while
    # there is none, so what the engine persists for an unowned topic is unchanged.
    owner: str | UnsetType = UNSET

    @property
    def durable(self) -> bool:
        # docs/semantics/topics.md §2.2: durable is normalised to "the class is fsync".
        return self.durability is Durability.FSYNC

    def apply(self, patch: ConfigPatch) -> TopicConfig:
        """This config with ``patch`` applied (upsert semantics)."""
        changes: dict[str, Any] = {
            f: getattr(patch, f)
            for f in patch.__struct_fields__
            if f not in ("durable", "durability") and getattr(patch, f) is not UNSET
        }
        # An explicit durability wins; a bare `durable` picks fsync or disk
        # (docs/semantics/topics.md §2.2).
        if patch.durability is not UNSET and patch.durability is not None:
            changes["durability"] = patch.durability
        elif patch.durable is not UNSET:
            changes["durability"] = Durability.FSYNC if patch.durable else Durability.DISK
        elif patch.durability is None:
            changes["durability"] = Durability.DISK
        return msgspec.structs.replace(self, **changes) if changes else self

    def view(self, queue: bool) -> ConfigView:
        """This config as the state of a topic reports it (``queue``: a queue topic)."""
        view = ConfigView(
            ttl_ms=self.ttl_ms,
            cap_records=self.cap_records,
            cap_bytes=self.cap_bytes,
            discard=self.discard,
            durable=self.durable,
            durability=self.durability,
            priority=self.priority,
            auto_priority=self.auto_priority,
            auto_create=self.auto_create,
            idempotency_window_ms=self.idempotency_window_ms,
            dedupe_node=self.dedupe_node,
            owner=None if self.owner is UNSET else self.owner,
        )
        if queue:
            view.lease_ms = self.lease_ms
            view.max_deliveries = self.max_deliveries
            view.dead_letter = self.dead_letter
            view.claim_jitter_ms = self.claim_jitter_ms
            view.leases_durable = self.leases_durable
        return view


class ConfigView(Struct, kw_only=True, omit_defaults=True):
    """A topic's resolved config as its state reports it: every field present, plus
    ``durable``; the queue fields (docs/semantics/topics.md §10) only on queue topics."""

    ttl_ms: int
    cap_records: int
    cap_bytes: int
    discard: Discard
    durable: bool
    durability: Durability
    priority: int | None
    auto_priority: bool
    auto_create: bool
    idempotency_window_ms: int
    dedupe_node: bool
    lease_ms: int | UnsetType = UNSET
    max_deliveries: int | UnsetType = UNSET
    dead_letter: str | UnsetType | None = UNSET
    claim_jitter_ms: int | UnsetType = UNSET
    leases_durable: bool | UnsetType = UNSET
    owner: str | None = None  # absent when the topic has none


# --- state -------------------------------------------------------------------------------


class DeadLetterError(Struct, kw_only=True):
    """The last refusal of a dead-letter move by the ``dead_letter`` topic (full with
    ``discard: reject``, missing and not created lazily, a full disk; docs/queues.md)."""

    code: str  # an ErrorCode value; str so that codes a newer server adds still decode
    message: str
    topic: str  # the dead-letter topic that refused
    ts: int  # when, on the server's clock (ms)


class QueueCounts(Struct):
    """The ``queue`` object of a queue topic's state (docs/semantics/topics.md §10.5)."""

    ready: int  # the queue's other records, nacked ones waiting out a delay included
    in_flight: int  # leases not yet reclaimed; an expired lease is reclaimed lazily
    dead_lettered: int
    # Dead jobs the dead-letter topic refused: kept in the queue, neither ready nor
    # delivered again, moved once it has room. (Defaults: what an older server means.)
    dead_letter_parked: int = 0
    # The last refusal, while any job is parked; null otherwise.
    dead_letter_error: DeadLetterError | None = None
    # The earliest deadline (server clock, ms) of the leases in flight: the oldest lease,
    # in the past while an expired one waits for the next claim pass to reclaim it;
    # null with nothing in flight.
    earliest_lease_deadline: int | None = None


class TopicState(Struct, kw_only=True, omit_defaults=True):
    """A topic's state (docs/semantics/topics.md §2.3) at one instant."""

    name: str
    type: TopicType
    epoch: int
    # What readers can read (docs/semantics/topics.md §2.3): head_seq, earliest_seq,
    # count and bytes leave out an fsync topic's appends still waiting for their sync.
    head_seq: int
    # The highest seq handed out: above head_seq while fsync appends wait for their sync.
    assigned_head_seq: int
    earliest_seq: int
    evict_floor: int
    next_seq: int
    count: int
    bytes: int
    config: ConfigView
    durability: Durability
    # fsync class: how long a group commit of its WAL shard takes lately, in ms (the
    # time its acks wait for their sync; docs/semantics/topics.md §2.2); else 0.
    # Required, so that omit_defaults never drops it from the wire.
    fsync_ms: int
    effective_priority: int
    created_ts: int
    last_write_ts: int
    last_read_ts: int
    queue: QueueCounts | None = None  # queue topics only
    # present (true) while a memory topic's records are recovered after a restart
    # (docs/semantics/topics.md §2.2); its counts are then those applied so far
    recovering: bool = False


# --- topic routes ----------------------------------------------------------------------


class TopicPut(ConfigPatch, forbid_unknown_fields=True, omit_defaults=True):
    """``PUT /v0/topics/{topic}``: config fields at the top level, plus the immutable type."""

    type: TopicType | None = None

    def patch(self) -> ConfigPatch:
        return ConfigPatch(**{f: getattr(self, f) for f in ConfigPatch.__struct_fields__})


class TopicList(Struct):
    """``GET /v0/topics``: one page of topics by name; ``next_after`` is the ``after``
    of the next page, None on the last (docs/http-api.md)."""

    topics: list[TopicState]
    next_after: str | None = None


class TopicHistory(Struct):
    """``GET /v0/topics/{topic}/history``: the topic's head seq and bytes over the last
    minutes, sampled by the server as ``[t_ms, head_seq, bytes]`` points, oldest first;
    the last is the state now (docs/console.md, "Rate history")."""

    topic: str
    epoch: int  # the topic instance the points belong to
    interval_ms: int  # the sampling interval; a gap between points held no change
    samples: list[tuple[int, int, int]]


class TopicDeleted(Struct):
    topic: str
    deleted: bool


class AppendRequest(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{topic}/records``."""

    records: Annotated[list[RecordIn], Meta(min_length=1)]
    create: bool | None = None
    config: ConfigPatch | None = None


class AppendResponse(Struct):
    seqs: list[int]
    head_seq: int
    durability: Durability
    # fsync class: how long this ack waited for the sync, in ms
    # (docs/semantics/topics.md §2.2); 0 for the others, never fsync-gated.
    fsync_ms: int = 0


class DiffRequest(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{topic}/diff``: records with ``$seq > from_seq``.

    ``limit`` is at most ``MAX_DIFF_LIMIT`` for a JSON answer (the server refuses more,
    400 invalid_request) and ``MAX_ARROW_DIFF_LIMIT`` for an Arrow page."""

    from_seq: Seq
    limit: Annotated[int, Meta(ge=1, le=MAX_ARROW_DIFF_LIMIT)] = DEFAULT_DIFF_LIMIT
    node: str | list[str] | None = None
    epoch: Seq | None = None
    wait_ms: Annotated[int, Meta(ge=0, le=MAX_WAIT_MS)] = 0


class DiffResponse(Struct, Generic[T], kw_only=True, gc=False):
    """One page of a cursor read: a tombstone (if any) comes before the records."""

    records: list[Record[T]]
    tombstone: Tombstone | None
    next_from_seq: int
    head_seq: int
    earliest_seq: int
    caught_up: bool
    epoch: int
    durability: Durability


class DeleteRequest(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{topic}/delete``: at least one of the two selectors."""

    before_seq: Seq | None = None
    match: str | TagRule | None = None


class DeleteResponse(Struct):
    deleted: int
    earliest_seq: int
    head_seq: int
    count: int
    bytes: int
