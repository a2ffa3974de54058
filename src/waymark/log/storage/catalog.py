"""The catalog: what a snapshot knows, written atomically as one checksummed frame.

It names every topic with the state that segments alone cannot tell (config, epoch,
watermarks and eviction floors, crash holes, the seq ceiling, recent idempotency
ids), the segments that hold its records, and, per WAL shard, the first file to
replay. Anything on disk that it does not name is left over from an interrupted
snapshot and is removed at restore.

The catalog and its topic entries are msgspec Structs; their field order is the
order of the keys on disk, so the file is byte for byte what the engine always wrote.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from ...protocol import KeyChange, TopicConfig, TopicType
from ..router import RouterEntry
from ..topic import Hole, LossRun, Topic, TopicSnapshot
from ..writers import WritersSnapshot
from .fileio import FileIO
from .frames import CorruptFrame, FrameKind, encode, read_file

CATALOG = "catalog"


# A topic name may be 255 characters (a queue's leases log a few more), the longest
# file name most file systems take: the folder keeps a prefix of it.
DIR_NAME_CHARS = 200


class TopicEntry(msgspec.Struct):
    """One topic instance in the catalog."""

    name: str
    type: TopicType
    epoch: int
    created_ts: int
    config: TopicConfig
    dir: str
    segments: list[int]  # base seqs of its segments
    next_seq: int
    front: int
    cap_floor: int
    ttl_floor: int
    losses: list[tuple[int, int, str, int]]  # (lo, hi, reason, lost) runs
    ceiling: int
    holes: list[list[int | str]]  # (lo, hi, reason)
    last_ts: int
    last_write_ts: int
    dedupe: list[tuple[str, int, int]]  # (id, seq, ts) inside the idempotency window
    cold: list[int] = msgspec.field(default_factory=list)  # those segments in the cold tier

    def topic(self) -> Topic:
        """The topic this entry describes, without its segments."""
        snapshot = TopicSnapshot(
            self.next_seq, self.front, self.cap_floor, self.ttl_floor,
            [LossRun(*run) for run in self.losses], self.ceiling,
            [Hole(*h) for h in self.holes], self.last_ts, self.last_write_ts,  # type: ignore[arg-type]
            self.dedupe,
        )  # fmt: skip
        return Topic.restored(snapshot, self.name, self.type, self.config, self.epoch,
                              self.created_ts)  # fmt: skip


class Catalog(msgspec.Struct):
    version: int
    last_epoch: int
    wal: dict[str, int]  # per WAL shard, the first file to replay
    topics: list[TopicEntry]
    # the writers' epochs and publish ledgers; "staging" on disk since the first version
    writers: WritersSnapshot = msgspec.field(name="staging")
    routers: list[RouterEntry] = msgspec.field(default_factory=list)  # none before routers
    # Changes no change checkpoint named yet when the seal began: a restart names them
    # (docs/semantics/recovery.md §1.6). Left out when there are none, so a catalog
    # without them is the bytes it always was.
    changes: list[KeyChange] | msgspec.UnsetType = msgspec.UNSET


def topic_dir_name(topic: Topic) -> str:
    # The epoch alone makes the folder unique (no two topic instances share one in an
    # engine's life); the name is only there for people looking at the data directory.
    return f"{topic.epoch:010d}-{topic.name[:DIR_NAME_CHARS]}"


def topic_entry(topic: Topic, segments: list[int]) -> TopicEntry:
    snap = topic.snapshot()
    return TopicEntry(
        topic.name, topic.type, topic.epoch, topic.created_ts, topic.config,
        topic_dir_name(topic), segments, snap.next_seq, snap.front, snap.cap_floor,
        snap.ttl_floor, [(r.lo, r.hi, r.reason, r.lost) for r in snap.losses],
        snap.ceiling, [list(h) for h in snap.holes], snap.last_ts, snap.last_write_ts,
        snap.dedupe,
    )  # fmt: skip


def write_catalog(data_dir: Path, catalog: Catalog, fileio: FileIO) -> None:
    fileio.replace_file(data_dir / CATALOG, encode(FrameKind.CATALOG, msgspec.json.encode(catalog)))


def read_catalog(data_dir: Path) -> Catalog | None:
    path = data_dir / CATALOG
    if not path.exists():
        return None
    frames, end = read_file(path)
    if len(frames) != 1 or end != path.stat().st_size or frames[0].kind is not FrameKind.CATALOG:
        # Written under a temporary name and renamed: a damaged catalog is not a torn write.
        raise CorruptFrame(path, end, "the catalog is not one whole frame")
    return msgspec.json.decode(frames[0].payload, type=Catalog)
