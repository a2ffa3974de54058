"""Records on the way in: validation against the limits of docs/semantics/topics.md §1.2
(the contract's), and the wire encoding.

A committed record is kept only as its encoded wire JSON (followed by a comma,
so a run of consecutive records is one contiguous slice of a chunk buffer);
see :mod:`waymark.log.chunk`.

``data`` is stored in its canonical form (docs/semantics/topics.md §1.2): no insignificant
whitespace, strings with only the escapes JSON requires, numbers and object keys
byte for byte as sent. The 1 MiB limit, ``bytes`` and ``cap_bytes`` count exactly
those stored bytes, so neither a body's layout nor its escapes count against them.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterator, Sequence
from functools import lru_cache
from itertools import pairwise, repeat
from operator import add, attrgetter
from typing import Any, overload

import msgspec
import numpy as np
import orjson

from ..protocol import TOPIC_NAME, ErrorCode, Limits, RecordIn
from .errors import TopicError


def check_topic_name(name: str) -> None:
    if not TOPIC_NAME.fullmatch(name):
        raise TopicError(
            ErrorCode.INVALID_TOPIC_NAME,
            "topic names are 1-255 characters of [A-Za-z0-9._:-], starting alphanumeric",
            {"topic": name},
        )


class EncodedRecord(msgspec.Struct, frozen=True, gc=False):
    """A validated record, ready to be stamped with seq and ts."""

    body: bytes  # the wire keys after $seq/$ts: ',"$node":..,"$tag":..,"meta":..,"data":..}'
    size: int  # data + meta canonical bytes: what cap_bytes and topic bytes count
    node: str | None
    tag: str | None
    id: str | None


_PLAIN_HEAD = b',"data":'
PLAIN_EXTRA = len(_PLAIN_HEAD) + 1  # a plain record's stored bytes besides its data


class PlainRecords(Sequence[EncodedRecord]):
    """Validated records that carry data alone (no node, tag, meta or id), held
    columnar: their bodies (``,"data":D}`` each) joined in one buffer, cut at ``bounds``
    (``n + 1`` offsets). What the exactly-once sink stages: its chunks are framed and laid
    out at publish and in the seal with no Python object per record (docs/spark.md,
    "Sink speed"). Indexing or iterating builds :class:`EncodedRecord` values, for the
    rare consumer that needs them one by one.

    A publish's batch is its staged chunks :meth:`concat`-ed, which joins nothing: its
    chunks and its journal frame are made from the chunks' own buffers (:meth:`column`,
    :meth:`parts`), and ``bodies`` joins them only when something asks for the batch as
    one buffer (a publish laid out on the event loop, a record taken one by one)."""

    __slots__ = ("_bodies", "bounds")

    def __init__(self, bodies: bytes | _Concat, bounds: np.ndarray) -> None:
        self._bodies = bodies
        self.bounds = bounds  # int64, into bodies; a slice shares both

    @classmethod
    def concat(cls, runs: Sequence[PlainRecords]) -> PlainRecords:
        """The runs one after the other: their bounds shifted, their bodies left where
        they are until :attr:`bodies` is asked for."""
        if len(runs) == 1:
            return runs[0]
        lengths = np.concatenate([np.diff(run.bounds) for run in runs])
        bounds = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=bounds[1:])
        return cls(_Concat(list(runs)), bounds)

    @property
    def bodies(self) -> bytes:
        """The buffer ``bounds`` cut (a concat's runs joined, once, on first use)."""
        bodies = self._bodies
        return bodies.joined() if isinstance(bodies, _Concat) else bodies

    def _whole_concat(self) -> _Concat | None:
        """The runs, when these records are a concat not joined yet, all of it."""
        bodies = self._bodies
        if not isinstance(bodies, _Concat) or bodies.done is not None:
            return None
        return bodies if self.bounds[0] == 0 and len(self) == bodies.count else None

    def column(self) -> Any:
        """The bodies as a pyarrow ``large_binary`` array (chunked, for a concat) over
        the buffers that hold them: no copy, no step per record."""
        import pyarrow as pa  # (as the chunk layout does: the engine's import stays light)

        runs = self._whole_concat()
        if runs is None:
            return binary_column(self.bodies, self.bounds)
        return pa.chunked_array([run.column() for run in runs.runs], pa.large_binary())

    def parts(self) -> list[bytes]:
        """The bodies joined, as consecutive buffers (a concat's runs, unjoined)."""
        runs = self._whole_concat()
        if runs is None:
            return [self.joined()]
        return [part for run in runs.runs for part in run.parts()]

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @overload
    def __getitem__(self, i: int) -> EncodedRecord: ...
    @overload
    def __getitem__(self, i: slice) -> PlainRecords: ...
    def __getitem__(self, i: int | slice) -> EncodedRecord | PlainRecords:
        n = len(self)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step != 1:
                raise ValueError("plain records are sliced contiguously")
            return PlainRecords(self.bodies, self.bounds[start : max(start, stop) + 1])
        at = operator.index(i)
        at += n if at < 0 else 0
        if not 0 <= at < n:
            raise IndexError(i)
        lo, hi = int(self.bounds[at]), int(self.bounds[at + 1])
        return EncodedRecord(self.bodies[lo:hi], hi - lo - PLAIN_EXTRA, None, None, None)

    def __iter__(self) -> Iterator[EncodedRecord]:
        bodies = self.bodies
        for lo, hi in pairwise(self.bounds.tolist()):
            yield EncodedRecord(bodies[lo:hi], hi - lo - PLAIN_EXTRA, None, None, None)

    def __eq__(self, other: object) -> bool:
        """The same records: the same bytes, cut the same way (a publish's layout is
        adopted only for the records it was built from, :mod:`waymark.log.prebuilt`)."""
        if not isinstance(other, PlainRecords):
            return NotImplemented
        return self is other or (
            self.joined() == other.joined()
            and np.array_equal(self.bounds - self.bounds[0], other.bounds - other.bounds[0])
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking: compared by content

    def joined(self) -> bytes:
        """The bodies of these records, joined (the buffer itself when not a slice)."""
        lo, hi = int(self.bounds[0]), int(self.bounds[-1])
        return self.bodies if lo == 0 and hi == len(self.bodies) else self.bodies[lo:hi]

    def lengths(self) -> np.ndarray:
        """Each record's body length."""
        return np.diff(self.bounds)

    def sizes(self) -> np.ndarray:
        """Each record's size (its data bytes: what caps and topic bytes count)."""
        return self.lengths() - PLAIN_EXTRA

    def data_bytes(self) -> int:
        return int(self.bounds[-1] - self.bounds[0]) - PLAIN_EXTRA * len(self)


class _Concat:
    """Runs of :class:`PlainRecords` one after the other, joined on first need: shared
    by a concat and its slices, so the batch is joined once at most."""

    __slots__ = ("count", "done", "runs")

    def __init__(self, runs: list[PlainRecords]) -> None:
        self.runs = runs
        self.count = sum(map(len, runs))
        self.done: bytes | None = None

    def joined(self) -> bytes:
        if self.done is None:
            self.done = b"".join(part for run in self.runs for part in run.parts())
        return self.done


# Arrays are built from buffers, never with pa.array() or pa.scalar(): their first call
# imports pandas, seconds in a busy server (as waymark.log.pages builds its pages).
def binary_column(data: bytes | bytearray, bounds: np.ndarray) -> Any:
    """A pyarrow ``large_binary`` array of ``data`` cut at ``bounds`` (``n + 1`` int64
    offsets), over ``data``'s own buffer."""
    import pyarrow as pa

    buffers = [None, pa.py_buffer(bounds.astype(np.int64).tobytes()), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.large_binary(), len(bounds) - 1, buffers)


@lru_cache(maxsize=16)
def constant_column(value: bytes, n: int) -> Any:
    """``n`` times ``value``, a ``large_binary`` array (an element-wise join's constant).
    Kept: a publish's chunks all take the same few (arrays are immutable)."""
    return binary_column(value * n, np.arange(n + 1, dtype=np.int64) * len(value))


Records = list[EncodedRecord] | PlainRecords
"""An append's validated records: one object each, or columnar."""


def plain_records(array: bytes, datas: list[msgspec.Raw], limits: Limits) -> PlainRecords | None:
    """A write whose records carry data alone as :class:`PlainRecords`, when scans over
    all its bytes at once prove every record readable, canonical and within the limits
    (what :func:`encode_batch` proves of each). ``array``: the records, a JSON array as
    sent, whose elements were decoded as objects with the one key ``data``; ``datas``:
    their data. None otherwise: :func:`encode_batch` then decides, and refuses what it
    must with its error naming the record."""
    n = len(datas)
    if not n or len(array) > PLAIN_MAX_BYTES:
        return None
    lengths = np.fromiter(map(len, datas), np.int64, n)
    if not (_bare(array, lengths) and _proven(array, lengths, limits)):
        return None
    bounds = _bounds(lengths)
    return PlainRecords(_cut(array, bounds), bounds)


def data_records(array: bytes, lengths: np.ndarray, limits: Limits) -> PlainRecords | None:
    """A stage of records that carry data alone, sent as the array of their data values
    ``[D0,D1,...]`` (``lengths``: each value's length, as parsed), as
    :class:`PlainRecords` when the scans of :func:`plain_records` prove every value
    readable, canonical and within the limits; None otherwise (:func:`encode_batch` then
    decides). (With no whitespace, nothing stands between two values but their comma.)"""
    if not len(lengths) or len(array) > PLAIN_MAX_BYTES or not _proven(array, lengths, limits):
        return None
    return PlainRecords(_bodies_of_values(array, lengths), _bounds(lengths))


def _proven(array: bytes, lengths: np.ndarray, limits: Limits) -> bool:
    """What the scans over all of a write's bytes prove of every record: canonical,
    readable, within the record size limit."""
    return (_canonical(array) and _readable(array, lengths)
            and int(lengths.max()) <= limits.max_record_bytes)  # fmt: skip


def _bounds(lengths: np.ndarray) -> np.ndarray:
    """The stored bodies' bounds for data of these lengths (``n + 1``, from 0)."""
    bounds = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths + PLAIN_EXTRA, out=bounds[1:])
    return bounds


def _bodies_of_values(array: bytes, lengths: np.ndarray) -> bytes:
    """The stored bodies ``,"data":D}`` of an array of values ``[D0,D1,...]`` that holds
    no byte besides them, their commas and its brackets: each value's byte before it
    (``[`` or ``,``) becomes ``,"data":`` and it gains a ``}``. Two pyarrow kernels over
    the values, no step per record (constants as arrays: a scalar argument imports
    pandas on first use)."""
    import pyarrow.compute as pc  # (as the chunk layout: the engine's import stays light)

    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths + 1, out=starts[1:])  # value i, with the byte before it
    sent = binary_column(array, starts)
    headed = pc.binary_replace_slice(sent, start=0, stop=1, replacement=_PLAIN_HEAD)
    n = len(lengths)
    bodies = pc.binary_join_element_wise(  # type: ignore[call-overload]
        headed, constant_column(b"}", n), constant_column(b"", n)
    )
    data = bodies.buffers()[2]
    assert data is not None  # (a binary array's, of at least one record)
    return data.slice(0, int(starts[-1]) + (PLAIN_EXTRA - 1) * n).to_pybytes()


def _bare(array: bytes, lengths: np.ndarray) -> bool:
    """Whether ``array`` is as short as ``[{"data":D},...]`` with these data can be: no
    byte besides the data, the keys and the punctuation (no whitespace between tokens,
    no escaped key, no key given twice)."""
    return len(array) == int(lengths.sum()) + (PLAIN_EXTRA + 1) * len(lengths) + 1


def _canonical(array: bytes) -> bool:
    """No whitespace and no escape anywhere: the data is canonical as sent (a space in
    a string is canonical too, but telling it apart is encode_batch's job)."""
    find = array.find
    return not (find(b" ") >= 0 or find(b"\\") >= 0 or find(b"\n") >= 0 or find(b"\r") >= 0
                or find(b"\t") >= 0)  # fmt: skip


def _readable(array: bytes, lengths: np.ndarray) -> bool:
    """What :func:`_may_be_poison` proves, over text known to hold no escape: UTF-8, and
    no number that may be infinite as a double (an exponent, or 309 integer digits —
    which a value shorter than that cannot hold)."""
    if not array.isascii():
        try:
            array.decode()
        except UnicodeDecodeError:
            return False
    return int(lengths.max()) < len(_INFINITE_DIGITS) and not _has_exponent(array)


def _cut(array: bytes, bounds: np.ndarray) -> bytes:
    """The stored bodies ``,"data":D}`` of a bare array ``[{"data":D},{"data":D},...]``
    (see :func:`_bare`): the array with its ``[`` a comma, each record's ``{`` dropped
    and its closing ``]`` too. Cut
    where ``bounds`` puts each record, never where its bytes look like a record's start
    (data may hold ``},{"data":`` itself): a bare array has exactly one layout for its
    data's lengths. One pyarrow kernel over the records, where a search-and-replace of
    the separator cost twice the CPU (docs/spark.md, "Sink speed")."""
    import pyarrow as pa  # (as the chunk layout: the engine's import stays light)
    import pyarrow.compute as pc

    # Record i as sent, with the byte before it ("[" or ","): it starts bounds[i] + i
    # into the array, its body one byte shorter than it. (Built from buffers, as
    # waymark.log.chunk's columns are: pa.array() imports pandas.)
    starts = bounds + np.arange(len(bounds), dtype=np.int64)
    buffers = [None, pa.py_buffer(starts.tobytes()), pa.py_buffer(array)]
    sent = pa.Array.from_buffers(pa.large_binary(), len(bounds) - 1, buffers)
    cut = pc.binary_replace_slice(sent, start=0, stop=2, replacement=b",")
    data = cut.buffers()[2]
    assert data is not None  # (a binary array's, of at least one record)
    return data.slice(0, int(bounds[-1])).to_pybytes()


def _has_exponent(text: bytes) -> bool:
    """Whether a number in ``text`` (JSON values holding no backslash) may have an
    exponent: a digit followed by an exponent letter outside every string. Two masks
    over the text, and-ed in place (a find of two bytes steps a byte at a time;
    gathering the bytes before each ``e`` cost half as much again: text has many).
    ``b | 0x20 == ord("e")`` holds for ``e`` and ``E`` alone. A pair inside a string (a
    hex id's ``"1e5f"``) is no exponent: with no backslash each quote opens or closes a
    string, so a pair with an odd number of quotes before it is inside one (without
    this, such ids cost every write holding them a full parse)."""
    codes = np.frombuffer(text, np.uint8)
    exponent = (codes[1:] | 0x20) == ord("e")
    exponent &= (codes[:-1] - ord("0")) < 10  # (uint8: below "0" wraps high)
    if not exponent.any():
        return False
    quotes = np.flatnonzero(codes == ord('"'))
    if len(quotes) & 1:  # not JSON values: whatever it holds is told by the parse
        return True
    before = np.searchsorted(quotes, np.flatnonzero(exponent))  # the quotes before each
    return not (before & 1).all()


# Each check of plain_records is one C call over the write holding the GIL: a larger
# write takes encode_batch's path, which checks a slice at a time (SLICE_BYTES).
PLAIN_MAX_BYTES = 4 << 20

# A write whose data is larger than this is checked a slice of records at a time: each
# check is one C call over the bytes it is given, and holds the GIL throughout, so a
# 50 MB write checked whole held every other thread (the event loop's too, while the
# server validates it on a worker) for a fifth of a second (docs/security.md, Limits).
SLICE_BYTES = 1 << 20


def encode_batch(
    records: Sequence[RecordIn], limits: Limits, *, first_index: int = 0
) -> list[EncodedRecord]:
    """Validate every record against ``limits`` and encode its wire body once.
    ``first_index``: the index of ``records[0]`` in the write (an error names the record).

    This is the hottest loop of a write, so the common shapes take short paths.
    """
    dumps = orjson.dumps
    max_record = limits.max_record_bytes
    out: list[EncodedRecord] = []
    append = out.append
    changed: list[msgspec.Raw] | None = None
    # Measured before joining: the join copies Raw values, not bytes, so it holds the
    # GIL throughout (a 50 MB write's join held the event loop ~0.15 s).
    datas: Sequence[bytes | msgspec.Raw] = list(map(_data_of, records))
    if len(datas) > 1 and sum(map(len, datas)) > SLICE_BYTES:
        return _encode_in_slices(records, limits, first_index)
    joined = b"".join(datas)
    array: bytes | None = None  # the write as one JSON array, built once if a check needs it
    if _may_be_poison(joined):
        array = _array(records)
        _check_readable(records, array, first_index)
    # Data with no whitespace and no backslash is canonical already: the common case is
    # proven with the cheapest scan for its size and parses nothing. Small writes also
    # tell spaces in strings from spaces between tokens by the quotes around them.
    # (Not `in`: a bytes `in` first tries its needle as an int, raising and clearing a
    # TypeError.)
    if len(joined) <= _SMALL:
        if len(joined.translate(None, _WHITESPACE_OR_ESCAPE)) != len(joined) and (
            _NOT_CANONICAL.match(joined.translate(None, _NOT_SPECIAL))
        ):
            changed = _canonical_batch(records, array or _array(records))
    else:
        find = joined.find
        if (find(b" ") >= 0 or find(b"\\") >= 0 or find(b"\n") >= 0 or find(b"\r") >= 0
                or find(b"\t") >= 0):  # fmt: skip
            changed = _canonical_batch(records, array or _array(records))
    if changed is not None:
        datas = changed
    fast = _encode_plain(records, datas, limits)
    if fast is not None:
        return fast
    for record, data in zip(records, datas, strict=True):
        node, tag, meta = record.node, record.tag, record.meta
        meta_json = _check_meta(meta, limits) if meta is not None else b""
        size = len(data) + len(meta_json)  # data measured and formatted without a copy
        if size > max_record:
            raise TopicError(
                ErrorCode.RECORD_TOO_LARGE,
                f"data+meta is {size} canonical bytes; at most {max_record} are allowed",
                {"bytes": size, "max_bytes": max_record},
            )
        head = b""
        if node is not None:
            _check_length(node, limits.max_node_bytes, ErrorCode.NODE_TOO_LONG, "node")
            head = b',"$node":' + dumps(node)
        if tag is not None:
            _check_length(tag, limits.max_tag_bytes, ErrorCode.TAG_TOO_LONG, "tag")
            head += b',"$tag":' + dumps(tag)
        if meta_json:
            head += b',"meta":' + meta_json
        append(EncodedRecord(b'%b,"data":%b}' % (head, data), size, node, tag, record.id))
    return out


def _encode_plain(
    records: Sequence[RecordIn], datas: Sequence[bytes | msgspec.Raw], limits: Limits
) -> list[EncodedRecord] | None:
    """The records of a write in which none has a node or meta (or each has meta and none
    a tag: :func:`_encode_with_meta`), and either all or none a tag, all within the
    limits: each step one C call over the whole write, where the
    general loop makes a dozen Python steps per record (a sink's publish holds a million
    records). None for any other write, which the general loop encodes and refuses."""
    n = len(records)
    if n < 2 or list(map(_node_of, records)).count(None) != n:
        return None
    metas = list(map(_meta_of, records))
    without_meta = metas.count(None)
    if not without_meta:
        return _encode_with_meta(records, datas, metas, limits)
    if without_meta != n:
        return None
    sizes = list(map(len, datas))
    if max(sizes) > limits.max_record_bytes:
        return None
    tags = list(map(_tag_of, records))
    untagged = tags.count(None)
    if untagged == n:
        bodies = list(map(b',"data":%b}'.__mod__, datas))
    elif untagged or max(map(len, tags)) * 4 > limits.max_tag_bytes:
        return None  # (a long tag may still fit: measured in bytes by the general loop)
    elif _PLAIN_TEXT.fullmatch("".join(tags)) is None:
        return None  # a tag JSON must escape (or cannot encode): orjson's, per record
    else:  # each tag's JSON is its UTF-8 in quotes
        pairs = zip(map(str.encode, tags), datas, strict=True)
        bodies = list(map(b',"$tag":"%b","data":%b}'.__mod__, pairs))
    return list(map(EncodedRecord, bodies, sizes, repeat(None), tags, map(_id_of, records)))


def _encode_with_meta(
    records: Sequence[RecordIn],
    datas: Sequence[bytes | msgspec.Raw],
    metas: list[dict[str, str]],
    limits: Limits,
) -> list[EncodedRecord] | None:
    """The records of a write in which every one has meta and none a node or tag (a
    pipeline edge's, docs/semantics/pipeline.md §3.1), all within the limits, the way
    :func:`_encode_plain` takes its own: half the general loop's time for 500 records
    with three meta keys. None for any other write."""
    if list(map(_tag_of, records)).count(None) != len(records):
        return None
    if max(map(len, metas)) > limits.max_meta_keys:
        return None
    metas_json = list(map(orjson.dumps, metas))
    if max(map(len, metas_json)) > limits.max_meta_bytes:
        return None
    sizes = list(map(add, map(len, datas), map(len, metas_json)))
    if max(sizes) > limits.max_record_bytes:
        return None
    bodies = list(map(b',"meta":%b,"data":%b}'.__mod__, zip(metas_json, datas, strict=True)))
    return list(map(EncodedRecord, bodies, sizes, repeat(None), repeat(None),
                    map(_id_of, records)))  # fmt: skip


def _encode_in_slices(
    records: Sequence[RecordIn], limits: Limits, first_index: int
) -> list[EncodedRecord]:
    out: list[EncodedRecord] = []
    start = size = 0
    for i, record in enumerate(records):
        n = len(record.data)
        if size + n > SLICE_BYTES and i > start:  # a larger record is a slice of its own
            out += encode_batch(records[start:i], limits, first_index=first_index + start)
            start, size = i, 0
        size += n
    out += encode_batch(records[start:], limits, first_index=first_index + start)
    return out


def _may_be_poison(joined: bytes) -> bool:
    """Whether the data of a write could hold what a reader cannot decode: invalid
    UTF-8, an escape (a lone surrogate ``\\ud800``), or a number that is infinite as a
    double (an exponent, or 309 integer digits). A cheap scan with no false
    negatives: most writes are proven clean without parsing them."""
    if not joined.isascii():
        try:
            joined.decode()
        except UnicodeDecodeError:
            return True
    if joined.find(b"\\") >= 0:
        return True
    numbers = joined.translate(_DIGITS_AND_EXPONENTS)
    if numbers.find(_INFINITE_DIGITS) >= 0:
        return True
    # A digit before an "e" is rarely an exponent: mostly a hex id in a string.
    return numbers.find(b"0e") >= 0 and _has_exponent(joined)


def _array(records: Sequence[RecordIn]) -> bytes:
    """The records' data as one JSON array: what one C parse checks or compacts."""
    return b"[" + b",".join(map(_data_of, records)) + b"]"


def _check_readable(records: Sequence[RecordIn], array: bytes, first_index: int) -> None:
    """Refuse a write whose data a reader could not decode: JSON text in UTF-8, no
    lone surrogates, numbers finite as doubles (docs/semantics/topics.md §1.2). One
    orjson parse of the whole write proves it, and only a refused write is parsed per
    record to name the one at fault. Stored data would otherwise fail every page that
    holds it, for every reader, for good."""
    try:
        orjson.loads(array)
        return
    except orjson.JSONDecodeError:
        pass
    for index, record in enumerate(records, first_index):
        try:
            orjson.loads(bytes(record.data))
        except orjson.JSONDecodeError as error:
            raise TopicError(
                ErrorCode.INVALID_RECORD,
                f"record {index}: data is not JSON a reader can decode ({error.msg}); "
                "data must be UTF-8 JSON with numbers finite as doubles",
                {"index": index, "reason": error.msg},
            ) from None
    raise TopicError(ErrorCode.INVALID_RECORD, "a record's data is not valid JSON")


def wire_body(data: bytes, node: str | None, tag: str | None, meta_json: bytes) -> bytes:
    """A record's wire body from parts already validated (a router's copy,
    docs/semantics/topics.md §8.3)."""
    head = b""
    if node is not None:
        head = b',"$node":' + orjson.dumps(node)
    if tag is not None:
        head += b',"$tag":' + orjson.dumps(tag)
    if meta_json:
        head += b',"meta":' + meta_json
    return b'%b,"data":%b}' % (head, data)


def _check_length(text: str, max_bytes: int, code: ErrorCode, what: str) -> None:
    # A UTF-8 character is at most 4 bytes: short strings need no encoding to check.
    if len(text) * 4 > max_bytes and len(text.encode()) > max_bytes:
        raise TopicError(code, f"{what} is longer than {max_bytes} bytes", {"max_bytes": max_bytes})


def _check_meta(meta: dict[str, str], limits: Limits) -> bytes:
    if len(meta) > limits.max_meta_keys:
        raise TopicError(
            ErrorCode.META_TOO_LARGE,
            f"meta has {len(meta)} keys; at most {limits.max_meta_keys} are allowed",
            {"keys": len(meta), "max_keys": limits.max_meta_keys},
        )
    meta_json = orjson.dumps(meta)
    if len(meta_json) > limits.max_meta_bytes:
        raise TopicError(
            ErrorCode.META_TOO_LARGE,
            f"meta is {len(meta_json)} bytes; at most {limits.max_meta_bytes} are allowed",
            {"bytes": len(meta_json), "max_bytes": limits.max_meta_bytes},
        )
    return meta_json


_data_of = attrgetter("data")
_node_of = attrgetter("node")
_tag_of = attrgetter("tag")
_meta_of = attrgetter("meta")
_id_of = attrgetter("id")
# Text whose JSON string is itself in quotes: nothing JSON escapes (a quote, a backslash,
# a control character) and no lone surrogate (which has no UTF-8).
_PLAIN_TEXT = re.compile(r'[^"\\\x00-\x1f\ud800-\udfff]*')
# Digits to "0", exponent letters to "e", the rest to spaces: "0e" is a digit before an
# exponent, 309 zeros an integer part of 309 digits (either may be infinite as a double).
_DIGITS_AND_EXPONENTS = bytes(
    ord("0") if chr(b).isdigit() and b < 128 else ord("e") if b in b"eE" else ord(" ")
    for b in range(256)
)
_INFINITE_DIGITS = b"0" * 309
# Data bytes of a write up to which one translate scans faster than five finds (whose
# argument parsing costs more than their memchr).
_SMALL = 512
_WHITESPACE_OR_ESCAPE = b" \n\r\t\\"
_NOT_SPECIAL = bytes(b for b in range(256) if b not in b'" \n\r\t\\')
# Over JSON text reduced to its quotes, whitespace and backslashes: strings holding only
# spaces (data) are passed over; whitespace outside a string, or an escape in one (after
# which a quote may be escaped, not closing), is not canonical.
_NOT_CANONICAL = re.compile(rb'(?:" *+")*+(?:[ \n\r\t\\]|" *+[\n\r\t\\])')

# A JSON string token (the text holds no insignificant whitespace any more).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_decode_string = msgspec.json.Decoder(str).decode
_split_array = msgspec.json.Decoder(list[msgspec.Raw]).decode


def _canonical_batch(records: Sequence[RecordIn], array: bytes) -> list[msgspec.Raw] | None:
    """The canonical forms of the records' data (see the module docstring), or None if
    they are canonical as sent (their spaces are all inside strings). Only whitespace
    and escapes change, never a value: a number keeps its exact digits, where a round
    trip through floats would round ``0.1000000000000000000001`` or ``2**64``."""
    # One JSON array for the whole batch: one C pass strips the whitespace (and says
    # whether there was any) and one splits it back into records, instead of Python
    # calls per record.
    try:
        compact = msgspec.json.format(array, indent=-1)
        escaped = compact.find(b"\\") >= 0
        if len(compact) == len(array) and not escaped:
            return None
        if escaped:
            compact = _STRING.sub(_minimal_escapes, compact)
        canonical = _split_array(compact)
    except msgspec.DecodeError:
        canonical = []
    if len(canonical) != len(records):  # only a Raw built by hand is not checked JSON
        raise TopicError(ErrorCode.INVALID_REQUEST, "a record's data is not valid JSON")
    return canonical


def _minimal_escapes(match: re.Match[bytes]) -> bytes:
    token = match.group()
    return msgspec.json.encode(_decode_string(token)) if token.find(b"\\") >= 0 else token
