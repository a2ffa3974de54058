"""The receipt bookkeeping of one client, in memory and pure (no I/O, no clock):
which checkpoints are known, which keys each still waits for, which are receipted
and persisted, where the low watermark may go (docs/semantics/recovery.md §3).

:class:`~waymark.recovery.service.RecoveryService` drives it and does the I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ..protocol import Checkpoint
from .types import RecoveryError

# A key's version as the ledger orders it: (topic epoch, seq). A recreated topic's seqs
# start again, in a later epoch (docs/semantics/recovery.md §1.1).
Version = tuple[int, int]
_NONE: Version = (-1, -1)  # below every version


def covered(ranges: list[tuple[int, int]], checkpoint: int) -> bool:
    return any(begin <= checkpoint <= end for begin, end in ranges)


@dataclass
class Recovery:
    """What a recovery query found (docs/semantics/recovery.md §3.3)."""

    missed: dict[str, Version] = field(default_factory=dict)  # key -> newest unreceipted
    recent: list[Checkpoint] = field(default_factory=list)  # too recent to call missed
    oldest: int | None = None  # the oldest checkpoint id the walk saw
    reached: bool = False  # the walk reached the watermark (else it ended at the window)


class Ledger:
    def __init__(self, low_watermark: int) -> None:
        self.low_watermark = low_watermark
        self._known: list[int] = []  # known checkpoint ids above the watermark
        self._sorted = True  # whether _known is ascending (the query adds them descending)
        self._entries: dict[int, dict[str, Version]] = {}  # not persisted: key -> last version
        self._waiting: dict[int, set[str]] = {}  # not persisted: keys not receipted yet
        self._persisted: set[int] = set()
        self._ready: set[int] = set()  # complete, receipt not persisted yet
        self._holding: dict[str, set[int]] = {}  # key -> not-persisted ids naming it
        self._newest: dict[str, Version] = {}  # key -> newest version known committed
        self._tail: tuple[int, int] | None = None  # the range receipt written last

    # --- checkpoints -------------------------------------------------------------------
    def known(self, checkpoint: int) -> bool:
        return (
            checkpoint <= self.low_watermark
            or checkpoint in self._persisted
            or (checkpoint in self._entries)
        )

    def add(self, checkpoint: Checkpoint, *, receipted: bool = False,
            implicit: dict[str, Version] | None = None) -> bool:  # fmt: skip
        """Learn of ``checkpoint``; ``receipted``: a stored range covers it; a key whose
        version ``implicit`` receipts is receipted already
        (docs/semantics/recovery.md §3.3). False if known."""
        if self.known(checkpoint.id):
            return False
        if self._known and checkpoint.id < self._known[-1]:
            self._sorted = False
        self._known.append(checkpoint.id)
        if receipted:
            self._persisted.add(checkpoint.id)
            for change in checkpoint.changes:  # known committed: a receipt again is idempotent
                version = (change.epoch, change.last)
                if self._newest.get(change.key, _NONE) < version:
                    self._newest[change.key] = version
            return True
        entries = {c.key: (c.epoch, c.last) for c in checkpoint.changes}
        self._entries[checkpoint.id] = entries
        waiting = self._waiting[checkpoint.id] = set()
        for key, last in entries.items():
            if self._newest.get(key, _NONE) < last:
                self._newest[key] = last
            self._holding.setdefault(key, set()).add(checkpoint.id)
            if implicit is None or implicit.get(key, _NONE) < last:
                waiting.add(key)
        if self.complete(checkpoint.id):
            self._ready.add(checkpoint.id)
        return True

    def complete(self, checkpoint: int) -> bool:
        """Every key of ``checkpoint`` is receipted: its receipt may be persisted."""
        return not self._waiting[checkpoint]

    def receipt(self, key: str, version: Version) -> set[int] | None:
        """Receipt ``key`` up to ``version`` (docs/semantics/recovery.md §2.1); the
        not-yet-persisted checkpoints naming it at or below that version, whose
        persistence the receipt waits for. None: no checkpoint the ledger saw names the
        key (the service asks the log). Refused: an epoch the ledger does not know the
        key in, a version above the newest it knows."""
        newest = self._newest.get(key)
        if newest is None:
            return None
        epoch, seq = version
        epochs = {self._entries[c][key][0] for c in self._holding.get(key, ())} | {newest[0]}
        if epoch not in epochs:
            known = ", ".join(map(str, sorted(epochs)))
            raise RecoveryError(
                f"{key!r} has no version in epoch {epoch}: the checkpoints name it in epoch "
                f"{known} (the epoch is the topic instance of the version: pass the "
                "CommittedVersion as it was handed over)"
            )
        if version > newest:
            raise RecoveryError(
                f"{key!r} at version {seq} of epoch {epoch} is not known to be committed: "
                f"the newest known is version {newest[1]} of epoch {newest[0]}"
            )
        hit: set[int] = set()
        for checkpoint in self._holding.get(key, ()):
            if self._entries[checkpoint][key] <= version:
                self._waiting[checkpoint].discard(key)
                hit.add(checkpoint)
                if self.complete(checkpoint):
                    self._ready.add(checkpoint)
        return hit

    def ready(self) -> list[int]:
        """Complete checkpoints whose receipt is not persisted yet, ascending."""
        return sorted(self._ready)

    def has_ready(self) -> bool:
        return bool(self._ready)

    def waiting(self) -> Iterator[tuple[int, set[str]]]:
        """Checkpoints still waiting for receipts, with the keys they wait for."""
        for checkpoint, keys in sorted(self._waiting.items()):
            if keys:
                yield checkpoint, keys

    def unreceipted(self, checkpoint: int) -> list[tuple[str, Version]]:
        """The keys ``checkpoint`` still waits for, with its version of each."""
        entries = self._entries.get(checkpoint, {})
        return [(key, entries[key]) for key in sorted(self._waiting.get(checkpoint, ()))]

    def persisted(self, checkpoint: int) -> bool:
        return checkpoint <= self.low_watermark or checkpoint in self._persisted

    @property
    def _ids(self) -> list[int]:
        """The known ids, ascending (sorted once after a query, not per insert)."""
        if not self._sorted:
            self._known.sort()
            self._sorted = True
        return self._known

    # --- range receipts -----------------------------------------------------------------
    def range_for(self, checkpoint: int) -> tuple[int, int]:
        """The range receipt to write for complete ``checkpoint``: the last one grown by
        it when it follows that range's end among the known ids, else a new one."""
        i = bisect_left(self._ids, checkpoint)
        before = self._ids[i - 1] if i > 0 else None
        if self._tail is not None and before is not None and self._tail[1] == before:
            return self._tail[0], checkpoint
        return checkpoint, checkpoint

    def mark_persisted(self, checkpoint: int, written: tuple[int, int]) -> None:
        self._tail = written
        self._persisted.add(checkpoint)
        self._ready.discard(checkpoint)
        for key in self._entries.pop(checkpoint):
            holding = self._holding[key]
            holding.discard(checkpoint)
            if not holding:
                del self._holding[key]
        del self._waiting[checkpoint]

    def watermark(self) -> int:
        """The highest id below which every known checkpoint's receipt is persisted
        (docs/semantics/recovery.md §3.2): never past one that is not."""
        mark = self.low_watermark
        for checkpoint in self._ids:
            if checkpoint not in self._persisted:
                break
            mark = checkpoint
        return mark

    def advance(self, mark: int) -> None:
        """The watermark ``mark`` is persisted: forget what lies at or below it."""
        cut = bisect_left(self._ids, mark + 1)
        for checkpoint in self._ids[:cut]:
            self._persisted.discard(checkpoint)
        del self._ids[:cut]
        self.low_watermark = max(self.low_watermark, mark)

    def merged(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[tuple[int, int], list[int]]]:
        """Compression (docs/semantics/recovery.md §4.2): runs of stored ranges with no
        known checkpoint between them, each as ``(merged range, begins it makes
        redundant)``; only runs of two or more."""
        runs: list[tuple[tuple[int, int], list[int]]] = []
        current: tuple[int, int] | None = None
        begins: list[int] = []
        for begin, end in sorted(ranges):
            if current is not None and self._adjacent(current[1], begin):
                current = current[0], max(current[1], end)
                begins.append(begin)
                continue
            if current is not None and begins:
                runs.append((current, begins))
            current, begins = (begin, end), []
        if current is not None and begins:
            runs.append((current, begins))
        return runs

    def _adjacent(self, end: int, begin: int) -> bool:
        """No known checkpoint lies strictly between ``end`` and ``begin``."""
        if begin <= end + 1:
            return True
        i = bisect_left(self._ids, end + 1)
        return i == len(self._ids) or self._ids[i] >= begin


class Walk:
    """The recovery query (docs/semantics/recovery.md §3.3), one checkpoint at a time:
    the checkpoints above the watermark up to id ``newest``, newest first, against the
    stored ``ranges``. A checkpoint no range covers is unreceipted, except for the keys a
    newer covered one names at the same or a later version (the client receipted
    those, docs/semantics/recovery.md §2.1). Unreceipted checkpoints after
    ``recent_ms`` are in flight, not missed; all are added to ``ledger``. Fed by a
    blocking or an asyncio source alike."""

    def __init__(
        self, ledger: Ledger, ranges: list[tuple[int, int]], newest: int, recent_ms: int
    ) -> None:
        self.ledger, self.ranges, self.newest, self.recent_ms = ledger, ranges, newest, recent_ms
        self.found = Recovery()
        self._subsumed: dict[str, Version] = {}

    def step(self, checkpoint: Checkpoint) -> bool:
        """Take the next older checkpoint; False once the walk reached the watermark."""
        ledger, found, subsumed = self.ledger, self.found, self._subsumed
        if checkpoint.id > self.newest:
            return True  # the listener brings it
        if checkpoint.id <= ledger.low_watermark:
            found.reached = True
            return False
        found.oldest = checkpoint.id
        if covered(self.ranges, checkpoint.id):
            ledger.add(checkpoint, receipted=True)
            for change in checkpoint.changes:
                version = (change.epoch, change.last)
                if subsumed.get(change.key, _NONE) < version:
                    subsumed[change.key] = version
            return True
        if not ledger.add(checkpoint, implicit=subsumed):
            return True
        if checkpoint.time_ms > self.recent_ms:
            found.recent.append(checkpoint)
            return True
        for change in checkpoint.changes:
            version = (change.epoch, change.last)
            if subsumed.get(change.key, _NONE) < version:
                found.missed[change.key] = max(found.missed.get(change.key, _NONE), version)
        return True

    def done(self) -> Recovery:
        """The outcome: a key an in-flight checkpoint names goes to the listener with
        that (newer) version, not to the missed ones too (once per subscribe)."""
        found = self.found
        found.recent.reverse()
        for checkpoint in found.recent:
            for key, _ in self.ledger.unreceipted(checkpoint.id):
                found.missed.pop(key, None)
        return found
