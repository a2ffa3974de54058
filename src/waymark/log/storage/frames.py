"""Checksummed frames, the unit of every durable file.

A frame is ``u32 length | u8 kind | payload | u64 xxh3(kind + payload)``; the
length counts kind and payload. Reading stops at the first incomplete frame (a
torn tail, which recovery cuts off) and refuses a checksum mismatch anywhere
else, naming the file and offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from itertools import pairwise
from pathlib import Path

import numpy as np
import xxhash

from ...protocol.errors import WaymarkError

_LEN = struct.Struct("<I")
_SUM = struct.Struct("<Q")
OVERHEAD = _LEN.size + 1 + _SUM.size
PAYLOAD_AT = _LEN.size + 1  # a frame's payload starts this far into it
# No writer produces a larger frame (the journal refuses one), so a larger length is damage.
MAX_FRAME_BYTES = 1 << 30


class FrameKind(IntEnum):
    TOPIC = 1  # create or reconfigure a topic (a control frame: survives every class)
    DROP = 2  # delete a topic
    RECORDS = 3  # one atomic append
    DELETE = 4  # a point-in-time deletion
    HEAD = 5  # the seq ceiling a topic may hand out (never reuse a seq after a crash)
    CATALOG = 6  # a seal: every topic's state, its segments, where the WAL resumes
    WRITER = 7  # a sink writer's new epoch (fences its older runs)
    ROUTER = 8  # create or delete a router (a control frame, docs/semantics/topics.md §8.6)
    STAGE = 9  # a sink's staged chunk, journaled as it is staged (invisible until published)
    PUBLISH = 10  # a sink's publish of chunks STAGE frames earlier in its WAL file hold


class CorruptFrame(WaymarkError):
    """A frame in the middle of a file fails its checksum: refuse to guess."""

    def __init__(self, path: Path, offset: int, why: str) -> None:
        super().__init__(f"{path}: corrupt frame at offset {offset}: {why}")
        self.path = path
        self.offset = offset


def encode(kind: FrameKind, payload: bytes) -> bytes:
    body = bytes((kind,)) + payload
    return _LEN.pack(len(body)) + body + _SUM.pack(xxhash.xxh3_64_intdigest(body))


# A frame payload up to this size is joined before it is framed (see frame_parts).
JOIN_BELOW = 1 << 20


def frame_parts(kind: FrameKind, parts: list[bytes], *, join: bool = True) -> list[bytes]:
    """The frame of the payload ``b"".join(parts)``, as parts to write one after the
    other: a 50 MB append is framed on the event loop, and joining (three copies, as
    :func:`encode` makes) held it for a tenth of a second. The WAL's writer thread
    joins them, with the GIL released (docs/security.md, Limits). A small payload is
    joined here: one digest update instead of one per record, and one write part;
    ``join=False`` leaves a few large parts as they are (a sink's staged chunk)."""
    head = bytes((kind,))
    sizes = list(map(len, parts))
    length = 1 + sum(sizes)
    if join and length <= JOIN_BELOW and len(parts) > 1:
        parts = [b"".join(parts)]
    elif join and len(parts) > 2 * length // JOIN_BELOW:  # many small parts (a sink's publish)
        parts = _runs(parts, sizes)
    digest = xxhash.xxh3_64(head)
    for part in parts:
        digest.update(part)
    return [_LEN.pack(length), head, *parts, _SUM.pack(digest.intdigest())]


def _runs(parts: list[bytes], sizes: list[int]) -> list[bytes]:
    """``parts`` joined into runs of about ``JOIN_BELOW`` bytes: one digest update and
    one write part per run, not per record, and no join long enough to hold the GIL for
    long."""
    ends = np.cumsum(sizes)
    cuts = np.searchsorted(ends, np.arange(JOIN_BELOW, int(ends[-1]), JOIN_BELOW), "right")
    bounds = [0, *np.unique(cuts).tolist(), len(parts)]
    return [b"".join(parts[a:b]) for a, b in pairwise(bounds) if b > a]


@dataclass(frozen=True, slots=True)
class Frame:
    kind: FrameKind
    payload: memoryview
    offset: int


def scan(data: bytes | memoryview, path: Path) -> tuple[list[Frame], int]:
    """Every whole frame in ``data`` and the offset where they end.

    The last write may be torn: a frame cut short, or a failing frame with nothing
    but zeros after it, ends the scan there. Anything else that fails — a bad
    checksum with data after it, an impossible length — is corruption.
    """
    view = memoryview(data)
    frames: list[Frame] = []
    offset = 0
    total = len(view)
    while offset + _LEN.size <= total:
        (length,) = _LEN.unpack_from(view, offset)
        end = offset + _LEN.size + length + _SUM.size
        if length == 0 and not any(view[offset:]):
            break  # a zero-filled tail
        if length == 0 or length > MAX_FRAME_BYTES:
            raise CorruptFrame(path, offset, f"impossible frame length {length}")
        if end > total:
            break  # torn: the last write stopped part-way through this frame
        body = view[offset + _LEN.size : offset + _LEN.size + length]
        (digest,) = _SUM.unpack_from(view, end - _SUM.size)
        if xxhash.xxh3_64_intdigest(body) != digest:
            if any(view[end:]):
                raise CorruptFrame(path, offset, "checksum mismatch")
            break  # torn: the last frame's bytes did not all land
        frames.append(Frame(FrameKind(body[0]), body[1:], offset))
        offset = end
    return frames, offset


def frame_at(data: bytes, offset: int) -> Frame:
    """The frame :func:`scan` found at ``offset`` of ``data`` (its checksum is not
    checked again): a set-aside frame costs its offset, not a decoded object."""
    (length,) = _LEN.unpack_from(data, offset)
    body = memoryview(data)[offset + _LEN.size : offset + _LEN.size + length]
    return Frame(FrameKind(body[0]), body[1:], offset)


def read_file(path: Path) -> tuple[list[Frame], int]:
    return scan(path.read_bytes(), path)
