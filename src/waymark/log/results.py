"""What engine operations return. Each result renders its own wire JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from .config import Durability, TopicConfig, TopicType

if TYPE_CHECKING:
    from .journal import Commit


@dataclass(frozen=True, slots=True)
class Tombstone:
    """An in-band gap signal (§5.4): live records in [gap_from, gap_to] were lost."""

    seq: int  # == earliest_seq: the first live seq after the gap, a valid resume point
    gap_from: int
    gap_to: int
    reason: str  # cap | ttl | mixed | recreated
    missed_estimate: int
    earliest_seq: int
    head_seq: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "$type": "tombstone",
            "$seq": self.seq,
            "gap_from": self.gap_from,
            "gap_to": self.gap_to,
            "reason": self.reason,
            "missed_estimate": self.missed_estimate,
            "earliest_seq": self.earliest_seq,
            "head_seq": self.head_seq,
        }


@dataclass(frozen=True, slots=True)
class TopicState:
    """A topic's state (§2.3) at one instant."""

    name: str
    type: TopicType
    epoch: int
    config: TopicConfig
    head_seq: int  # the highest seq readers can read (§2.3)
    # the highest seq handed out: above head_seq while fsync appends wait for their sync
    assigned_head_seq: int
    earliest_seq: int
    evict_floor: int
    next_seq: int
    count: int
    bytes: int
    effective_priority: int
    created_ts: int
    last_write_ts: int
    last_read_ts: int
    # §2.2: how long an fsync topic's acks wait for their sync lately (its WAL shard's
    # group commit); 0 for the other classes, which are never fsync-gated
    fsync_ms: int = 0
    queue: dict[str, int] | None = None  # queue topics (§10.5): ready, in_flight, dead_lettered
    # a memory topic whose WAL frames are still being applied after a restart (§2.2):
    # its counts are those applied so far
    recovering: bool = False

    @property
    def durability(self) -> Durability:
        return self.config.durability

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "name": self.name,
            "type": str(self.type),
            "epoch": self.epoch,
            "head_seq": self.head_seq,
            "assigned_head_seq": self.assigned_head_seq,
            "earliest_seq": self.earliest_seq,
            "evict_floor": self.evict_floor,
            "next_seq": self.next_seq,
            "count": self.count,
            "bytes": self.bytes,
            "config": self.config.to_wire(),
            "durability": str(self.config.durability),
            "fsync_ms": self.fsync_ms,
            "effective_priority": self.effective_priority,
            "created_ts": self.created_ts,
            "last_write_ts": self.last_write_ts,
            "last_read_ts": self.last_read_ts,
        }
        if self.recovering:
            wire["recovering"] = True
        if self.queue is not None:
            wire["config"].update(self.config.queue_wire())
            wire["queue"] = self.queue
        return wire


class AppendResult(msgspec.Struct, frozen=True):
    # A Struct, not a frozen dataclass: every append builds one, and a frozen
    # dataclass's __init__ costs ~1 µs (one object.__setattr__ per field).
    seqs: list[int]
    head_seq: int
    durability: Durability
    created: bool  # the write lazily created the topic
    commit: Commit | None = None  # the journal commit of this write (None in memory)
    must_sync: bool = False  # the durability class acks only once ``commit`` is durable

    def to_wire(self, fsync_ms: int = 0) -> dict[str, Any]:
        """``fsync_ms``: how long the ack waited for the sync (§2.2; fsync class only)."""
        return {
            "seqs": self.seqs,
            "head_seq": self.head_seq,
            "durability": str(self.durability),
            "fsync_ms": fsync_ms,
        }


@dataclass(frozen=True, slots=True)
class DeleteResult:
    deleted: int
    earliest_seq: int
    head_seq: int
    count: int
    bytes: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "deleted": self.deleted,
            "earliest_seq": self.earliest_seq,
            "head_seq": self.head_seq,
            "count": self.count,
            "bytes": self.bytes,
        }


@dataclass(slots=True)
class DiffResult:
    """One page of a cursor read (§4.3, §7.3).

    ``runs`` are slices of chunk buffers, each holding one or more consecutive
    wire records separated and terminated by commas, so a page of N records is
    usually one memcpy rather than N encodes. With ``per_record`` reads each run
    is exactly one record and ``seqs`` names it.
    """

    runs: list[bytes | memoryview]
    seqs: list[int]
    count: int
    tombstone: Tombstone | None
    next_from_seq: int
    head_seq: int
    earliest_seq: int
    epoch: int
    durability: Durability
    caught_up: bool = field(default=False)

    def records_json(self) -> bytes:
        """The delivered records as one JSON array."""
        body = b"".join(self.runs)
        return b"[" + body[:-1] + b"]" if body else b"[]"

    def records(self) -> list[dict[str, Any]]:
        return orjson.loads(self.records_json())

    def to_json(self) -> bytes:
        tail = orjson.dumps(
            {
                "tombstone": self.tombstone.to_wire() if self.tombstone else None,
                "next_from_seq": self.next_from_seq,
                "head_seq": self.head_seq,
                "earliest_seq": self.earliest_seq,
                "caught_up": self.caught_up,
                "epoch": self.epoch,
                "durability": str(self.durability),
            }
        )
        if not self.runs:
            return b'{"records":[],' + tail[1:]
        # One join; the last run's trailing comma becomes the array's closing bracket.
        last = self.runs[-1]
        return b"".join((b'{"records":[', *self.runs[:-1], last[:-1], b"],", tail[1:]))
