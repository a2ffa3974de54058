"""Chunks: records held as encoded bytes in large buffers with array indexes.

A chunk stores a contiguous seq range. Each record is its wire JSON followed by a
comma, appended to one ``bytearray``; parallel typed arrays hold its end offset,
timestamp, interned node and tag ids, size, and a deleted flag. No Python object
exists per record, so millions of records cost the garbage collector nothing, and
a run of consecutive records reads out as one slice. Chunks are also the unit of
physical reclaim (the in-memory analogue of a segment, docs/semantics/topics.md §5.6).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import add, attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from .records import PLAIN_EXTRA, PlainRecords, binary_column, constant_column

if TYPE_CHECKING:
    from .records import EncodedRecord

CHUNK_RECORDS = 16_384
_GROUP = 256  # records laid out per step of a short multi-record extend
# From this many records on, an extend lays its bytes out with pyarrow (:func:`_lay_out`):
# its fixed cost is ~0.15 ms, the Python groups cost ~0.4 µs a record (about equal at
# 500 records, measured; the pyarrow path ~0.3 µs a record beyond).
ARROW_FROM = 512
CHUNK_BYTES = 8 << 20

LIVE = 0
DELETED = 1


class Names:
    """Strings interned to small ids, 0 meaning "none". Each chunk has its own tables,
    so a sealed segment carries everything needed to read it."""

    __slots__ = ("ids", "names")

    def __init__(self, names: list[str] | None = None) -> None:
        self.names = ["", *(names or [])]
        self.ids = {name: i for i, name in enumerate(self.names) if i}

    def intern(self, name: str | None) -> int:
        if name is None:
            return 0
        ident = self.ids.get(name)
        if ident is None:
            ident = self.ids[name] = len(self.names)
            self.names.append(name)
        return ident

    def lookup(self, names: frozenset[str]) -> frozenset[int]:
        return frozenset(self.ids[n] for n in names if n in self.ids)


class Chunk:
    __slots__ = (
        "base_seq", "buf", "dead", "ends", "live", "node", "node_names", "sealed", "size", "tag",
        "tag_names", "ts",
    )  # fmt: skip

    def __init__(self, base_seq: int) -> None:
        self.base_seq = base_seq
        self.buf = bytearray()
        self.ends = array("Q")  # end offset of record i in buf (its start is ends[i-1])
        self.ts = array("Q")
        self.node = array("I")  # id in node_names, 0 = no node
        self.tag = array("I")  # id in tag_names, 0 = no tag
        self.node_names = Names()
        self.tag_names = Names()
        self.sealed = False  # taken by a seal: no more appends
        self.size = array("I")  # data + meta bytes, what count/bytes/cap_bytes measure
        self.dead = bytearray()  # DELETED marks voluntary deletion
        self.live = 0  # slots neither deleted nor reclaimed from the front

    @property
    def n(self) -> int:
        return len(self.ends)

    @property
    def last_seq(self) -> int:
        return self.base_seq + len(self.ends) - 1

    def room(self) -> int:
        """How many more records this chunk takes (0 once it is sealed by size)."""
        if self.sealed or len(self.buf) >= CHUNK_BYTES:
            return 0
        return CHUNK_RECORDS - len(self.ends)

    def room_at(self, seq: int) -> int:
        """How many records from ``seq`` on this chunk takes: 0 once it is sealed or full,
        or when ``seq`` does not continue its contiguous range (after a hole)."""
        n = len(self.ends)
        if self.sealed or seq != self.base_seq + n or len(self.buf) >= CHUNK_BYTES:
            return 0
        return CHUNK_RECORDS - n

    def extend(
        self,
        first_seq: int,
        ts: int,
        records: Sequence[EncodedRecord] | PlainRecords,
        bodies: Any = None,
    ) -> None:
        """Append consecutive records: one buffer write and one extend per index array.
        ``bodies``: the records' bodies as a pyarrow ``large_binary`` array, when the
        caller holds them so (:func:`waymark.log.prebuilt.build`)."""
        if isinstance(records, PlainRecords):  # a sink's publish: no node, no tag
            column = records.column() if bodies is None else bodies
            self.extend_plain(first_seq, ts, records.sizes(), column)
            return
        # The commonest write, one record: skip the batch machinery's fixed cost.
        if len(records) == 1 and bodies is None:
            record = records[0]
            buf = self.buf
            buf += b'{"$seq":%d,"$ts":%d%b,' % (first_seq, ts, record.body)
            self.ends.append(len(buf))
            self.ts.append(ts)
            node, tag = record.node, record.tag
            self.node.append(0 if node is None else self.node_names.intern(node))
            self.tag.append(0 if tag is None else self.tag_names.intern(tag))
            self.size.append(record.size)
            self.dead.append(LIVE)
            self.live += 1
            return
        n = len(records)
        if bodies is None and n < ARROW_FROM:
            self._extend_groups(first_seq, ts, records)
        else:
            bounds, data = _lay_out(
                first_seq, ts, _column_of(records) if bodies is None else bodies
            )
            base = len(self.buf)
            self.buf += data
            self.ends.frombytes((bounds[1:] + base).astype(np.uint64).tobytes())
        self.ts.frombytes(np.full(n, ts, np.uint64).tobytes())
        nodes = list(map(_node_of, records))
        if nodes.count(None) == n:
            self.node.frombytes(bytes(self.node.itemsize * n))
        else:
            self.node.extend(map(self.node_names.intern, nodes))
        tags = list(map(_tag_of, records))
        if tags.count(None) == n:
            self.tag.frombytes(bytes(self.tag.itemsize * n))
        else:
            self._extend_tags(tags)
        self.size.extend(map(_size_of, records))
        self.dead.extend(bytes(n))
        self.live += n

    def extend_plain(self, first_seq: int, ts: int, sizes: np.ndarray, bodies: Any) -> None:
        """:meth:`extend` for records that carry data alone, each column in bulk:
        ``sizes``, each record's (:meth:`PlainRecords.sizes`), and ``bodies``, their
        bodies as a pyarrow ``large_binary`` array (a publish's staged chunks, as
        :func:`waymark.log.prebuilt.build` hands them, without their records)."""
        bounds, data = _lay_out(first_seq, ts, bodies)
        base = len(self.buf)
        self.buf += data
        self.ends.frombytes((bounds[1:] + base).astype(np.uint64).tobytes())
        self._extend_plain_columns(ts, sizes)

    def _extend_plain_columns(self, ts: int, sizes: np.ndarray) -> None:
        """The index columns besides ``ends`` of records that carry data alone: all at
        ``ts``, no node, no tag, live, ``sizes`` each."""
        n = len(sizes)
        self.ts.frombytes(np.full(n, ts, np.uint64).tobytes())
        self.node.frombytes(bytes(self.node.itemsize * n))
        self.tag.frombytes(bytes(self.tag.itemsize * n))
        self.size.frombytes(sizes.astype(f"u{self.size.itemsize}").tobytes())
        self.dead.extend(bytes(n))
        self.live += n

    def _extend_groups(self, first_seq: int, ts: int, records: Sequence[EncodedRecord]) -> None:
        """The bytes and end offsets of a run too short for :func:`_lay_out`'s fixed cost
        (~0.15 ms of pyarrow calls): a group of records at a time, each step one C call
        over the group."""
        buf, ends, n = self.buf, self.ends, len(records)
        mid = b',"$ts":%d' % ts
        fixed = len(_SEQ) + len(mid) + 1  # the bytes of a record besides its seq and body
        for lo in range(0, n, _GROUP):
            group = records[lo : lo + _GROUP] if n > _GROUP else records
            k = len(group)
            seqs = range(first_seq + lo, first_seq + lo + k)
            digits = "\n".join(map(str, seqs)).encode().split(b"\n")
            bodies = list(map(_body_of, group))
            parts = [_SEQ, b"", mid, b"", b","] * k  # one record: {"$seq":N,"$ts":T BODY,
            parts[1::5] = digits
            parts[3::5] = bodies
            sizes = map(add, map(add, map(len, digits), map(len, bodies)), repeat(fixed))
            ends.extend(accumulate(sizes, initial=len(buf)))
            del ends[-k - 1]  # the initial value: where the group starts
            buf += b"".join(parts)

    def _extend_tags(self, tags: list[Any]) -> None:  # (str or None each)
        ids = self.tag_names.ids
        for tag in dict.fromkeys(tags):  # new tags interned in the order they come
            if tag not in ids:
                self.tag_names.intern(tag)
        self.tag.extend(map(ids.get, tags, repeat(0)))  # (no tag: 0)

    def extend_deleted(self, seq: int, ts: int) -> None:
        """A slot born deleted: a seq that holds no record, silent to every reader like a
        deleted one (a deletion's own seq, docs/semantics/topics.md §7.1)."""
        self.buf += b'{"$seq":%d,"$ts":%d,"data":null},' % (seq, ts)
        self.ends.append(len(self.buf))
        self.ts.append(ts)
        self.node.append(0)
        self.tag.append(0)
        self.size.append(4)  # a record like any other, its data null, were it ever read
        self.dead.append(DELETED)

    def start(self, i: int) -> int:
        return self.ends[i - 1] if i else 0

    def slice(self, i: int, j: int) -> bytes:
        """Records [i, j) as comma-terminated wire JSON (a copy: buffers keep growing)."""
        return bytes(self.buf[self.start(i) : self.ends[j - 1]])

    def records(self, i: int, j: int) -> tuple[bytes, np.ndarray, np.ndarray]:
        """Bytes holding records [i, j) (each with its comma), and the start and the end
        of each in those bytes: here the records are contiguous, as :meth:`slice` has
        them."""
        start = self.start(i)
        ends = np.array(self.ends[i:j], np.int64) - start
        starts = np.zeros(len(ends), np.int64)
        starts[1:] = ends[:-1]
        return bytes(memoryview(self.buf)[start : self.ends[j - 1]]), starts, ends

    def release_payloads(self) -> None:
        """Free the bytes of a sealed chunk whose every slot is dead
        (docs/semantics/topics.md §7.1)."""
        self.buf = bytearray()

    def payload(self) -> Payload:
        """What a seal writes for this chunk, taken when it begins (its records' bytes,
        or how to lay them out): a delete may free the chunk's own meanwhile."""
        return self.buf


class LaidLater:
    """A full chunk's records laid out (:func:`_lay_out`) when first needed, once, on
    whichever thread asks first; then kept."""

    __slots__ = ("_bodies", "_first_seq", "_laid", "_lock", "_ts")

    def __init__(self, first_seq: int, ts: int, bodies: Any) -> None:
        self._first_seq, self._ts, self._bodies = first_seq, ts, bodies
        self._laid: memoryview | None = None
        self._lock = threading.Lock()

    def laid(self) -> memoryview:
        with self._lock:
            if self._laid is None:
                self._laid = _lay_out(self._first_seq, self._ts, self._bodies)[1]
                self._bodies = None
            return self._laid


Payload = bytearray | memoryview | LaidLater

_BUF: Any = Chunk.__dict__["buf"]  # the slot PendingChunk's property stands in front of
_POWERS = 10 ** np.arange(1, 19, dtype=np.int64)  # a seq's digit count: 1 + those <= it


class PendingChunk(Chunk):
    """A full chunk of a sink's publish whose bytes are laid out when first read: by a
    reader on the event loop (one chunk, a few ms) or by the seal on its worker thread.
    A publish adopts its chunks at once and answers without laying the batch out,
    which cost its commit ~60-80 ms on the critical path of every Spark micro-batch
    (docs/spark.md, "Sink speed"). Its index arrays are made at once: ``ends`` from the
    records' lengths and their seqs' digit counts, the very bounds the layout makes."""

    __slots__ = ("_later",)

    def __init__(self, first_seq: int, ts: int, sizes: np.ndarray, bodies: Any) -> None:
        super().__init__(first_seq)
        n = len(sizes)
        self._later: LaidLater | None = LaidLater(first_seq, ts, bodies)
        seqs = np.arange(first_seq, first_seq + n, dtype=np.int64)
        digits = 1 + np.searchsorted(_POWERS, seqs, side="right")
        fixed = len(_SEQ) + len(b',"$ts":%d' % ts) + PLAIN_EXTRA + 1  # (and the comma)
        ends = np.cumsum(sizes.astype(np.int64) + digits + fixed)
        self.ends.frombytes(ends.astype(np.uint64).tobytes())
        self._extend_plain_columns(ts, sizes)

    @property  # type: ignore[override]
    def buf(self) -> bytearray | memoryview:
        later = self._later
        if later is not None:
            _BUF.__set__(self, later.laid())
            self._later = None
        return _BUF.__get__(self)  # type: ignore[no-any-return]

    @buf.setter
    def buf(self, value: bytearray | memoryview) -> None:
        _BUF.__set__(self, value)

    def room(self) -> int:
        return 0  # full (and sizing it would lay it out)

    def room_at(self, seq: int) -> int:
        return 0

    def release_payloads(self) -> None:
        self._later = None
        super().release_payloads()

    def payload(self) -> Payload:
        later = self._later
        return self.buf if later is None else later


def lay_out_plain(first_seq: int, ts: int, sizes: np.ndarray, bodies: Any) -> Chunk:
    """A new chunk holding a publish's records from ``first_seq`` on (``sizes`` and
    ``bodies``, as :meth:`Chunk.extend_plain` takes them): laid out later when they fill
    it (:class:`PendingChunk`), else now."""
    if len(sizes) == CHUNK_RECORDS:
        return PendingChunk(first_seq, ts, sizes, bodies)
    chunk = Chunk(first_seq)
    chunk.extend_plain(first_seq, ts, sizes, bodies)
    return chunk


_SEQ = b'{"$seq":'


def _lay_out(first_seq: int, ts: int, bodies: Any) -> tuple[np.ndarray, memoryview]:
    """The bytes of the records from ``first_seq`` on whose bodies are ``bodies`` (a
    pyarrow ``large_binary`` array, or a chunked one: a publish's staged runs), each
    ``{"$seq":N,"$ts":T BODY,``, and their bounds (``n + 1`` offsets from 0): one pyarrow
    kernel call over the whole run (a sink's publish holds a million records) where a
    Python step per record cost ~0.6 µs; the element-wise join releases the GIL
    (docs/security.md, Limits)."""
    import pyarrow as pa  # here: the engine's import does not pay for pyarrow
    import pyarrow.compute as pc

    if isinstance(bodies, pa.ChunkedArray):  # (one chunk's window of the runs: joined)
        bodies = bodies.combine_chunks()
    n = len(bodies)
    digits = decimal_column(np.arange(first_seq, first_seq + n, dtype=np.int64))
    joined = pc.binary_join_element_wise(  # type: ignore[call-overload]
        constant_column(_SEQ, n), digits, constant_column(b',"$ts":%d' % ts, n), bodies,
        constant_column(b",", n), constant_column(b"", n),
    )  # fmt: skip
    _, offsets, data = joined.buffers()
    ends = np.frombuffer(offsets, np.int64, n + 1, joined.offset * 8)  # type: ignore[call-overload]
    return ends - ends[0], memoryview(data)[int(ends[0]) : int(ends[-1])]


def _column_of(records: Sequence[EncodedRecord]) -> Any:
    """The records' bodies as a pyarrow ``large_binary`` array (one join of them)."""
    texts = list(map(_body_of, records))
    bounds = np.zeros(len(texts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)), out=bounds[1:])
    return binary_column(b"".join(texts), bounds)


def decimal_column(values: np.ndarray) -> Any:
    """``values`` (ints) in decimal, a ``large_binary`` array: one pyarrow cast, built
    from buffers (``pa.array()`` and scalar arguments import pandas on first use)."""
    import pyarrow as pa  # (the engine's import does not pay for pyarrow)
    import pyarrow.compute as pc

    data = pa.py_buffer(values.astype(np.int64).tobytes())
    ints = pa.Array.from_buffers(pa.int64(), len(values), [None, data])
    return pc.cast(ints, pa.string()).cast(pa.large_binary())


_body_of = attrgetter("body")
_node_of = attrgetter("node")
_tag_of = attrgetter("tag")
_size_of = attrgetter("size")
