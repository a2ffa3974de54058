"""Open a data directory: replay the WAL into an engine, then keep journaling to it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ...clock import Clock
from ..config import TopicConfig
from ..engine import Engine
from ..records import Limits
from ..replay import apply_frame, finish
from .fileio import FileIO
from .wal import Wal


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    frames: int
    torn_bytes: int  # cut from the ends of WAL files: writes that never fully landed
    topics: int
    seconds: float


def open_engine(
    data_dir: Path,
    *,
    clock: Clock | None = None,
    defaults: TopicConfig | None = None,
    limits: Limits | None = None,
    shards: int = 2,
    fileio: FileIO | None = None,
) -> tuple[Engine, Wal, RecoveryReport]:
    """Recover the engine stored in ``data_dir`` (creating it if new) and attach its WAL.

    Raises :class:`~waymark.log.storage.frames.CorruptFrame` naming the file and
    offset if a frame in the middle of a file fails its checksum.
    """
    started = time.perf_counter()
    wal_dir = data_dir / "wal"
    wal_dir.mkdir(parents=True, exist_ok=True)
    engine = Engine(clock=clock, defaults=defaults, limits=limits)
    count = torn = 0
    for path, frames, end in Wal.existing_frames(wal_dir):
        size = path.stat().st_size
        if end < size:
            # A torn final write: cut it so new frames follow the last whole one.
            os.truncate(path, end)
            torn += size - end
        for frame in frames:
            apply_frame(engine, frame)
        count += len(frames)
    finish(engine)
    wal = Wal(wal_dir, shards=shards, fileio=fileio)
    engine.journal = wal
    report = RecoveryReport(count, torn, len(engine.list_topics()), time.perf_counter() - started)
    return engine, wal, report
