"""Chunks: records held as encoded bytes in large buffers with array indexes.

A chunk stores a contiguous seq range. Each record is its wire JSON followed by a
comma, appended to one ``bytearray``; parallel typed arrays hold its end offset,
timestamp, interned node and tag ids, size, and a deleted flag. No Python object
exists per record, so millions of records cost the garbage collector nothing, and
a run of consecutive records reads out as one slice. Chunks are also the unit of
physical reclaim (the in-memory analogue of a segment, §5.6).
"""

from __future__ import annotations

from array import array
from itertools import accumulate, islice, repeat

CHUNK_RECORDS = 16_384
CHUNK_BYTES = 8 << 20

LIVE = 0
DELETED = 1


class Chunk:
    __slots__ = ("base_seq", "buf", "dead", "ends", "live", "node", "size", "tag", "ts")

    def __init__(self, base_seq: int) -> None:
        self.base_seq = base_seq
        self.buf = bytearray()
        self.ends = array("Q")  # end offset of record i in buf (its start is ends[i-1])
        self.ts = array("Q")
        self.node = array("I")  # interned node id, 0 = no node
        self.tag = array("I")  # interned tag id, 0 = no tag
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
        return 0 if len(self.buf) >= CHUNK_BYTES else CHUNK_RECORDS - len(self.ends)

    def extend(
        self,
        first_seq: int,
        ts: int,
        bodies: list[bytes],
        nodes: list[int],
        tags: list[int],
        sizes: list[int],
    ) -> None:
        """Append consecutive records: one buffer write and one extend per index array."""
        pieces = [
            b'{"$seq":%d,"$ts":%d%b,' % (seq, ts, body)
            for seq, body in zip(range(first_seq, first_seq + len(bodies)), bodies, strict=True)
        ]
        self.ends.extend(islice(accumulate(map(len, pieces), initial=len(self.buf)), 1, None))
        self.buf += b"".join(pieces)
        self.ts.extend(repeat(ts, len(pieces)))
        self.node.extend(nodes)
        self.tag.extend(tags)
        self.size.extend(sizes)
        self.dead.extend(bytes(len(pieces)))
        self.live += len(pieces)

    def start(self, i: int) -> int:
        return self.ends[i - 1] if i else 0

    def slice(self, i: int, j: int) -> bytes:
        """Records [i, j) as comma-terminated wire JSON (a copy: buffers keep growing)."""
        return bytes(self.buf[self.start(i) : self.ends[j - 1]])

    def release_payloads(self) -> None:
        """Free the bytes of a sealed chunk whose every slot is dead (§7.1: payloads freed)."""
        self.buf = bytearray()
