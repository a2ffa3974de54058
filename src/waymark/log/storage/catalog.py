"""The catalog: what a checkpoint knows, written atomically as one checksummed frame.

It names every topic with the state that segments alone cannot tell (config, epoch,
watermarks and eviction floors, crash holes, the seq ceiling, recent idempotency
ids), the segments that hold its records, and, per WAL shard, the first file to
replay. Anything on disk that it does not name is left over from an interrupted
checkpoint and is removed at recovery.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import orjson

from ..topic import Hole, LossRun, Topic
from .fileio import FileIO
from .frames import CorruptFrame, FrameKind, encode, read_file

CATALOG = "catalog"


# A topic name may be 255 characters (a queue's leases log a few more), the longest
# file name most file systems take: the folder keeps a prefix of it.
DIR_NAME_CHARS = 200


def topic_dir_name(topic: Topic) -> str:
    # The epoch alone makes the folder unique (no two topic instances share one in an
    # engine's life); the name is only there for people looking at the data directory.
    return f"{topic.epoch:010d}-{topic.name[:DIR_NAME_CHARS]}"


def topic_entry(topic: Topic, segments: list[int]) -> dict[str, Any]:
    horizon = topic.last_ts - topic.config.idempotency_window_ms
    return {
        "name": topic.name,
        "type": str(topic.type),
        "epoch": topic.epoch,
        "created_ts": topic.created_ts,
        "config": msgspec.structs.asdict(topic.config),
        "dir": topic_dir_name(topic),
        "segments": segments,
        "next_seq": topic.next_seq,
        "front": topic.front,
        "cap_floor": topic.cap_floor,
        "ttl_floor": topic.ttl_floor,
        "losses": [[r.lo, r.hi, r.reason, r.lost] for r in topic.losses],
        "ceiling": topic.ceiling,
        "holes": [list(h) for h in topic.holes],
        "last_ts": topic.last_ts,
        "last_write_ts": topic.last_write_ts,
        "dedupe": [[i, s, t] for i, (s, t) in topic._dedupe.items() if t >= horizon],
    }


def restore_state(topic: Topic, entry: dict[str, Any]) -> None:
    topic.next_seq = entry["next_seq"]
    topic.front = entry["front"]
    topic.cap_floor = entry["cap_floor"]
    topic.ttl_floor = entry["ttl_floor"]
    topic.losses = [LossRun(*run) for run in entry["losses"]]
    topic.ceiling = entry["ceiling"]
    topic.holes = [Hole(*h) for h in entry["holes"]]
    topic.last_ts = entry["last_ts"]
    topic.last_write_ts = entry["last_write_ts"]
    for ident, seq, ts in sorted(entry["dedupe"], key=lambda d: d[2]):
        topic._dedupe[ident] = (seq, ts)
        topic._dedupe_order.append((ts, ident))


def write_catalog(data_dir: Path, body: dict[str, Any], fileio: FileIO) -> None:
    fileio.replace_file(data_dir / CATALOG, encode(FrameKind.CATALOG, orjson.dumps(body)))


def read_catalog(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / CATALOG
    if not path.exists():
        return None
    frames, end = read_file(path)
    if len(frames) != 1 or end != path.stat().st_size or frames[0].kind is not FrameKind.CATALOG:
        # Written under a temporary name and renamed: a damaged catalog is not a torn write.
        raise CorruptFrame(path, end, "the catalog is not one whole frame")
    return orjson.loads(frames[0].payload)
