"""What engine operations return. Each result renders its own wire JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from .config import Durability, TopicConfig, TopicType

if TYPE_CHECKING:
    from .journal import Commit


class TombstoneReason(StrEnum):
    """Every reason this server puts in a tombstone (docs/http-api.md, "Tombstones").

    The reason is informational, the gap range authoritative: a reader meeting a value
    it does not know (a newer server's) treats it like any other gap.
    """

    CAP = "cap"  # evicted by cap_records / cap_bytes
    TTL = "ttl"  # expired
    MIXED = "mixed"  # both contributed
    RECREATED = "recreated"  # the topic was deleted and recreated
    LOST = "lost"  # seqs a crash may have lost (docs/durability.md)
    SOURCE_TRIM = "source_trim"  # a router's source dropped them unforwarded (docs/routers.md)


@dataclass(frozen=True, slots=True)
class Tombstone:
    """An in-band gap signal (docs/semantics/topics.md §5.4): live records in [gap_from, gap_to]
    were lost."""

    # The first seq after the gap; ``seq - 1`` is where the read went on from, so it is
    # the cursor to resume from (the SSE id), for a gap mid-topic as at the front.
    seq: int
    gap_from: int
    gap_to: int
    reason: str  # a TombstoneReason value
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
    """A topic's state (docs/semantics/topics.md §2.3) at one instant."""

    name: str
    type: TopicType
    epoch: int
    config: TopicConfig
    head_seq: int
    earliest_seq: int
    evict_floor: int
    next_seq: int
    count: int
    bytes: int
    effective_priority: int
    created_ts: int
    last_write_ts: int
    last_read_ts: int
    # queue topics (docs/semantics/topics.md §10.5): ready, in_flight, dead_lettered,
    # dead_letter_parked and dead_letter_error (the dead-letter topic's last refusal
    # while jobs are parked)
    queue: dict[str, Any] | None = None
    # a memory topic whose WAL frames are still being applied after a restart
    # (docs/semantics/topics.md §2.2): its counts are those applied so far
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
            "earliest_seq": self.earliest_seq,
            "evict_floor": self.evict_floor,
            "next_seq": self.next_seq,
            "count": self.count,
            "bytes": self.bytes,
            "config": self.config.to_wire(),
            "durability": str(self.config.durability),
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

    def to_wire(self) -> dict[str, Any]:
        return {"seqs": self.seqs, "head_seq": self.head_seq, "durability": str(self.durability)}


@dataclass(frozen=True, slots=True)
class DeleteResult:
    deleted: int
    earliest_seq: int
    head_seq: int
    count: int
    bytes: int
    # The journal commit an acknowledgement of Engine.delete waits for; None when there is
    # none: in memory, or an ephemeral topic, whose deletes skip the WAL
    # (docs/semantics/topics.md §2.2).
    commit: Commit | None = None

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
    """One page of a cursor read (docs/semantics/topics.md §4.3, §7.3).

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
