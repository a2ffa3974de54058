"""A read's Arrow page (docs/http-api.md, "Arrow pages"), built from the chunks'
byte buffers and index arrays with numpy and pyarrow: no Python object per record.

Each :class:`~waymark.log.results.Span` (the slots one chunk delivers) becomes one
record batch. ``seq`` is the slot's position, ``ts`` the chunk's timestamp array,
``node`` and ``tag`` the chunk's interned names taken by id. ``data`` is cut out of
each record's wire JSON ``{"$seq":..,"$ts":..[,"$node":..][,"$tag":..][,"meta":{..}],
"data":<data>},`` by the size array alone: it ends two bytes before the record's end
and, without meta, is ``size`` bytes long, right after a ``,"data":``. Where those 8
bytes are not ``,"data":``, the record has meta; only such a record is decoded, once,
for its meta map and to cut its data by its size: meta costs per record only where it
is filled.
"""

from __future__ import annotations

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..protocol import PageInfo

# Checked against pyarrow-stubs; two ignores stand for what the stubs cannot say on
# Python 3.11: an ndarray is a buffer for pa.py_buffer (numpy types __buffer__ from
# 3.12), and MapArray.from_arrays takes int32 offsets (the stubs say int64 only).
from ..protocol.arrow import PAGE_SCHEMA, encode_page
from .results import DiffResult, Span

_DATA_KEY = b',"data":'
_KEY_WORD = np.frombuffer(_DATA_KEY, np.uint64)[0]
_KEY_WINDOW = np.arange(-len(_DATA_KEY), 0)
_STRING = pa.string()
_TS = PAGE_SCHEMA.field("ts").type
_META = PAGE_SCHEMA.field("meta").type


class _Meta(msgspec.Struct):
    meta: dict[str, str]


_meta_of = msgspec.json.Decoder(_Meta).decode


def render(result: DiffResult) -> bytearray:
    """The Arrow IPC stream of a columnar read (``Engine.diff(..., columns=True)``)."""
    info = PageInfo(
        count=result.count,
        tombstone=result.tombstone,
        next_from_seq=result.next_from_seq,
        head_seq=result.head_seq,
        earliest_seq=result.earliest_seq,
        caught_up=result.caught_up,
        epoch=result.epoch,
        durability=result.durability,
    )
    return encode_page(info, [span_batch(span) for span in result.spans])


def span_batch(span: Span) -> pa.RecordBatch:
    """One chunk's delivered records as a record batch of the page schema."""
    size, ts, node, tag, ends = span.size, span.ts, span.node, span.tag, span.ends
    slots = np.arange(len(ends), dtype=np.int64)
    if span.keep is not None:
        size, slots, ts, node, tag, ends = (
            a[span.keep] for a in (size, slots, ts, node, tag, ends)
        )
    n = len(slots)
    stops = ends - 2  # each record ends with its closing brace and a comma
    data, with_meta = _data(span.buf, stops, size)
    meta = pa.nulls(n, _META)
    if len(with_meta):
        maps, datas = [], []
        for row in with_meta.tolist():
            begin = int(span.starts[slots[row]])
            found = _meta_of(span.buf[begin : int(ends[row]) - 1]).meta
            # Meta may hold a "data" key of its own: the size says where data starts.
            length = int(size[row]) - len(orjson.dumps(found))
            maps.append(found)
            datas.append(span.buf[int(stops[row]) - length : int(stops[row])])
        meta = _meta_column(n, with_meta, maps)
        mask = np.zeros(n, bool)
        mask[with_meta] = True
        data = pc.replace_with_mask(data, _bools(mask), _strings(datas, pa.binary()))
    return pa.RecordBatch.from_arrays(
        [
            _int64(slots + span.base_seq),
            pa.Array.from_buffers(_TS, n, [None, pa.py_buffer(np.ascontiguousarray(ts))]),  # type: ignore[arg-type]
            _names(span.node_names, node),
            _names(span.tag_names, tag),
            meta,
            data.view(_STRING),
        ],
        schema=PAGE_SCHEMA,
    )


def _data(buf: bytes, stops: np.ndarray, size: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Each record's ``data`` JSON, cut from ``buf`` by its size alone (one copy, no
    search), and the rows whose cut is wrong because they have meta.

    A record without meta ends ``,"data":<data>},`` and its size is its data's
    length, so its data is the ``size`` bytes before ``stop`` and the 8 bytes in front
    of them are ``,"data":``. A record with meta has ``,"meta":<meta>,"data":<data>}``
    and a size of data + meta bytes: its cut starts right after ``,"meta":``, in
    front of which are meta's first bytes, beginning with ``{``, never ``,"data":``.
    """
    n = len(stops)
    if n == 0:
        return _strings([], pa.binary()), np.zeros(0, np.int64)
    starts = stops - size
    raw = np.frombuffer(buf, np.uint8)
    before = raw[starts[:, None] + _KEY_WINDOW].view(np.uint64).ravel()
    with_meta = np.flatnonzero(before != _KEY_WORD)
    # Records and the bytes between their data as one binary array: [data 0, between,
    # data 1, ...]; taking every other element copies just the data, contiguously.
    bounds = np.empty(2 * n, np.int32)
    bounds[0::2] = starts
    bounds[1::2] = stops
    pieces = pa.Array.from_buffers(
        pa.binary(),
        2 * n - 1,
        [None, pa.py_buffer(bounds), pa.py_buffer(buf)],  # type: ignore[arg-type]
    )
    evens = np.arange(0, 2 * n, 2, dtype=np.int32)
    return pieces.take(_int32(evens)), with_meta


def _int32(values: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])  # type: ignore[arg-type]


def _int64(values: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])  # type: ignore[arg-type]


# Arrays are built from buffers, never with pa.array(): its first call imports pandas
# (seconds on a busy machine, in the server's first Arrow answer).


def _strings(texts: list[str] | list[bytes], kind: pa.DataType = _STRING) -> pa.Array:
    """A string (or binary) array of ``texts`` from one buffer and its offsets."""
    encoded = [t.encode() if isinstance(t, str) else t for t in texts]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.Array.from_buffers(
        kind,
        len(encoded),
        [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],  # type: ignore[arg-type]
    )


def _bools(values: np.ndarray) -> pa.Array:
    bits = np.packbits(values, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])  # type: ignore[arg-type]


def _names(names: list[str], ids: np.ndarray) -> pa.Array:
    """The interned ``names`` taken by ``ids`` (0, no name, is null)."""
    n = len(ids)
    if len(names) == 1 or not ids.any():
        return pa.nulls(n, _STRING)
    table = _strings(names[: int(ids.max()) + 1])
    valid = np.packbits(ids != 0, bitorder="little")
    indices = pa.Array.from_buffers(
        pa.uint32(),
        n,
        [pa.py_buffer(valid), pa.py_buffer(np.ascontiguousarray(ids))],  # type: ignore[arg-type]
    )
    return table.take(indices)


def _meta_column(n: int, rows: np.ndarray, maps: list[dict[str, str]]) -> pa.Array:
    """A map column, null but at ``rows``, which hold ``maps``."""
    counts = np.zeros(n, np.int32)
    counts[rows] = [len(m) for m in maps]
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    keys = _strings([k for m in maps for k in m])
    values = _strings([v for m in maps for v in m.values()])
    valid = np.zeros(n, bool)
    valid[rows] = True
    return pa.MapArray.from_arrays(  # type: ignore[call-overload]
        pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(offsets)]),  # type: ignore[arg-type]
        keys,
        values,
        type=_META,
        mask=_bools(~valid),
    )
