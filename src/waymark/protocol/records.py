"""Records on the wire: what a producer sends, what a reader gets back, and the
tombstone that stands in for records a reader lost (§5.4).

:class:`Record` and the pages that hold records are generic in the type of
``data``: ``Record`` (``data`` decoded to Python values) for applications, and
``Record[msgspec.Raw]`` where ``data`` must stay the producer's JSON bytes (the
Spark source turns a page into Arrow columns without decoding a value). One
definition serves both.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Generic, Literal, TypeVar

import msgspec
from msgspec import Struct, field

T = TypeVar("T")

# ["tag", "Eq", "X"] or ["tag", "Glob", "X*"]; a bare string means Eq (§7.1).
TagRule = tuple[Literal["tag"], Literal["Eq", "Glob"], str]


class RecordIn(Struct, forbid_unknown_fields=True):
    """One record as a producer sends it. ``data`` stays raw JSON bytes end to end."""

    data: msgspec.Raw
    tag: str | None = None
    node: str | None = None
    meta: dict[str, str] | None = None
    id: str | None = None

    @classmethod
    def of(
        cls,
        data: object,
        *,
        tag: str | None = None,
        node: str | None = None,
        meta: dict[str, str] | None = None,
        id: str | None = None,
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


class TombstoneReason(StrEnum):
    """Why the records of a tombstone's gap are gone. The reason is informational; the
    range ``[gap_from, gap_to]`` is authoritative."""

    CAP = "cap"  # evicted by cap_records / cap_bytes
    TTL = "ttl"  # expired
    MIXED = "mixed"  # both of the above
    RECREATED = "recreated"  # the topic was deleted and created again (§5.5)
    LOST = "lost"  # acknowledged under a class that does not survive a crash (§4.2)
    SOURCE_TRIM = "source_trim"  # a router's source evicted them before forwarding (§8.4)


class Tombstone(Struct, kw_only=True):
    """Live records in [gap_from, gap_to] were lost involuntarily (§5.4).

    ``reason`` is a plain string: one of :class:`TombstoneReason` from this server,
    and kept as sent (never refused) if a newer server adds another.
    """

    type: Literal["tombstone"] = field(default="tombstone", name="$type")
    seq: int = field(name="$seq")  # the first seq after the gap: a resume point
    gap_from: int
    gap_to: int
    reason: str
    missed_estimate: int
    earliest_seq: int
    head_seq: int


__all__ = ["Record", "RecordIn", "TagRule", "Tombstone", "TombstoneReason"]
