"""The /v0 wire contract as msgspec structs.

Request structs are what the server decodes bodies into (typed decode rejects
bad input before the engine sees it). Response structs mirror what the engine's
results render; the server never builds responses from them (the engine's
``to_wire``/``to_json`` is the hot path), but the OpenAPI document is generated
from them and the Python client decodes into them, so both stay in step with one
definition.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, field

from ..log import ConfigPatch, Discard, Durability, RecordIn, TopicType

Seq = Annotated[int, Meta(ge=0, le=2**63 - 1)]
MAX_DIFF_LIMIT = 10_000
MAX_WAIT_MS = 60_000

# ["tag", "Eq", "X"] or ["tag", "Glob", "X*"]; a bare string means Eq.
TagRule = tuple[Literal["tag"], Literal["Eq", "Glob"], str]


# --- requests --------------------------------------------------------------------


class TopicPut(ConfigPatch, forbid_unknown_fields=True, omit_defaults=True):
    """``PUT /v0/topics/{topic}``: config fields at the top level, plus the immutable type."""

    type: TopicType | None = None

    def patch(self) -> ConfigPatch:
        return ConfigPatch(**{f: getattr(self, f) for f in ConfigPatch.__struct_fields__})


class AppendRequest(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{topic}/records``."""

    records: Annotated[list[RecordIn], Meta(min_length=1)]
    create: bool | None = None
    config: ConfigPatch | None = None


class DiffRequest(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{topic}/diff``: records with ``$seq > from_seq``."""

    from_seq: Seq
    limit: Annotated[int, Meta(ge=1, le=MAX_DIFF_LIMIT)] = 1000
    node: str | list[str] | None = None
    epoch: Seq | None = None
    wait_ms: Annotated[int, Meta(ge=0, le=MAX_WAIT_MS)] = 0


class DeleteRequest(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{topic}/delete``: at least one of the two selectors."""

    before_seq: Seq | None = None
    match: str | TagRule | None = None


# --- responses -------------------------------------------------------------------


class Health(Struct):
    status: Literal["ok"]


class TopicConfig(Struct, kw_only=True):
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


class TopicState(Struct, kw_only=True):
    name: str
    type: TopicType
    epoch: int
    head_seq: int  # what readers can read
    assigned_head_seq: int  # above head_seq while fsync appends wait for their sync
    earliest_seq: int
    evict_floor: int
    next_seq: int
    count: int
    bytes: int
    config: TopicConfig
    durability: Durability
    fsync_ms: int  # fsync class: how long acks wait for their sync lately; else 0
    effective_priority: int
    created_ts: int
    last_write_ts: int
    last_read_ts: int
    queue: dict[str, int] | None = None  # queue topics: ready, in_flight, dead_lettered
    recovering: bool = False  # present (true) while a memory topic recovers after a restart


class TopicList(Struct):
    topics: list[TopicState]


class TopicDeleted(Struct):
    topic: str
    deleted: bool


class AppendResponse(Struct):
    seqs: list[int]
    head_seq: int
    durability: Durability
    fsync_ms: int  # fsync class: how long this ack waited for the sync; else 0


class Record(Struct, kw_only=True, omit_defaults=True):
    """A stored record as read back; ``$node``/``$tag``/``meta`` are absent when unset."""

    seq: int = field(name="$seq")
    ts: int = field(name="$ts")
    node: str | None = field(default=None, name="$node")
    tag: str | None = field(default=None, name="$tag")
    meta: dict[str, str] | None = None
    data: Any


class Tombstone(Struct, kw_only=True):
    """Live records in [gap_from, gap_to] were lost to cap/TTL or a recreate (§5.4)."""

    type: Literal["tombstone"] = field(name="$type")
    seq: int = field(name="$seq")
    gap_from: int
    gap_to: int
    reason: Literal["cap", "ttl", "mixed", "recreated"]
    missed_estimate: int
    earliest_seq: int
    head_seq: int


class DiffResponse(Struct, kw_only=True):
    records: list[Record]
    tombstone: Tombstone | None
    next_from_seq: int
    head_seq: int
    earliest_seq: int
    caught_up: bool
    epoch: int
    durability: Durability


class DeleteResponse(Struct):
    deleted: int
    earliest_seq: int
    head_seq: int
    count: int
    bytes: int


class ErrorBody(Struct):
    code: str
    message: str
    detail: dict[str, Any]


class Error(Struct):
    error: ErrorBody
