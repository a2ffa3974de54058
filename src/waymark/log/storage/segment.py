"""Segments: a sealed chunk on disk as a ``.data`` + ``.idx`` pair, read through mmap.

``.data`` (format 2) holds the chunk's records exactly as its buffer laid them out —
each one's wire JSON and a comma, one after the other — then one delete flag byte per
record::

    record 0 | record 1 | ... | record n-1 | flag 0 | flag 1 | ... | flag n-1

Deleting a sealed record flips its flag to exactly ``0xD5``; any other value reads
live, so a torn one-byte write can never resurrect or hide a record.

``.idx`` holds the chunk's per-record arrays (record offset and length, ts, size, node
and tag ids), its name tables and the XXH3 of the records' bytes, checksummed as a
whole. Both files are written under temporary names, fsynced and renamed; the catalog
names a segment only once it is complete, so a crash mid-seal leaves an orphan that
recovery removes.

Format 1 (read, never written): one frame per record, ``u32 frame_len | u64 seq | wire
JSON + "," | u64 xxh3(seq + JSON) | u8 delete flag``. Its framing cost a seal a pyarrow
join and a checksum call per record, ~40% of a seal's CPU (docs/durability.md,
"Segments and seals").
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash

from ...protocol.errors import WaymarkError
from ..chunk import DELETED, Chunk, LaidLater, Names, Payload
from .fileio import FileIO

DATA = ".data"
IDX = ".idx"
DELETED_FLAG = 0xD5
_IDX_MAGIC = b"WMIX"
_IDX_VERSION = 2  # what a seal writes
_READS = (1, 2)  # what recovery maps
_IDX_HEAD = struct.Struct("<4sIQI")
_LEN = struct.Struct("<I")
_SUM = struct.Struct("<Q")
_ARRAYS = (("offsets", np.uint64), ("lens", np.uint32), ("ts", np.uint64),
           ("size", np.uint32), ("node", np.uint32), ("tag", np.uint32))  # fmt: skip


class SegmentError(WaymarkError):
    """A segment file is damaged: recovery refuses to guess."""


def segment_paths(directory: Path, base_seq: int) -> tuple[Path, Path]:
    stem = directory / f"{base_seq:020d}"
    return stem.with_suffix(DATA), stem.with_suffix(IDX)


def write_segment(
    directory: Path, chunk: Chunk, dead: bytes, fileio: FileIO, buf: bytes | Payload
) -> None:
    """Write ``chunk`` (sealed, so immutable) as a segment; ``dead`` is its flag snapshot
    and ``buf`` its payload, both taken when the seal began (see :func:`segment_data`)."""
    data_path, idx_path = segment_paths(directory, chunk.base_seq)
    records, flags, offsets, lens = segment_data(chunk, dead, buf)
    tables = orjson.dumps({"nodes": chunk.node_names.names[1:], "tags": chunk.tag_names.names[1:]})
    head = _IDX_HEAD.pack(_IDX_MAGIC, _IDX_VERSION, chunk.base_seq, chunk.n)
    arrays = [offsets.tobytes(), lens.tobytes(), chunk.ts.tobytes(), chunk.size.tobytes(),
              chunk.node.tobytes(), chunk.tag.tobytes()]  # fmt: skip
    idx = b"".join([head, *arrays, _LEN.pack(len(tables)), tables,
                    _SUM.pack(xxhash.xxh3_64_intdigest(records))])  # fmt: skip
    idx += _SUM.pack(xxhash.xxh3_64_intdigest(idx))
    fileio.replace_file(data_path, [records, flags])
    fileio.replace_file(idx_path, idx)


def segment_data(
    chunk: Chunk, dead: bytes, buf: bytes | Payload
) -> tuple[memoryview, bytes, np.ndarray, np.ndarray]:
    """A segment's ``.data`` — its records as ``buf`` holds them, then their flags —
    and each record's offset and length in it; ``buf``: the chunk's payload when the
    seal began. No step per record: the records are ``buf`` itself.

    The payload the seal began with, not chunk.buf now: a delete on the engine thread
    may meanwhile free a wholly deleted chunk's payload (Chunk.release_payloads rebinds
    buf to an empty one), and the segment must still hold the records its flags
    snapshot calls live, for a crash may lose the delete's frame (docs/durability.md,
    "Segments and seals"). Bounds past the buffer read as empty records, never past it.
    """
    if isinstance(buf, LaidLater):  # a publish's chunk, laid out now (off the event loop)
        buf = buf.laid()
    n = chunk.n
    ends = np.frombuffer(chunk.ends, np.uint64, n).astype(np.int64)  # type: ignore[call-overload]
    bounds = np.zeros(n + 1, np.int64)
    bounds[1:] = np.minimum(ends, len(buf))
    flags = np.where(np.frombuffer(dead, np.uint8, n) == DELETED, DELETED_FLAG, 0)
    return (
        memoryview(buf)[: int(bounds[-1])],
        flags.astype(np.uint8).tobytes(),
        bounds[:-1].astype(np.uint64),
        np.diff(bounds).astype(np.uint32),
    )


class SealedChunk(Chunk):
    """A chunk whose records live in a segment: reads go through mmap, so a topic much
    larger than memory costs only its per-record deleted flags in RAM."""

    __slots__ = ("_data", "_flags_at", "_idx", "data_path", "data_sum", "disk_dead", "idx_path",
                 "lens", "offsets", "version")  # fmt: skip

    # numpy views of the mapped index stand in for Chunk's arrays (None while remapping).
    offsets: Any
    lens: Any
    ts: Any
    size: Any
    node: Any
    tag: Any
    ends: Any

    def __init__(self, data_path: Path, idx_path: Path, dead: bytes | None = None) -> None:
        """Map a segment. ``dead``, when the caller knows the flags (it just wrote them),
        spares reading them back (in format 1, every page of ``.data``)."""
        super().__init__(0)
        self.data_path = data_path
        self.idx_path = idx_path
        self._map_index()
        self.sealed = True
        self._data = _map(data_path)
        end = int(self.offsets[-1]) + int(self.lens[-1]) if self.n else 0
        if self.version == 2:  # the flags follow the records
            self._flags_at: int | None = end
            size = end + self.n
        else:  # each flag ends its record's frame, after the frame's checksum
            self._flags_at = None
            size = end + _SUM.size + 1
        if self.n and len(self._data) != size:
            raise SegmentError(f"{data_path}: size does not match its index")
        if dead is None:
            self.dead = self.read_flags()
            self._remap_data()
        else:
            self.dead = bytearray(dead)
        self.disk_dead = bytes(self.dead)  # the flags as they are on disk
        self.live = int(np.count_nonzero(np.frombuffer(self.dead, np.uint8) == 0))

    def _map_index(self) -> None:
        self._idx = _map(self.idx_path)
        raw = memoryview(self._idx)
        if len(raw) < _IDX_HEAD.size + 8 or _SUM.unpack_from(raw, len(raw) - 8)[0] != (
            xxhash.xxh3_64_intdigest(raw[:-8])
        ):
            raise SegmentError(f"{self.idx_path}: index checksum mismatch")
        magic, version, base_seq, count = _IDX_HEAD.unpack_from(raw, 0)
        if magic != _IDX_MAGIC or version not in _READS:
            raise SegmentError(f"{self.idx_path}: not a waymark segment index (version {version})")
        self.version = version
        self.base_seq = base_seq
        offset = _IDX_HEAD.size
        views = {}
        for name, dtype in _ARRAYS:
            views[name] = np.frombuffer(raw, dtype, count, offset)
            offset += count * np.dtype(dtype).itemsize
        (table_len,) = _LEN.unpack_from(raw, offset)
        tables = orjson.loads(raw[offset + 4 : offset + 4 + table_len])
        # The records' XXH3 (format 2), for an offline check: verifying it here would
        # read every page of every segment at each start.
        at = offset + 4 + table_len
        self.data_sum = _SUM.unpack_from(raw, at)[0] if version == 2 else None
        self.offsets, self.lens = views["offsets"], views["lens"]
        self.ts, self.size = views["ts"], views["size"]
        self.node, self.tag = views["node"], views["tag"]
        self.node_names = Names(tables["nodes"])
        self.tag_names = Names(tables["tags"])
        self.ends = self.offsets  # only its length is used: n and last_seq

    def drop_cached_pages(self) -> None:
        """Map the index afresh, so pages touched while loading (every size and tag,
        once) leave this process's resident set for the page cache."""
        self.offsets = self.lens = self.ts = self.size = self.node = self.tag = self.ends = None
        self._idx.close()
        self._map_index()

    def read_flags(self) -> bytearray:
        """The on-disk delete flags, as the in-memory ``dead`` marks (only 0xD5 deletes)."""
        data = np.frombuffer(self._data, np.uint8)
        if self._flags_at is not None:  # format 2: n bytes after the records
            flags = data[self._flags_at : self._flags_at + self.n]
        else:
            flags = data[self.flag_offsets(np.arange(self.n))] if self.n else data[:0]
        return bytearray((flags == DELETED_FLAG).astype(np.uint8).tobytes())

    def _remap_data(self) -> None:
        # Reading the flags touched their pages (every page, in format 1); a fresh mapping
        # leaves them to the page cache instead of this process's resident set.
        self._data.close()
        self._data = _map(self.data_path)

    def start(self, i: int) -> int:
        return int(self.offsets[i])

    def slice(self, i: int, j: int) -> bytes:
        data = self._data
        offsets, lens = self.offsets[i:j].tolist(), self.lens[i:j].tolist()
        return b"".join(data[o : o + n] for o, n in zip(offsets, lens, strict=True))

    def records(self, i: int, j: int) -> tuple[bytes, np.ndarray, np.ndarray]:
        # One copy of the mapped frames, records and frame heads alike: a slice per
        # record costs a Python object each (docs/http-api.md, "Arrow pages").
        first = int(self.offsets[i])
        starts = self.offsets[i:j].astype(np.int64) - first
        ends = starts + self.lens[i:j]
        return self._data[first : first + int(ends[-1])], starts, ends

    def release_payloads(self) -> None:
        """Nothing to free: the payloads were never in memory."""

    def flag_offsets(self, indexes: np.ndarray) -> np.ndarray:
        """Where the delete flags of records ``indexes`` lie in ``.data``."""
        if self._flags_at is not None:
            return np.asarray(indexes, np.int64) + self._flags_at
        return (self.offsets[indexes] + self.lens[indexes] + 8).astype(np.int64)


def _map(path: Path) -> mmap.mmap:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return mmap.mmap(-1, 1)  # an empty segment: nothing to map
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def flip_deleted(chunk: SealedChunk, dead: bytes, fileio: FileIO) -> int:
    """Flip on disk the flag of every record ``dead`` (a snapshot of the in-memory marks)
    says is deleted and the disk does not yet; fsync. Deletion only ever adds marks."""
    memory = np.frombuffer(dead, np.uint8)
    disk = np.frombuffer(chunk.disk_dead, np.uint8)
    todo = np.flatnonzero((memory == DELETED) & (disk != DELETED))
    if not len(todo):
        return 0
    fd = os.open(chunk.data_path, os.O_WRONLY)
    try:
        for position in chunk.flag_offsets(todo).tolist():
            os.pwrite(fd, bytes((DELETED_FLAG,)), position)
        fileio.fdatasync(fd)
    finally:
        os.close(fd)
    chunk.disk_dead = dead
    return len(todo)
