"""Records in flight on an edge, held column by column (docs/pipeline.md, "In-flight
records").

What a producer keeps until the consumer acknowledges it, and what a consumer pops,
is one :class:`InFlight`: the event ids (each a JSON string, quotes included) and the
data (each a JSON value) concatenated into two byte strings with their end offsets,
and the origin, birth time and edge position as int64 columns. No record is a Python
object of its own; one is cut out only where a stage's function must see it
(:meth:`InFlight.records`), and the HTTP bodies are joined from the buffers.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from waymark.pipeline.state import Position
from waymark.protocol import EDGE_GEN, EDGE_ITEMS, Limits

# One append carries at most the server's max records per write, and a body well
# under its max body size: ids count twice (the record id and, on an edge, in the
# pack), plus a fixed overhead per record (docs/semantics/pipeline.md §3.7).
WRITE_RECORDS = Limits().max_records_per_write
WRITE_BYTES = Limits().max_body_bytes // 2
RECORD_OVERHEAD = 128

# An edge record is a pack of items (docs/semantics/pipeline.md §3.1): at most
# PACK_ITEMS of them and PACK_BYTES of ids, data and birth times, a quarter of the
# server's max record size, so a pack of items within limits is always accepted.
PACK_ITEMS = 1000
PACK_BYTES = Limits().max_record_bytes // 4
ITEM_OVERHEAD = 24  # a birth time's digits and the separators

# The meta key of a pack's generation (docs/semantics/pipeline.md §3.1).
GEN = EDGE_GEN

# The rows of the int64 table: the end offsets of the event ids and of the data, the
# origin (the input position, ``(0, n)`` for a source's n-th event), the birth time,
# the position on the edge (generation 0 there means not written yet: generations are
# positive, docs/semantics/pipeline.md §1.1; every item of a pack has the pack's
# position) and 1 where an item starts a pack (a producer's window is cut into packs
# as it takes records, docs/semantics/pipeline.md §3.1).
EVENT_END, DATA_END, ORIGIN_GEN, ORIGIN_SEQ, BORN_MS, GENERATION, SEQ, PACK = range(8)
_ROWS = 8

Ints = npt.NDArray[np.int64]
IntColumn = int | Sequence[int] | Ints

_encode = msgspec.json.encode


def _ends(parts: Sequence[bytes]) -> Ints:
    return np.cumsum(np.fromiter(map(len, parts), np.int64, len(parts)), dtype=np.int64)


class InFlight:
    """Records in flight, column by column; immutable but for :meth:`place`."""

    __slots__ = ("data", "events", "ints")

    def __init__(self, events: bytes, data: bytes, ints: Ints) -> None:
        self.events = events  # JSON strings, concatenated
        self.data = data  # JSON values, concatenated
        self.ints = ints  # shape (8, n): the rows named above

    # --- building ---------------------------------------------------------------------
    @classmethod
    def empty(cls) -> InFlight:
        return cls(b"", b"", np.zeros((_ROWS, 0), np.int64))

    @classmethod
    def build(
        cls,
        events: Sequence[bytes],
        data: Sequence[bytes],
        *,
        origin_gen: IntColumn = 0,
        origin_seq: IntColumn = 0,
        born_ms: IntColumn = 0,
        generation: IntColumn = 0,
        seq: IntColumn = 0,
    ) -> InFlight:
        """From encoded parts: ``events`` JSON strings (``msgspec.json.encode(id)``),
        ``data`` JSON values; each int column one value for all or one per record."""
        if len(events) != len(data):
            raise ValueError(f"{len(events)} event ids for {len(data)} data values")
        ints = np.empty((_ROWS, len(events)), np.int64)
        ints[EVENT_END] = _ends(events)
        ints[DATA_END] = _ends(data)
        ints[ORIGIN_GEN] = origin_gen
        ints[ORIGIN_SEQ] = origin_seq
        ints[BORN_MS] = born_ms
        ints[GENERATION] = generation
        ints[SEQ] = seq
        ints[PACK] = 0
        return cls(b"".join(events), b"".join(data), ints)

    @classmethod
    def of(
        cls,
        events: Iterable[str],
        data: Iterable[bytes],
        *,
        origins: Iterable[Position] | None = None,
        born_ms: IntColumn = 0,
    ) -> InFlight:
        """From event ids as strings and JSON data; ``origins`` default to ``(0, i)``.
        Each data value must be one JSON value: it goes into request bodies as is."""
        ids = [_encode(event) for event in events]
        values = list(data)
        for n, value in enumerate(values):
            try:
                msgspec.json.decode(value)
            except msgspec.DecodeError as error:
                raise ValueError(f"data {n} is not one JSON value: {value[:80]!r}") from error
        places = list(origins) if origins is not None else [Position(0, i) for i in range(len(ids))]
        return cls.build(
            ids, values, born_ms=born_ms,
            origin_gen=[p.generation for p in places], origin_seq=[p.seq for p in places],
        )  # fmt: skip

    # --- reading ----------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.ints.shape[1])

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        return f"InFlight({len(self)} records)"

    def _span(self, row: int, i: int) -> tuple[int, int]:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        return (int(self.ints[row, i - 1]) if i else 0), int(self.ints[row, i])

    def event_json(self, i: int) -> bytes:
        lo, hi = self._span(EVENT_END, i)
        return self.events[lo:hi]

    def event_jsons(self) -> list[bytes]:
        """Every record's event id JSON, in order, cut once from the buffer."""
        return _cut(self.events, self.ints[EVENT_END])

    def values(self) -> list[bytes]:
        """Every record's data, in order, cut once from the buffer."""
        return _cut(self.data, self.ints[DATA_END])

    def origins_of(self, source: Sequence[int]) -> dict[str, Ints]:
        """For records made of records ``source`` of this one (an index each): their
        origins (these records' positions) and birth times, as :meth:`build` takes them."""
        at = np.asarray(source, np.intp)
        return {"origin_gen": self.ints[GENERATION, at], "origin_seq": self.ints[SEQ, at],
                "born_ms": self.ints[BORN_MS, at]}  # fmt: skip

    def outputs(self, data: Sequence[bytes], source: Sequence[int], stage: bytes) -> InFlight:
        """The records a stage's function made of these: output ``j`` is ``data[j]``, made
        of record ``source[j]`` (non-decreasing), whose origin and birth it takes; the
        first output of a record keeps its event id, the ``k``-th next is
        ``<event>/<stage>:<k>`` (``stage`` as it reads inside a JSON string,
        docs/semantics/pipeline.md §5.1). One output per record, the common case, keeps
        the event ids' buffer as it is, with no step per record."""
        at = np.asarray(source, np.intp)
        n = len(self)
        if len(at) == n and (not n or (at[0] == 0 and bool((np.diff(at) == 1).all()))):
            ints = np.zeros((_ROWS, n), np.int64)
            ints[EVENT_END] = self.ints[EVENT_END]
            ints[DATA_END] = _ends(data)
            ints[ORIGIN_GEN] = self.ints[GENERATION]
            ints[ORIGIN_SEQ] = self.ints[SEQ]
            ints[BORN_MS] = self.ints[BORN_MS]
            return InFlight(self.events, b"".join(data), ints)
        inputs = self.event_jsons()
        events: list[bytes] = []
        last, k = -1, 0
        for i in source:
            k = k + 1 if i == last else 0
            last = i
            event = inputs[i]
            events.append(event if k == 0 else b'%s/%s:%d"' % (event[:-1], stage, k))
        return InFlight.build(events, data, **self.origins_of(source))

    def passed(self, at: npt.NDArray[np.intp] | None = None) -> InFlight:
        """The records at indices ``at`` (increasing; None: all) each as the one output
        of itself, as :meth:`outputs` would make them of their values unchanged: the
        buffers kept (sliced for a selection), each record's position its origin."""
        kept = self
        if at is not None and len(at) < len(self):
            mask = np.zeros(len(self), np.bool_)
            mask[at] = True
            kept = self.keep(mask)
        ints = np.zeros((_ROWS, len(kept)), np.int64)
        ints[EVENT_END] = kept.ints[EVENT_END]
        ints[DATA_END] = kept.ints[DATA_END]
        ints[ORIGIN_GEN] = kept.ints[GENERATION]
        ints[ORIGIN_SEQ] = kept.ints[SEQ]
        ints[BORN_MS] = kept.ints[BORN_MS]
        return InFlight(kept.events, kept.data, ints)

    def event(self, i: int) -> str:
        return str(msgspec.json.decode(self.event_json(i)))

    def value(self, i: int) -> bytes:
        lo, hi = self._span(DATA_END, i)
        return self.data[lo:hi]

    def origin(self, i: int) -> Position:
        return Position(int(self.ints[ORIGIN_GEN, i]), int(self.ints[ORIGIN_SEQ, i]))

    def born(self, i: int) -> int:
        return int(self.ints[BORN_MS, i])

    def position(self, i: int) -> Position | None:
        """Where record ``i`` was last written on the edge; None before it is."""
        generation = int(self.ints[GENERATION, i])
        return Position(generation, int(self.ints[SEQ, i])) if generation else None

    def event_ids(self) -> list[str]:
        return [self.event(i) for i in range(len(self))]

    def records(self) -> Iterator[tuple[bytes, bytes, int, int, int]]:
        """Each record as ``(event id JSON, data JSON, generation, seq, born_ms)``, for
        a stage's function to see one event at a time."""
        columns = self.ints[[GENERATION, SEQ, BORN_MS]].tolist()
        yield from zip(_cut(self.events, self.ints[EVENT_END]),
                       _cut(self.data, self.ints[DATA_END]), *columns, strict=True)  # fmt: skip

    def latencies_ms(self, now_ms: int) -> list[int]:
        """Each record's age at ``now_ms``."""
        return (now_ms - self.ints[BORN_MS]).tolist()

    def written(self, start: int = 0, end: int | None = None) -> int:
        """How many records (from ``start`` to ``end``) have a position on the edge."""
        return int(np.count_nonzero(self.ints[GENERATION, start:end]))

    def chunk_end(
        self, start: int, max_records: int = WRITE_RECORDS, max_bytes: int = WRITE_BYTES
    ) -> int:
        """Where one write from record ``start`` ends: at most ``max_records`` records
        whose ids (twice) and data, with a fixed overhead each, stay within
        ``max_bytes``; always at least one record (docs/semantics/pipeline.md §3.7)."""
        end = min(len(self), start + max_records)
        if end <= start + 1:
            return end
        e0 = int(self.ints[EVENT_END, start - 1]) if start else 0
        d0 = int(self.ints[DATA_END, start - 1]) if start else 0
        sizes = (2 * (self.ints[EVENT_END, start:end] - e0) + (self.ints[DATA_END, start:end] - d0)
                 + RECORD_OVERHEAD * np.arange(1, end - start + 1))  # fmt: skip
        return start + max(1, int(np.searchsorted(sizes, max_bytes, side="right")))

    def chunks(self) -> Iterator[InFlight]:
        """The records cut into pieces that each fit one write."""
        start = 0
        while start < len(self):
            end = self.chunk_end(start)
            yield self.between(start, end)
            start = end

    def placed(self, generation: int) -> int:
        """How many leading records are written under ``generation``: a producer writes
        in order from the first record that is not, so these form a prefix."""
        if not len(self):
            return 0
        elsewhere = self.ints[GENERATION] != generation
        first = int(elsewhere.argmax())  # the first True, or 0 when there is none
        return first if elsewhere[first] else len(self)

    def oldest_origin(self) -> Position | None:
        """The least origin (generation first, then seq); None when empty."""
        if not self:
            return None
        gens = self.ints[ORIGIN_GEN]
        oldest = int(gens.min())
        return Position(oldest, int(self.ints[ORIGIN_SEQ][gens == oldest].min()))

    # --- changing -------------------------------------------------------------------
    def __add__(self, other: InFlight) -> InFlight:
        if not self:
            return other
        if not other:
            return self
        tail = other.ints.copy()
        tail[EVENT_END] += len(self.events)
        tail[DATA_END] += len(self.data)
        return InFlight(self.events + other.events, self.data + other.data,
                        np.concatenate([self.ints, tail], axis=1))  # fmt: skip

    def after(self, start: int) -> InFlight:
        """Records ``start`` onwards."""
        if start <= 0:
            return self
        if start >= len(self):
            return InFlight.empty()
        e0, d0 = int(self.ints[EVENT_END, start - 1]), int(self.ints[DATA_END, start - 1])
        ints = self.ints[:, start:].copy()
        ints[EVENT_END] -= e0
        ints[DATA_END] -= d0
        return InFlight(self.events[e0:], self.data[d0:], ints)

    def before(self, end: int) -> InFlight:
        """Records before ``end``."""
        if end >= len(self):
            return self
        if end <= 0:
            return InFlight.empty()
        e, d = int(self.ints[EVENT_END, end - 1]), int(self.ints[DATA_END, end - 1])
        return InFlight(self.events[:e], self.data[:d], self.ints[:, :end].copy())

    def between(self, start: int, end: int) -> InFlight:
        """Records ``start`` to ``end`` (not included)."""
        return self.before(end).after(start)

    def branch(self, suffix: bytes) -> InFlight:
        """A copy whose event ids each end with ``suffix`` (JSON string content): what
        a stage writing several edges pushes to its second and later ones
        (docs/semantics/pipeline.md §5.1)."""
        events = [e[:-1] + suffix + b'"' for e in _cut(self.events, self.ints[EVENT_END])]
        ints = self.ints.copy()
        ints[EVENT_END] = _ends(events)
        return InFlight(b"".join(events), self.data, ints)

    def copy(self) -> InFlight:
        """A copy whose positions :meth:`place` sets apart from this one's."""
        return InFlight(self.events, self.data, self.ints.copy())

    def keep(self, mask: npt.NDArray[np.bool_]) -> InFlight:
        """The records where ``mask`` is true, in order."""
        if mask.all():
            return self
        dropped = np.flatnonzero(~mask)
        if dropped[-1] == len(dropped) - 1:  # a prefix: one slice
            return self.after(len(dropped))
        return InFlight(self._bytes(self.events, EVENT_END, mask),
                        self._bytes(self.data, DATA_END, mask),
                        self._rebased(mask))  # fmt: skip

    def _bytes(self, buffer: bytes, row: int, mask: npt.NDArray[np.bool_]) -> bytes:
        lengths = np.diff(self.ints[row], prepend=0)
        keep = np.repeat(mask, lengths)
        return np.frombuffer(buffer, np.uint8)[keep].tobytes()

    def _rebased(self, mask: npt.NDArray[np.bool_]) -> Ints:
        ints = self.ints[:, mask].copy()
        for row in (EVENT_END, DATA_END):
            ints[row] = np.cumsum(np.diff(self.ints[row], prepend=0)[mask])
        return ints

    def acknowledged(self, acked: Position) -> InFlight:
        """Without the records written at or before ``acked`` in its generation: what
        the consumer's checkpoint at ``acked`` lets a producer forget
        (docs/semantics/pipeline.md §3.4)."""
        gens, seqs = self.ints[GENERATION], self.ints[SEQ]
        return self.keep(~((gens == acked.generation) & (seqs <= acked.seq)))

    # --- packs (docs/semantics/pipeline.md §3.1) ---------------------------------------
    def packed(self, max_items: int = PACK_ITEMS, max_bytes: int = PACK_BYTES) -> InFlight:
        """These records cut into packs, as a producer holds them: at most ``max_items``
        each, whose ids, data and a fixed overhead per item stay within ``max_bytes``;
        always at least one item (a larger one is a pack of its own)."""
        n = len(self)
        ints = self.ints.copy()
        ints[PACK] = 0
        if not n:
            return InFlight(self.events, self.data, ints)
        sizes = (self.ints[EVENT_END] + self.ints[DATA_END]
                 + ITEM_OVERHEAD * np.arange(1, n + 1, dtype=np.int64))  # fmt: skip
        if n <= max_items and int(sizes[-1]) <= max_bytes:  # the usual push: one pack
            ints[PACK, 0] = 1
            return InFlight(self.events, self.data, ints)
        firsts, start = [], 0
        while start < n:
            firsts.append(start)
            base = int(sizes[start - 1]) if start else 0
            window = sizes[start : min(n, start + max_items)] - base
            start += max(1, int(np.searchsorted(window, max_bytes, side="right")))
        ints[PACK, firsts] = 1
        return InFlight(self.events, self.data, ints)

    def _firsts(self, start: int, end: int) -> Ints:
        """The first items of the packs from item ``start`` (a pack's first) to ``end``."""
        firsts = np.flatnonzero(self.ints[PACK, start:end]) + start
        if start < end and (not len(firsts) or firsts[0] != start):
            raise ValueError(f"item {start} does not start a pack")
        return firsts

    def packs(self, start: int = 0, end: int | None = None) -> int:
        """How many packs items ``start`` to ``end`` hold."""
        return int(np.count_nonzero(self.ints[PACK, start:end]))

    def write_end(
        self, start: int, max_packs: int = WRITE_RECORDS, max_bytes: int = WRITE_BYTES
    ) -> int:
        """Where one write of whole packs from item ``start`` ends: at most ``max_packs``
        packs whose items' ids (twice: one is a pack's record id) and data, with a
        fixed overhead per item and per pack, stay within ``max_bytes``; always at
        least one pack (docs/semantics/pipeline.md §3.7)."""
        n = len(self)
        if start >= n:
            return n
        firsts = self._firsts(start, n)
        ends = np.append(firsts[1:], n)[:max_packs]
        e0 = int(self.ints[EVENT_END, start - 1]) if start else 0
        d0 = int(self.ints[DATA_END, start - 1]) if start else 0
        last = ends - 1
        sizes = (2 * (self.ints[EVENT_END, last] - e0) + (self.ints[DATA_END, last] - d0)
                 + ITEM_OVERHEAD * (ends - start)
                 + RECORD_OVERHEAD * np.arange(1, len(ends) + 1))  # fmt: skip
        fit = max(1, int(np.searchsorted(sizes, max_bytes, side="right")))
        return int(ends[fit - 1])

    def write_size(self, start: int, end: int) -> int:
        """The size :meth:`write_end` counts for the packs of items ``start`` to ``end``."""
        if start >= end:
            return 0
        e0 = int(self.ints[EVENT_END, start - 1]) if start else 0
        d0 = int(self.ints[DATA_END, start - 1]) if start else 0
        ids = int(self.ints[EVENT_END, end - 1]) - e0
        data = int(self.ints[DATA_END, end - 1]) - d0
        items, packs = end - start, self.packs(start, end)
        return 2 * ids + data + ITEM_OVERHEAD * items + RECORD_OVERHEAD * packs

    def place(
        self, start: int, generation: int, seqs: Sequence[int], end: int | None = None
    ) -> None:
        """Record that the packs of items ``start`` to ``end`` (default: the last) were
        written as ``seqs`` of ``generation``, one seq per pack: each item takes its
        pack's position."""
        end = len(self) if end is None else end
        firsts = self._firsts(start, end)
        if len(seqs) != len(firsts):
            raise ValueError(f"{len(seqs)} seqs for {len(firsts)} packs")
        counts = np.diff(np.append(firsts, end))
        self.ints[GENERATION, start:end] = generation
        self.ints[SEQ, start:end] = np.repeat(np.asarray(seqs, np.int64), counts)

    # --- wire -----------------------------------------------------------------------
    def edge_packs(self, start: int, generation: int, end: int | None = None) -> bytes:
        """The packs of items ``start`` to ``end`` (default: the last) as RecordIn JSON
        objects joined by commas, for an append to the edge's topic under
        ``generation``: each pack's data holds its items' event ids, birth times and
        values (:class:`~waymark.protocol.EdgePack`), its meta the generation and the item
        count, and its
        record id is its first event id, its item count, the CRC-32 of its event ids
        and the generation: the same for a retried write of the pack in one generation,
        different in the next, and for a pack of other events that starts with the
        same one (docs/semantics/pipeline.md §3.1)."""
        end = len(self) if end is None else end
        if start >= end:
            return b""
        firsts = self._firsts(start, end).tolist()
        part = self.between(start, end)
        event_ends, data_ends = part.ints[EVENT_END], part.ints[DATA_END]
        born = part.ints[BORN_MS]
        # the meta: the generation and the item count (docs/semantics/pipeline.md §3.1)
        form = (b'{"data":{"events":[%%s],"born_ms":[%%s],"items":[%%s]},'
                b'"meta":{"%s":"%d","%s":"%%d"},"id":%%s+%%d.%%08x@%d"}'
                % (GEN.encode(), generation, EDGE_ITEMS.encode(), generation))  # fmt: skip
        bounds = [f - start for f in firsts]
        packs = []
        for lo, hi in zip(bounds, [*bounds[1:], end - start], strict=True):
            e0 = int(event_ends[lo - 1]) if lo else 0
            first = part.events[e0 : int(event_ends[lo])]
            # the ids back to back are the buffer's span: its CRC with no join
            ids = part.events[e0 : int(event_ends[hi - 1])]
            packs.append(form % (_joined(part.events, event_ends, lo, hi), _births(born[lo:hi]),
                                 _joined(part.data, data_ends, lo, hi), hi - lo, first[:-1],
                                 hi - lo, zlib.crc32(ids)))  # fmt: skip
        return b",".join(packs)

    def sink_records(self) -> bytes:
        """The records as RecordIn JSON objects joined by commas, each with its event
        id as the record id (docs/semantics/pipeline.md §5.2)."""
        events = _cut(self.events, self.ints[EVENT_END])
        data = _cut(self.data, self.ints[DATA_END])
        pairs = zip(data, events, strict=True)
        return b",".join([b'{"data":%s,"id":%s}' % pair for pair in pairs])


def _joined(buffer: bytes, ends: Ints, lo: int, hi: int) -> bytes:
    """Items ``lo`` to ``hi`` of ``buffer`` (ending at ``ends``) joined by commas, as a
    JSON list's inside: one copy by numpy, no Python object per item."""
    b0 = int(ends[lo - 1]) if lo else 0
    size = int(ends[hi - 1]) - b0
    n = hi - lo
    if n == 1:
        return buffer[b0 : b0 + size]
    commas = ends[lo : hi - 1] - b0 + np.arange(n - 1)  # where each lands, shifted
    out = np.empty(size + n - 1, np.uint8)
    keep = np.ones(len(out), np.bool_)
    keep[commas] = False
    out[keep] = np.frombuffer(buffer, np.uint8, count=size, offset=b0)
    out[commas] = ord(",")
    return out.tobytes()


def _births(born: Ints) -> bytes:
    """Birth times as a pack holds them, comma-separated: a step's items mostly share
    one (a source's batch, the outputs of one pack), written with no step per item."""
    first = int(born[0])
    if bool((born == first).all()):
        return ((b"%d," % first) * len(born))[:-1]
    return ",".join(map(str, born.tolist())).encode()


def _cut(buffer: bytes, ends: Ints) -> list[bytes]:
    """The records back to back in ``buffer``, ending at ``ends``, cut apart (the
    transient pieces of one request body)."""
    stops = ends.tolist()
    return [buffer[lo:hi] for lo, hi in zip([0, *stops], stops, strict=False)]  # one start more
