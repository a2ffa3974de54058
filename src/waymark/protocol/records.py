"""Records on the wire: what a producer sends, what a reader gets back, and the
tombstone that stands in for records a reader lost (docs/semantics/topics.md §5.4).

:class:`Record` and the pages that hold records are generic in the type of
``data``: ``Record`` (``data`` decoded to Python values) for applications, and
``Record[msgspec.Raw]`` where ``data`` must stay the producer's JSON bytes (the
Spark source turns a page into Arrow columns without decoding a value). One
definition serves both.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Generic, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct, field

from .limits import MetaKey, RecordId

T = TypeVar("T")

# ["tag", "Eq", "X"] or ["tag", "Glob", "X*"]; a bare string means Eq
# (docs/semantics/topics.md §7.1).
TagRule = tuple[Literal["tag"], Literal["Eq", "Glob"], str]


class RecordIn(Struct, forbid_unknown_fields=True, gc=False):
    """One record as a producer sends it. ``data`` stays raw JSON bytes end to end.

    Not tracked by the garbage collector (it holds strings, bytes and a dict of
    strings: it cannot be part of a cycle): a write's records, thousands alive at
    once, would otherwise push the server into full collections (docs/http-api.md, Performance)."""

    data: msgspec.Raw
    tag: str | None = None
    node: str | None = None
    meta: dict[MetaKey, str] | None = None
    id: RecordId | None = None

    @classmethod
    def of(
        cls,
        data: object,
        *,
        tag: str | None = None,
        node: str | None = None,
        meta: dict[str, str] | None = None,
        id: str | None = None,  # noqa: A002 -- the wire field's name
    ) -> RecordIn:
        """Build a record from a Python value."""
        return cls(msgspec.Raw(msgspec.json.encode(data)), tag, node, meta, id)


# gc=False: a page decodes up to 10 000 of these, and a decoded record cannot be part
# of a reference cycle, so the collector need not track them.
class Record(Struct, Generic[T], kw_only=True, omit_defaults=True, gc=False):
    """A stored record as read back; ``$node``/``$tag``/``meta`` are absent when unset."""

    seq: int = field(name="$seq")
    ts: int = field(name="$ts")
    node: str | None = field(default=None, name="$node")
    tag: str | None = field(default=None, name="$tag")
    meta: dict[str, str] | None = None
    data: T


class PlainRecordIn(Struct, forbid_unknown_fields=True, gc=False):
    """A :class:`RecordIn` that carries ``data`` alone (``{"data":..}``), as the Spark
    sink's rows mostly are: the same wire shape, read without the other fields, so a
    server can stage a chunk of them without a step per record (docs/http-api.md).
    A body with any other field is read as ``RecordIn``s."""

    data: msgspec.Raw


class TombstoneReason(StrEnum):
    """Why the records of a tombstone's gap are gone. The reason is informational; the
    range ``[gap_from, gap_to]`` is authoritative."""

    CAP = "cap"  # evicted by cap_records / cap_bytes
    TTL = "ttl"  # expired
    MIXED = "mixed"  # both of the above
    # the topic was deleted and created again (docs/semantics/topics.md §5.5)
    RECREATED = "recreated"
    # seqs a crash may have lost: acknowledged under a class that does not survive one
    # (docs/semantics/topics.md §4.2, docs/durability.md)
    LOST = "lost"
    # a router's source evicted them before they were forwarded
    # (docs/semantics/topics.md §8.4, docs/routers.md)
    SOURCE_TRIM = "source_trim"


# A plain string, not the enum: a reason this client does not know (a newer server's)
# must decode, since the reason is informational and the gap range authoritative
# (docs/http-api.md, "Tombstones").
Reason = Annotated[
    str,
    Meta(
        description="Why the range was lost; informational, the gap range is authoritative. "
        f"This server sends {', '.join(TombstoneReason)}; treat any other value as a gap too."
    ),
]


class Tombstone(Struct, kw_only=True):
    """Records in [gap_from, gap_to] were lost involuntarily (docs/semantics/topics.md §5.4):
    evicted, expired, lost in a crash, trimmed from a router's source, or the topic was
    recreated.

    ``reason`` is a plain string: one of :class:`TombstoneReason` from this server,
    and kept as sent (never refused) if a newer server adds another.
    """

    type: Literal["tombstone"] = field(default="tombstone", name="$type")
    # The first seq after the gap; ``seq - 1`` is where the read went on from, so it is
    # the cursor to resume from (the SSE id), for a gap mid-topic as at the front.
    seq: int = field(name="$seq")
    gap_from: int
    gap_to: int
    reason: Reason
    missed_estimate: int
    earliest_seq: int
    head_seq: int


__all__ = ["Record", "RecordIn", "TagRule", "Tombstone", "TombstoneReason"]
