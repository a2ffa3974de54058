"""Open a data directory: load the last seal, replay the WAL after it, and keep
journaling to the WAL. The records of ``memory`` topics are replayed gradually, after
the engine is returned (:mod:`waymark.log.gradual`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ...clock import Clock, IdSource
from ..changes import Changes
from ..config import EngineConfig, StorageConfig
from ..engine import Engine
from ..gradual import GradualReplay
from ..replay import apply_frame, finish
from ..staged import resolve
from .catalog import Catalog, read_catalog
from .fileio import FileIO
from .seal import TOPICS, Sealer, remove_unreferenced
from .segment import SealedChunk, SegmentError, segment_paths
from .store import Store
from .wal import Wal

INSTANCE = "instance"  # the file holding the data directory's instance id


@dataclass(frozen=True, slots=True)
class RestoreReport:
    frames: int
    segments: int
    torn_bytes: int  # cut from the ends of WAL files: writes that never fully landed
    topics: int
    seconds: float
    # memory topics whose frames are set aside: they recover after this returns
    # (docs/semantics/topics.md §2.2)
    deferred_topics: int = 0
    deferred_frames: int = 0


def open_engine(
    storage: StorageConfig,
    config: EngineConfig | None = None,
    *,
    track_changes: bool = False,
    clock: Clock | None = None,
    ids: IdSource | None = None,
    fileio: FileIO | None = None,
) -> tuple[Engine, Store, RestoreReport]:
    """Recover the engine stored in ``storage.data_dir`` (creating it if new), with
    ``config``'s limits and topic defaults, and attach its WAL.

    ``track_changes``: the engine keeps change checkpoints (:meth:`Engine.track_changes`
    follows); the changes no checkpoint named before the stop are noted again, from the
    catalog and the WAL, for the next one (docs/semantics/recovery.md §1.6).
    ``ids``: where lease ids and a new directory's instance id come from (random by
    default); ``clock`` and ``fileio`` are injected by tests.

    Raises :class:`~waymark.log.storage.frames.CorruptFrame` (or
    :class:`~waymark.log.storage.segment.SegmentError`) naming the file and offset
    if anything but a torn final write is damaged.
    """
    started = time.perf_counter()
    fileio = fileio or FileIO()
    config = config or EngineConfig()
    data_dir, cold_dir = storage.data_dir, storage.cold_dir
    wal_dir = data_dir / "wal"
    wal_dir.mkdir(parents=True, exist_ok=True)
    engine = Engine(config, clock=clock, ids=ids)
    engine.instance = instance_of(data_dir, fileio, engine.ids)
    if track_changes:
        engine.changes = Changes()
    catalog = read_catalog(data_dir)
    segments = 0
    if catalog is not None:
        segments = load_sealed(engine, data_dir, catalog, cold_dir)
    count = torn = 0
    gradual = GradualReplay(engine)
    start = catalog.wal if catalog else None
    for path, data, frames, end in Wal.existing_frames(wal_dir, start):
        size = path.stat().st_size
        if end < size:
            # A torn final write: cut it so new frames follow the last whole one.
            os.truncate(path, end)
            torn += size - end
        # (a sink's stage frames only count once a publish frame names them)
        for held, frame in resolve(path, data, frames):
            if not gradual.set_aside(held, frame):
                apply_frame(engine, frame)
        count += len(frames)
    gradual.settle()
    moved = finish(engine)
    engine.replaying = gradual if gradual.topics else None
    wal = Wal(wal_dir, shards=storage.wal_shards, fileio=fileio, clock=engine.clock, start=start)
    engine.journal = wal
    for head in moved:
        # Ahead of any later frame of its topic in its shard (not waited for: should it
        # not land, nothing after it did, and the next restart decides the same).
        wal.write(head.name, head.encode())
    report = RestoreReport(count, segments, torn, len(engine.kernel),
                            time.perf_counter() - started, gradual.topics,
                            gradual.frames)  # fmt: skip
    sealer = Sealer(data_dir, wal, fileio, cold_dir, storage.hot_segments)
    return engine, Store(wal, sealer), report


def instance_of(data_dir: Path, fileio: FileIO, ids: IdSource) -> str:
    """The data directory's instance id, made with it (docs/semantics/recovery.md §3.5):
    a new or replaced directory is another instance, whose checkpoint ids start again.
    A directory from before ids were kept gets one at its first start."""
    path = data_dir / INSTANCE
    if path.exists():
        return path.read_text().strip()
    instance = ids.token(8)
    fileio.replace_file(path, instance.encode() + b"\n")
    return instance


def load_sealed(engine: Engine, data_dir: Path, catalog: Catalog, cold_dir: Path | None) -> int:
    keep: set[Path] = set()
    for entry in catalog.topics:
        topic = entry.topic()
        directory = data_dir / TOPICS / entry.dir
        cold = set(entry.cold)
        if cold and cold_dir is None:
            raise SegmentError(
                f"topic {entry.name!r} has segments in a cold tier: pass its --cold-dir"
            )
        for base_seq in entry.segments:
            home = cold_dir / entry.dir if base_seq in cold and cold_dir else directory
            paths = segment_paths(home, base_seq)
            keep.update(paths)
            topic.add_chunk(SealedChunk(*paths))
        topic.recount()
        # The topic was just built from its segments alone: every chunk is sealed.
        for chunk in cast("list[SealedChunk]", topic.chunks):
            chunk.drop_cached_pages()
        engine.kernel.register(topic)
    engine.kernel.restore_epoch(catalog.last_epoch)
    if engine.changes is not None and catalog.changes:
        engine.changes.replayed().restored(catalog.changes)
    engine.writers.restore(catalog.writers)
    engine.routers.restore(catalog.routers)
    remove_unreferenced(data_dir / TOPICS, keep)
    if cold_dir is not None:
        remove_unreferenced(cold_dir, keep)
    return len(keep) // 2
