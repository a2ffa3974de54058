"""The ordered checkpoint tracker: a pure state machine, no I/O.

Per source it keeps the three structures of docs/semantics/checkpoint.md §1:

- ``committed``: the safe restart point, the checkpoint of the highest batch below
  which every batch is terminally resolved;
- ``in_flight``: batches handed to ``begin_send()`` and not yet resolved;
- ``pending_acks``: batches acked or rejected that cannot commit yet because a lower
  batch is unresolved.

It also keeps ``queued``: batches created but not on the wire (never sent, or back
from a transient failure). Their data precedes every later batch, so they hold the
checkpoint exactly as an in-flight batch does; this is what "checkpoint frozen"
means for a failed batch.

Not thread-safe: drive one tracker from one thread (one asyncio loop).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from waymark.checkpoint.errors import DrainIncomplete, TrackerStopped
from waymark.checkpoint.tickets import QueuedTicket

C = TypeVar("C")

_MISSING = object()


@dataclass(frozen=True, slots=True)
class Committed(Generic[C]):
    """A source's safe restart point: the highest committed batch and its checkpoint."""

    batch_id: int
    checkpoint: C


@dataclass(frozen=True, slots=True)
class SourceView(Generic[C]):
    """A copy of one source's state, for inspection and tests."""

    committed: Committed[C] | None
    queued: Mapping[int, C]
    in_flight: Mapping[int, C]
    pending_acks: Mapping[int, C]
    next_batch_id: int
    rejected: int
    failed: int
    abandoned: int


class _Source(Generic[C]):
    __slots__ = (
        "abandoned",
        "committed",
        "committed_batch",
        "failed",
        "in_flight",
        "name",
        "next_batch",
        "pending_acks",
        "queued",
        "rejected",
    )

    def __init__(self, name: str, committed: Committed[C] | None) -> None:
        self.name = name
        # committed_batch 0 means nothing committed yet; batch ids start at 1.
        self.committed: C | None = None if committed is None else committed.checkpoint
        self.committed_batch = 0 if committed is None else committed.batch_id
        self.next_batch = self.committed_batch + 1
        self.queued: dict[int, C] = {}
        self.in_flight: dict[int, C] = {}
        self.pending_acks: dict[int, C] = {}
        self.rejected = 0
        self.failed = 0
        self.abandoned = 0


class Tracker(Generic[C]):
    """Ordered checkpoints for any number of sources.

    ``committed`` restores the safe restart points loaded from a
    :class:`~waymark.checkpoint.store.CheckpointStore`; batch ids then continue
    after each source's committed batch.
    """

    def __init__(self, committed: Mapping[str, Committed[C]] | None = None) -> None:
        self._sources: dict[str, _Source[C]] = {}
        for name, point in (committed or {}).items():
            if point.batch_id < 1:
                raise ValueError(f"source {name!r}: a committed batch id is at least 1")
            self._sources[name] = _Source(name, point)
        self._unresolved = 0
        self._stopping = False
        self._stopped = False
        # Tickets collected by the GC land here; the batches are released on the next
        # query, because a finaliser may run in the middle of any operation.
        self._dropped: list[tuple[_Source[C], int]] = []
        self._dropped_total = 0
        self._wakers: list[Callable[[], None]] = []
        # Bumped whenever a committed checkpoint advances: persist when it changed.
        self.version = 0

    # -- batches ---------------------------------------------------------------

    def create_batch(self, source: str, checkpoint: C) -> QueuedTicket[C]:
        """Register the next batch of ``source``, whose data ends at ``checkpoint``.

        Create batches in the order of their data: batch ids follow creation order
        and the committed checkpoint only ever moves to a higher batch.
        """
        if self._stopping:
            raise TrackerStopped(f"cannot create a batch for {source!r}: the tracker is stopping")
        src = self._sources.get(source)
        if src is None:
            src = self._sources[source] = _Source(source, None)
        batch_id = src.next_batch
        src.next_batch = batch_id + 1
        src.queued[batch_id] = checkpoint
        self._unresolved += 1
        return QueuedTicket(self, src, batch_id, checkpoint, 0)

    def _begin_send(self, src: _Source[C], batch_id: int) -> None:
        src.in_flight[batch_id] = src.queued.pop(batch_id)

    def _settle(self, src: _Source[C], batch_id: int) -> bool:
        """Move an acked or rejected batch to pending_acks; True if committed advanced."""
        src.pending_acks[batch_id] = src.in_flight.pop(batch_id)
        self._unresolved -= 1
        advanced = self._advance(src)
        if self._wakers and self._drain_possible():
            self._wake()
        return advanced

    def _reject(self, src: _Source[C], batch_id: int) -> bool:
        src.rejected += 1
        return self._settle(src, batch_id)

    def _fail(self, src: _Source[C], batch_id: int) -> None:
        src.failed += 1
        src.queued[batch_id] = src.in_flight.pop(batch_id)

    def _abandon(self, src: _Source[C], batch_id: int) -> None:
        del src.queued[batch_id]
        self._release_abandoned(src)

    def _release_abandoned(self, src: _Source[C]) -> None:
        # The batch never reaches pending_acks, so committed can never pass it.
        src.abandoned += 1
        self._unresolved -= 1
        if self._wakers and self._drain_possible():
            self._wake()

    def _drain_possible(self) -> bool:
        # Dropped tickets not yet collected still count in _unresolved.
        return self._unresolved <= len(self._dropped)

    def _advance(self, src: _Source[C]) -> bool:
        """Consume pending acks from the lowest while no unresolved batch lies below it.

        This is the ordering guard. Batch ids are dense, so every id between the
        committed batch and the lowest pending ack is queued, in flight or abandoned;
        "nothing unresolved below the lowest pending ack" is therefore exactly "the
        batch right after the committed one is pending": O(1), no search.
        """
        pending = src.pending_acks
        batch_id = src.committed_batch + 1
        checkpoint = pending.pop(batch_id, _MISSING)
        if checkpoint is _MISSING:
            return False
        while (following := pending.pop(batch_id + 1, _MISSING)) is not _MISSING:
            batch_id += 1
            checkpoint = following
        src.committed = checkpoint  # type: ignore[assignment]
        src.committed_batch = batch_id
        self.version += 1
        return True

    def _ticket_dropped(self, src: _Source[C], batch_id: int) -> int:
        self._dropped.append((src, batch_id))
        self._dropped_total += 1
        if self._wakers:
            self._wake()
        return self._dropped_total

    def _collect_dropped(self) -> None:
        while self._dropped:
            src, batch_id = self._dropped.pop()
            if src.queued.pop(batch_id, _MISSING) is _MISSING:
                del src.in_flight[batch_id]
            self._release_abandoned(src)

    # -- queries ---------------------------------------------------------------

    def committed(self, source: str) -> Committed[C] | None:
        """The safe restart point of ``source``, or None if nothing is committed."""
        src = self._sources.get(source)
        if src is None or src.committed_batch == 0:
            return None
        return Committed(src.committed_batch, src.committed)  # type: ignore[arg-type]

    def snapshot(self) -> dict[str, Committed[C]]:
        """Every source's committed checkpoint: what the store persists."""
        return {
            name: Committed(src.committed_batch, src.committed)  # type: ignore[arg-type]
            for name, src in self._sources.items()
            if src.committed_batch
        }

    def view(self, source: str) -> SourceView[C]:
        """A copy of the full state of ``source`` (empty if it was never seen)."""
        self._collect_dropped()
        src = self._sources.get(source) or _Source(source, None)
        return SourceView(
            committed=self.committed(source),
            queued=dict(src.queued),
            in_flight=dict(src.in_flight),
            pending_acks=dict(src.pending_acks),
            next_batch_id=src.next_batch,
            rejected=src.rejected,
            failed=src.failed,
            abandoned=src.abandoned,
        )

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(self._sources)

    @property
    def unresolved(self) -> int:
        """Batches queued or in flight, over all sources."""
        self._collect_dropped()
        return self._unresolved

    @property
    def drained(self) -> bool:
        """True when every batch created so far is resolved."""
        return self.unresolved == 0

    @property
    def dropped_tickets(self) -> int:
        """Unresolved tickets garbage-collected so far (warned on the 1st, 2nd, 4th, ...)."""
        return self._dropped_total

    # -- stop / drain ----------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def stopped(self) -> bool:
        return self._stopped

    def begin_stop(self) -> None:
        """Refuse new batches from now on; the ones already created may still resolve."""
        self._stopping = True

    def stop(self) -> dict[str, Committed[C]]:
        """Stop, which is only possible once every batch is resolved.

        Raises :class:`DrainIncomplete` otherwise (and begins the stop anyway, so no
        new batch slips in). Returns the final committed snapshot.
        """
        self.begin_stop()
        if not self.drained:
            detail = ", ".join(
                f"{src.name!r}: {len(src.queued)} queued, {len(src.in_flight)} in flight"
                for src in self._sources.values()
                if src.queued or src.in_flight
            )
            raise DrainIncomplete(f"{self._unresolved} batches unresolved ({detail})")
        self._stopped = True
        return self.snapshot()

    async def drain(self) -> dict[str, Committed[C]]:
        """Begin the stop, wait until every batch is resolved, then stop."""
        self.begin_stop()
        loop = asyncio.get_running_loop()
        nudged = asyncio.Event()

        def wake() -> None:
            # A closed loop raises RuntimeError: then nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(nudged.set)

        self._wakers.append(wake)
        try:
            while not self.drained:
                await nudged.wait()
                nudged.clear()
        finally:
            self._wakers.remove(wake)
        return self.stop()

    def _wake(self) -> None:
        for wake in tuple(self._wakers):
            wake()
