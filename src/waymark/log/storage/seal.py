"""Seals: seal the in-memory tail into segments, then trim the WAL.

A seal runs in three steps so the engine thread never waits on the disk:

1. :meth:`Sealer.begin` (engine thread, quick): rotate the WAL, seal every
   chunk, and snapshot what the catalog will say.
2. :meth:`Sealer.write` (any thread): write the new segments, flip the delete
   flags of sealed records deleted since, write the catalog atomically, then remove
   WAL files and segment files the catalog no longer needs.
3. :meth:`Sealer.finish` (engine thread): move the sealed chunks onto their
   segments' mmaps, releasing their memory.

A crash anywhere in step 2 is safe: until the catalog's rename lands, recovery uses
the previous catalog and the untrimmed WAL, and removes half-written files.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ...protocol import Durability
from ..chunk import Chunk, Payload
from ..engine import Engine
from .catalog import Catalog, topic_dir_name, topic_entry, write_catalog
from .fileio import FileIO
from .segment import SealedChunk, flip_deleted, segment_paths, write_segment
from .wal import Wal

TOPICS = "topics"


@dataclass
class NewSegment:
    directory: Path
    chunk: Chunk
    dead: bytes  # the deleted marks when the seal began
    # Its payload when the seal began: a delete may free the chunk's before the write
    # (Chunk.release_payloads), and the segment must hold what ``dead`` calls live. A
    # publish's chunk not laid out yet is laid out by the write, off the event loop.
    buf: Payload
    topic: str
    epoch: int
    sealed: SealedChunk | None = None  # the chunk mapped from its segment, once written


@dataclass
class SealPlan:
    wal_start: dict[str, int]
    catalog: Catalog | None = None
    new: list[NewSegment] = field(default_factory=list)
    flips: list[tuple[SealedChunk, bytes]] = field(default_factory=list)
    to_cold: list[tuple[SealedChunk, Path]] = field(default_factory=list)  # (chunk, cold dir)
    keep: set[Path] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class SealReport:
    segments_written: int
    flags_flipped: int
    segments_cooled: int  # moved to the cold tier
    files_removed: int


class Sealer:
    def __init__(
        self,
        data_dir: Path,
        wal: Wal,
        fileio: FileIO,
        cold_dir: Path | None = None,
        hot_segments: int = 4,
    ) -> None:
        """``cold_dir``: where sealed segments older than each topic's newest
        ``hot_segments`` are moved (the cold tier, docs/semantics/topics.md §5.6); None keeps
        everything hot."""
        self.data_dir = data_dir
        self.topics_dir = data_dir / TOPICS
        self.cold_dir = cold_dir
        self.hot_segments = hot_segments
        self.wal = wal
        self.fileio = fileio
        self.running = threading.Lock()  # one seal at a time

    def begin(self, engine: Engine) -> SealPlan:
        # A failed WAL writer left mutations in memory that it refused: sealing them
        # would make refused writes readable after a restart.
        self.wal.check_writers()
        if engine.replaying is not None:
            # The WAL files this trims still hold frames set aside for memory topics:
            # they are applied first, so the catalog holds them (the server waits for
            # gradual replay to end before it seals; shutdown does not).
            engine.replaying.finish_all()
        wal_start = self.wal.rotate()
        plan = SealPlan(wal_start)
        entries = []
        for topic in engine.kernel.topics():
            directory = self.topics_dir / topic_dir_name(topic)
            cold = self.cold_dir / topic_dir_name(topic) if self.cold_dir else None
            segments: list[int] = []
            cold_segments: list[int] = []
            ephemeral = topic.config.durability is Durability.EPHEMERAL
            kept = [c for c in ([] if ephemeral else topic.chunks) if c.live]
            for position, chunk in enumerate(kept):
                # (A chunk with nothing live is wholly deleted or evicted: left out, so
                # its files go — the whole-segment drop of docs/semantics/topics.md §7.4.)
                chunk.sealed = True
                dead = bytes(chunk.dead)
                home = directory
                if isinstance(chunk, SealedChunk):
                    plan.flips.append((chunk, dead))
                    home = chunk.data_path.parent
                    older = position < len(kept) - self.hot_segments
                    if cold is not None and home != cold and older:
                        plan.to_cold.append((chunk, cold))
                        home = cold
                else:
                    plan.new.append(NewSegment(directory, chunk, dead, chunk.payload(), topic.name,
                                               topic.epoch))  # fmt: skip
                segments.append(chunk.base_seq)
                if home == cold:
                    cold_segments.append(chunk.base_seq)
                plan.keep.update(segment_paths(home, chunk.base_seq))
            entry = topic_entry(topic, segments)
            entry.cold = cold_segments
            entries.append(entry)
        # The changes no checkpoint named yet: the WAL frames that noted them go with
        # this seal (docs/semantics/recovery.md §1.6).
        pending = engine.changes.pending() if engine.changes is not None else []
        plan.catalog = Catalog(1, engine.kernel.last_epoch, wal_start, entries,
                               engine.writers.snapshot(), engine.routers.snapshot(),
                               pending or msgspec.UNSET)  # fmt: skip
        return plan

    def write(self, plan: SealPlan) -> SealReport:
        for new in plan.new:
            new.directory.mkdir(parents=True, exist_ok=True)
            write_segment(new.directory, new.chunk, new.dead, self.fileio, new.buf)
            # Mapped here, off the engine thread: finish() only swaps it in.
            new.sealed = SealedChunk(*segment_paths(new.directory, new.chunk.base_seq), new.dead)
        flipped = sum(flip_deleted(chunk, dead, self.fileio) for chunk, dead in plan.flips)
        for chunk, cold in plan.to_cold:
            # Copied (the cold tier may be another file system) and synced before the
            # catalog names it; the hot pair goes once the catalog is durable.
            cold.mkdir(parents=True, exist_ok=True)
            for hot_path, cold_path in zip(
                (chunk.data_path, chunk.idx_path), segment_paths(cold, chunk.base_seq), strict=True
            ):
                self.fileio.replace_file(cold_path, hot_path.read_bytes())
        assert plan.catalog is not None, "write() runs after begin()"
        write_catalog(self.data_dir, plan.catalog, self.fileio)
        # The catalog is durable: what it does not name is no longer needed.
        self.wal.trim(plan.wal_start)
        removed = remove_unreferenced(self.topics_dir, plan.keep)
        if self.cold_dir is not None:
            removed += remove_unreferenced(self.cold_dir, plan.keep)
        for chunk, cold in plan.to_cold:
            # Its mapping stays valid (the unlinked inode lives on while mapped); later
            # flag flips go to the cold copy.
            chunk.data_path, chunk.idx_path = segment_paths(cold, chunk.base_seq)
        return SealReport(len(plan.new), flipped, len(plan.to_cold), removed)

    def finish(self, engine: Engine, plan: SealPlan) -> None:
        for new in plan.new:
            topic = engine.kernel.get(new.topic)
            if topic is None or topic.epoch != new.epoch:
                continue  # dropped meanwhile
            sealed = new.sealed
            assert sealed is not None, "finish() runs after write()"
            sealed.dead = new.chunk.dead  # deletions since begin() stay marked
            sealed.live = new.chunk.live
            topic.replace_chunk(new.chunk, sealed)  # unless evicted meanwhile

    def run_blocking(self, engine: Engine) -> SealReport:
        """All three steps on this thread (tests, shutdown)."""
        with self.running:
            plan = self.begin(engine)
            report = self.write(plan)
            self.finish(engine, plan)
            return report


def remove_unreferenced(topics_dir: Path, keep: set[Path]) -> int:
    """Remove segment files and topic folders no catalog names (interrupted work)."""
    removed = 0
    if not topics_dir.exists():
        return 0
    directories = {path.parent for path in keep}
    for directory in topics_dir.iterdir():
        if directory not in directories:
            shutil.rmtree(directory, ignore_errors=True)
            removed += 1
            continue
        for path in directory.iterdir():
            if path not in keep:
                path.unlink(missing_ok=True)
                removed += 1
    return removed
