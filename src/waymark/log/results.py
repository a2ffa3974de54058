"""What engine operations return that the protocol does not define.

Where a result is a wire shape the engine returns the protocol's Struct itself
(:class:`~waymark.protocol.TopicState`, :class:`~waymark.protocol.Tombstone`,
:class:`~waymark.protocol.DeleteResponse` of a queue's ``delete_seqs``). The results
here carry more than their wire shape. An append's and a read's are on the hot path,
so they render their own JSON bytes; a contract test decodes that output with the
protocol types (:class:`~waymark.protocol.AppendResponse`,
:class:`~waymark.protocol.DiffResponse`). A delete's holds the protocol's
:class:`~waymark.protocol.DeleteResponse` beside the commit its acknowledgement
waits for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import orjson

from ..protocol import DeleteResponse, Durability, Tombstone

if TYPE_CHECKING:
    from .journal import Commit


class AppendResult(msgspec.Struct, frozen=True):
    # A Struct, not a frozen dataclass: every append builds one, and a frozen
    # dataclass's __init__ costs ~1 µs (one object.__setattr__ per field).
    seqs: list[int] | range  # (a range for a columnar append: a sink's publish)
    head_seq: int
    durability: Durability
    created: bool  # the write lazily created the topic
    commit: Commit | None = None  # the journal commit of this write (None in memory)
    must_sync: bool = False  # the durability class acks only once ``commit`` is durable

    def to_wire(self, fsync_ms: int = 0) -> dict[str, Any]:
        """The :class:`~waymark.protocol.AppendResponse` body, for orjson. ``fsync_ms``:
        how long the ack waited for the sync (docs/semantics/topics.md §2.2; the fsync
        class only, 0 for the others)."""
        return {
            "seqs": self.seqs if isinstance(self.seqs, list) else list(self.seqs),
            "head_seq": self.head_seq,
            "durability": str(self.durability),
            "fsync_ms": fsync_ms,
        }


class DeleteResult(msgspec.Struct, frozen=True):
    """What :meth:`~waymark.log.Engine.delete` returns: its answer and the journal commit
    an acknowledgement of it waits for.

    ``commit`` is None when there is none: in memory, or an ephemeral topic, whose
    deletes skip the WAL (docs/semantics/topics.md §2.2).
    """

    response: DeleteResponse
    commit: Commit | None = None


@dataclass(slots=True)
class Span:
    """The slots [i, k) of one chunk that a columnar read delivers, copied out of the
    chunk when read (its buffers keep growing): the records' bytes and their index
    arrays. ``keep`` marks the delivered slots (None: all of them); deleted slots and
    the reader's own node's records are not. :mod:`waymark.log.pages` renders it."""

    base_seq: int  # the seq of slot i
    buf: bytes  # the records' wire JSON, each followed by a comma (maybe bytes between)
    starts: np.ndarray  # where each record begins in ``buf``
    ends: np.ndarray  # where each record (its comma included) ends in ``buf``
    ts: np.ndarray
    node: np.ndarray  # interned ids in ``node_names``, 0: none
    tag: np.ndarray
    size: np.ndarray  # data + meta bytes of each record
    node_names: list[str]  # the chunk's interned names (index 0: none)
    tag_names: list[str]
    keep: np.ndarray | None


@dataclass(slots=True)
class DiffResult:
    """One page of a cursor read (docs/semantics/topics.md §4.3, §7.3).

    ``runs`` are slices of chunk buffers, each holding one or more consecutive
    wire records separated and terminated by commas, so a page of N records is
    usually one memcpy rather than N encodes. With ``per_record`` reads each run
    is exactly one record and ``seqs`` names it. A columnar read (an Arrow page)
    fills ``spans`` instead of ``runs`` and ``seqs``; ``count`` is the delivered
    records either way.
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
    spans: list[Span] = field(default_factory=list)

    def records_json(self) -> bytes:
        """The delivered records as one JSON array."""
        body = b"".join(self.runs)
        return b"[" + body[:-1] + b"]" if body else b"[]"

    def records(self) -> list[dict[str, Any]]:
        return orjson.loads(self.records_json())

    def to_json(self) -> bytes:
        """The :class:`~waymark.protocol.DiffResponse` body."""
        tail = orjson.dumps(
            {
                "tombstone": msgspec.to_builtins(self.tombstone) if self.tombstone else None,
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
