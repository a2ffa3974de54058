"""A producer's unacknowledged window on an edge, held as the pushes it took
(docs/pipeline.md, "In-flight records").

Each push is one packed :class:`~waymark.pipeline.batch.InFlight`, kept as it came:
adding a push, or forgetting pushes the consumer acknowledged whole, copies no other
push; only a push an acknowledgement cuts through is sliced. Positions in the window
count items from its first, across the pushes, as in one ``InFlight``.
"""

from __future__ import annotations

from collections.abc import Iterator

from waymark.pipeline.batch import GENERATION, SEQ, WRITE_BYTES, WRITE_RECORDS, InFlight
from waymark.pipeline.state import Position


class _Push:
    """One push in the window, with what is known of it without a scan."""

    __slots__ = ("oldest", "records", "whole")

    def __init__(self, records: InFlight, whole: int = 0) -> None:
        self.records = records
        # the generation every item was last written under (0: not known to be one);
        # set only here and by Window.place, the one writer of its positions
        self.whole = whole
        self.oldest: Position | None = None  # its least origin, once asked for

    def oldest_origin(self) -> Position | None:
        if self.oldest is None:
            self.oldest = self.records.oldest_origin()
        return self.oldest


class Window:
    """Records pushed to an edge and not yet acknowledged, push by push, in order."""

    __slots__ = ("_pushes", "_size")

    def __init__(self) -> None:
        self._pushes: list[_Push] = []
        self._size = 0

    # --- reading ----------------------------------------------------------------------
    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __repr__(self) -> str:
        return f"Window({self._size} records in {len(self._pushes)} pushes)"

    def joined(self) -> InFlight:
        """Every record held as one ``InFlight`` (a copy: for reading, not the hot path)."""
        joined = InFlight.empty()
        for push in self._pushes:
            joined += push.records
        return joined

    def _spans(self, start: int, end: int) -> Iterator[tuple[_Push, int, int]]:
        """Each push holding items ``start`` to ``end``, with the part of it (from, to)
        in its own items."""
        offset = 0
        for push in self._pushes:
            n = len(push.records)
            lo, hi = max(start - offset, 0), min(end - offset, n)
            if lo < hi:
                yield push, lo, hi
            offset += n
            if offset >= end:
                return

    def written(self, start: int = 0, end: int | None = None) -> int:
        """How many records (from ``start`` to ``end``) have a position on the edge."""
        end = self._size if end is None else end
        return sum(push.records.written(lo, hi) for push, lo, hi in self._spans(start, end))

    def placed(self, generation: int) -> int:
        """How many leading records are written under ``generation`` (a prefix, as in
        :meth:`InFlight.placed`)."""
        total = 0
        for push in self._pushes:
            if push.whole and push.whole == generation:
                total += len(push.records)
                continue
            placed = push.records.placed(generation)
            total += placed
            if placed < len(push.records):
                break
        return total

    def packs(self) -> int:
        return sum(push.records.packs() for push in self._pushes)

    def oldest_origin(self) -> Position | None:
        """The least origin (generation first, then seq); None when empty."""
        return min(filter(None, (push.oldest_origin() for push in self._pushes)), default=None)

    def write_end(
        self, start: int, max_packs: int = WRITE_RECORDS, max_bytes: int = WRITE_BYTES
    ) -> int:
        """Where one write of whole packs from item ``start`` ends, as
        :meth:`InFlight.write_end` over the records joined: it may span pushes."""
        end = start
        for push, lo, hi in self._spans(start, self._size):
            records = push.records
            cut = records.write_end(lo, max_packs, max_bytes)
            size = records.write_size(lo, cut)
            if end > start and size > max_bytes:  # its first pack does not fit: not here
                break
            end += cut - lo
            max_packs -= records.packs(lo, cut)
            max_bytes -= size
            if cut < hi or max_packs <= 0 or max_bytes <= 0:
                break
        return end

    def edge_packs(self, start: int, generation: int, end: int | None = None) -> bytes:
        """The packs of items ``start`` to ``end`` as :meth:`InFlight.edge_packs` writes
        them."""
        end = self._size if end is None else end
        return b",".join([push.records.edge_packs(lo, generation, hi)
                          for push, lo, hi in self._spans(start, end)])  # fmt: skip

    def sink_records(self) -> bytes:
        return b",".join([push.records.sink_records() for push in self._pushes if push.records])

    # --- changing -------------------------------------------------------------------
    def __iadd__(self, records: InFlight) -> Window:
        """Hold one more push (already cut into packs)."""
        if records:
            self._pushes.append(_Push(records))
            self._size += len(records)
        return self

    def place(self, start: int, generation: int, seqs: list[int], end: int | None = None) -> None:
        """Record that the packs of items ``start`` to ``end`` were written as ``seqs``
        of ``generation``, one seq per pack (:meth:`InFlight.place`)."""
        end = self._size if end is None else end
        spans = list(self._spans(start, end))
        counts = [push.records.packs(lo, hi) for push, lo, hi in spans]
        if len(seqs) != sum(counts):
            raise ValueError(f"{len(seqs)} seqs for {sum(counts)} packs")
        first = 0
        for (push, lo, hi), count in zip(spans, counts, strict=True):
            push.records.place(lo, generation, seqs[first : first + count], hi)
            first += count
            whole = push.records.placed(generation) == len(push.records)
            push.whole = generation if whole else 0

    def forget(self, acked: Position) -> None:
        """Forget the records written at or before ``acked`` in its generation
        (:meth:`InFlight.acknowledged`, docs/semantics/pipeline.md §3.4): a push all
        written under another generation is kept as it is, one all acknowledged is
        dropped whole, and only one in between is sliced."""
        kept: list[_Push] = []
        for push in self._pushes:
            records = push.records
            if push.whole and push.whole != acked.generation:
                kept.append(push)
                continue
            if push.whole:  # all of it in the acknowledged generation: by seq alone
                seqs = records.ints[SEQ]
                if int(seqs.max()) <= acked.seq:
                    self._size -= len(records)
                    continue
                if int(seqs.min()) > acked.seq:
                    kept.append(push)
                    continue
            left = records.acknowledged(acked)
            self._size -= len(records) - len(left)
            if left is records:
                kept.append(push)
            elif left:
                gens = left.ints[GENERATION]
                kept.append(_Push(left, int(gens[0]) if bool((gens == gens[0]).all()) else 0))
        self._pushes = kept
