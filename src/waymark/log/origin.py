"""Where an append's records come from, when not from a producer's write.

The core append (:meth:`waymark.log.engine.Engine.append_encoded`) takes one typed
``origin`` instead of a keyword per feature:

- :class:`Published`: an exactly-once sink's batch, published atomically by
  :mod:`waymark.log.writers`. The mark is the publish ledger's entry and travels in
  the append's own records frame (its ``extra``), so replay restores the ledger with
  the records (docs/durability.md).
- :class:`Derived`: a router's copies of ``source`` records
  (docs/semantics/topics.md §8.1). They are not journaled (a crash re-derives them
  from the router cursor), only the seqs they take are reserved; an fsync dest shows
  them once the source records they copy are durable.
"""

from __future__ import annotations

import msgspec


class Published(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Batch ``batch_id`` of sink writer ``writer``; on disk ``[writer, batch_id]``."""

    writer: str
    batch_id: int


class Derived(msgspec.Struct, frozen=True, gc=False):
    """Copies of records of the topic ``source``."""

    source: str


Origin = Published | Derived


class StagedChunks(msgspec.Struct, frozen=True, gc=False):
    """A sink batch's records as the stage frames that journaled them while they were
    staged: chunks ``(partition, attempt, chunk)`` of the :class:`Published` batch, in
    its order, all in WAL file ``file`` of the topic's shard. The publish may then write
    a frame naming them instead of its records (docs/durability.md, "Staged chunks")."""

    chunks: list[tuple[int, int, int]]
    file: int
