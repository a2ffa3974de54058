"""A ``disk`` topic's acknowledged records are never lost silently across crashes that
land anywhere in the server's background work (docs/durability.md, "What a reader sees
after a crash"), as a hypothesis state machine over the production engine and storage.

The server's seal runs in three steps with appends and idle trims between them
(begin on the engine thread, the segment and catalog writes off it, finish back on
it); the machine interleaves them the same way, with appends acknowledged as the server
acknowledges them (at once under a durable ceiling, else once the commit is durable).
A crash loses every WAL byte that was not synced yet (a power cut; a SIGKILL loses
less). After each restart every acknowledged record is there byte for byte, or a reader
crossing it gets a ``lost`` tombstone covering it, and no seq is handed out again.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Durability, Engine, RecordIn, TagMatch
from waymark.log import topic as topic_module
from waymark.log.chunk import Chunk
from waymark.log.config import StorageConfig
from waymark.log.journal import Commit
from waymark.log.storage import seal as seal_module
from waymark.log.storage.catalog import TopicEntry
from waymark.log.storage.fileio import FileIO
from waymark.log.storage.restore import open_engine
from waymark.log.storage.seal import SealPlan
from waymark.log.storage.store import Store
from waymark.log.topic import WriteFrame

TOPIC = "d"


class UnsyncedWalLost(FileIO):
    """Fault injector: WAL bytes reach their file only at an fdatasync, which waits while
    the disk is held; :meth:`crash` keeps the first ``keep`` bytes of what was never
    synced and drops the rest: a power cut keeps none, a SIGKILL what the writer thread
    had written, maybe part of a frame. Seal files (written whole and synced,
    :meth:`FileIO.replace_file`) pass through."""

    def __init__(self) -> None:
        self.wal_fds: set[int] = set()
        self.pending: dict[int, list[bytes]] = {}
        self.released = threading.Event()
        self.crashed = False
        self.keep = 0

    def open_append(self, path: Path) -> int:
        # (once crashed, the process is gone: nothing it opens reaches the disk)
        fd = os.open(os.devnull, os.O_WRONLY) if self.crashed else super().open_append(path)
        self.wal_fds.add(fd)
        return fd

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if fd not in self.wal_fds:
            return super().write(fd, data)
        self.pending.setdefault(fd, []).append(bytes(data))
        return len(data)

    def fdatasync(self, fd: int) -> None:
        if fd not in self.wal_fds:
            return super().fdatasync(fd)
        self.released.wait()
        for data in self.pending.pop(fd, []):
            if self.crashed:
                data, self.keep = data[: self.keep], max(0, self.keep - len(data))
            os.write(fd, data)
        return None

    def close(self, fd: int) -> None:
        self.wal_fds.discard(fd)
        super().close(fd)

    def crash(self, keep: int) -> None:
        self.crashed, self.keep = True, keep
        self.released.set()


class CeilingCrashes(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="waymark-ceiling-"))
        self.clock = ManualClock()
        self.acked: dict[int, bytes] = {}
        self.waiting: list[tuple[list[int], list[bytes], Commit]] = []
        self.plan: SealPlan | None = None
        self.written = False
        self.counter = 0
        self.handed = 0  # the highest seq ever acknowledged: never handed out again
        self.open()
        self.engine.put_topic(TOPIC, ConfigPatch(durability=Durability.DISK))
        self.sync()  # the topic exists from here on, whatever crashes

    def open(self) -> None:
        self.disk = UnsyncedWalLost()
        self.disk.released.set()
        engine, store, _ = open_engine(
            StorageConfig(self.directory, wal_shards=1), clock=self.clock, fileio=self.disk
        )
        self.engine: Engine = engine
        self.store: Store = store

    @rule(n=st.integers(1, 6), ms=st.sampled_from([0, 1, 2, 5, 30]))
    def append(self, n: int, ms: int) -> None:
        self.clock.advance(ms)
        bodies = []
        for _ in range(n):
            self.counter += 1
            bodies.append(self.counter)
        result = self.engine.append(TOPIC, [RecordIn.of(b) for b in bodies])
        data = [orjson.dumps(b) for b in bodies]
        if result.must_sync:
            assert result.commit is not None
            self.waiting.append((result.seqs, data, result.commit))
        else:  # acknowledged at once, under a durable ceiling
            self.acked.update(zip(result.seqs, data, strict=True))
        self._acknowledge()

    def _acknowledge(self) -> None:
        still = []
        for seqs, data, commit in self.waiting:
            if commit.durable:
                self.acked.update(zip(seqs, data, strict=True))
            else:
                still.append((seqs, data, commit))
        self.waiting = still

    @rule()
    def sync(self) -> None:
        """One group commit of everything so far; outside it nothing of the WAL becomes
        durable (so what is acknowledged never depends on the writer thread's timing)."""
        self.disk.released.set()
        self.store.sync_blocking()
        self.disk.released.clear()
        self._acknowledge()

    @rule()
    def trim_pass(self) -> None:
        self.engine.trim_ceilings()
        self._acknowledge()

    @precondition(lambda self: self.plan is None)
    @rule()
    def seal_begin(self) -> None:
        self.plan = self.store.sealer.begin(self.engine)

    @precondition(lambda self: self.plan is not None and not self.written)
    @rule()
    def seal_write(self) -> None:
        assert self.plan is not None
        self.store.sealer.write(self.plan)
        self.written = True

    @precondition(lambda self: self.written)
    @rule()
    def seal_finish(self) -> None:
        assert self.plan is not None
        self.store.sealer.finish(self.engine, self.plan)
        self.plan, self.written = None, False

    @rule(keep=st.sampled_from([0, 0, 1, 40, 100, 300, 1000, 1 << 20]))
    def crash(self, keep: int) -> None:
        self.disk.crash(keep)
        self.store.close()
        self.plan, self.written, self.waiting = None, False, []
        self.handed = max([self.handed, *self.acked])
        self.open()
        self.disk.released.clear()
        self.check()

    def check(self) -> None:
        present: dict[int, bytes] = {}
        cursor = 0
        while True:
            page = self.engine.diff(TOPIC, cursor, limit=1000)
            for record in page.records():
                present[record["$seq"]] = orjson.dumps(record["data"])
            cursor = page.next_from_seq
            if page.caught_up:
                break
        for seq, data in sorted(self.acked.items()):
            if seq in present:
                assert present[seq] == data, f"record {seq} changed"
                continue
            survivor = max((s for s in present if s < seq), default=0)
            page = self.engine.diff(TOPIC, survivor, limit=1000)
            tombstone = page.tombstone
            assert tombstone is not None and tombstone.reason == "lost", (
                f"acknowledged record {seq} lost silently (read from {survivor})"
            )
            assert tombstone.gap_from <= seq <= tombstone.gap_to, (
                f"acknowledged record {seq} outside the tombstone {tombstone}"
            )
        for seq in set(self.acked) - set(present):
            del self.acked[seq]
        head = self.engine.get_topic(TOPIC, touch=False).head_seq
        assert head >= self.handed, f"head {head} below the acknowledged seq {self.handed}"

    def teardown(self) -> None:
        self.disk.released.set()
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)


SETTINGS = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# Finding one failure is the point, not shrinking it; the search is fixed (see
# tests/log/test_no_silent_loss.py).
MUTATION_SETTINGS = settings(
    SETTINGS, max_examples=200, database=None, derandomize=True, phases=[Phase.generate]
)


def test_acknowledged_disk_records_never_vanish_silently() -> None:
    run_state_machine_as_test(CeilingCrashes, settings=SETTINGS)


# --- the machine catches broken guards ------------------------------------------------


def test_catches_an_ack_above_a_ceiling_not_yet_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    # Mutation: a disk append never waits for its raise's frame to be durable.
    reserve = topic_module.Topic.reserve

    def never_waits(self: topic_module.Topic, last: int, now: int, write: WriteFrame) -> bool:
        reserve(self, last, now, write)
        return False

    monkeypatch.setattr(topic_module.Topic, "reserve", never_waits)
    with pytest.raises(AssertionError, match="lost silently"):
        run_state_machine_as_test(CeilingCrashes, settings=MUTATION_SETTINGS)


def lost_after_a_split_seal(directory: Path) -> tuple[int, Engine, Store]:
    """Acks under a raised ceiling taken by a seal's snapshot, the WAL holding the raise
    trimmed by that seal, then a crash that loses the acked records: only the catalog
    still knows they may have been handed out. Returns the lost seq and the restart."""
    disk = UnsyncedWalLost()
    disk.released.set()
    clock = ManualClock()
    engine, store, _ = open_engine(StorageConfig(directory, wal_shards=1), clock=clock,
                                   fileio=disk)  # fmt: skip
    engine.put_topic(TOPIC, ConfigPatch(durability=Durability.DISK))
    for i in range(8):  # a burst: the ceiling leads the head
        clock.advance(1)
        engine.append(TOPIC, [RecordIn.of(i)])
    store.sync_blocking()
    disk.released.clear()  # nothing more reaches the disk
    plan = store.sealer.begin(engine)
    result = engine.append(TOPIC, [RecordIn.of("acked")])
    assert not result.must_sync  # under the durable ceiling: acknowledged at once
    store.sealer.write(plan)  # the WAL before the seal, the raise with it, goes
    store.sealer.finish(engine, plan)
    disk.crash(0)
    store.close()
    engine, store, _ = open_engine(StorageConfig(directory, wal_shards=1), clock=clock)
    return result.seqs[0], engine, store


def test_a_seal_keeps_the_ceiling_for_acks_the_wal_then_loses(tmp_path: Path) -> None:
    seq, engine, store = lost_after_a_split_seal(tmp_path)
    page = engine.diff(TOPIC, seq - 1)
    assert page.tombstone is not None and page.tombstone.reason == "lost"
    assert page.tombstone.gap_from <= seq <= page.tombstone.gap_to
    store.close()


def test_catches_a_seal_that_forgets_the_ceilings_lead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutation: the catalog keeps the head as the ceiling, so once a seal has trimmed the
    # WAL, acknowledged records above it that a crash loses read as never written.
    original = seal_module.topic_entry

    def headless(topic: topic_module.Topic, segments: list[int]) -> TopicEntry:
        entry = original(topic, segments)
        entry.ceiling = entry.next_seq - 1
        return entry

    monkeypatch.setattr(seal_module, "topic_entry", headless)
    seq, engine, store = lost_after_a_split_seal(tmp_path)
    assert engine.diff(TOPIC, seq - 1).tombstone is None  # lost silently
    store.close()


# --- a seal racing a delete that frees a chunk's payload ------------------------------


def crash_after_a_seal_raced_by_a_delete(directory: Path) -> tuple[Engine, Store]:
    """A seal begins with a chunk of live records; a delete then takes them all, which
    frees the chunk's payload (Chunk.release_payloads), and the seal writes its segment
    and catalog; the crash loses the delete's frame, never synced (never acknowledged)."""
    disk = UnsyncedWalLost()
    disk.released.set()
    engine, store, _ = open_engine(StorageConfig(directory, wal_shards=1), fileio=disk)
    engine.put_topic("f", ConfigPatch(durability=Durability.FSYNC))
    engine.append("f", [RecordIn.of("kept")])
    store.seal(engine)  # a chunk before, so the doomed one is not the first
    engine.append("f", [RecordIn.of(i, tag="doomed") for i in range(3)])
    store.sync_blocking()  # 1..4 acknowledged
    plan = store.sealer.begin(engine)
    engine.append("f", [RecordIn.of("after")])  # the doomed chunk is not the last either
    disk.released.clear()  # nothing more reaches the disk
    engine.delete("f", match=TagMatch(True, "doomed"))
    store.sealer.write(plan)
    store.sealer.finish(engine, plan)
    disk.crash(0)
    store.close()
    engine, store, _ = open_engine(StorageConfig(directory, wal_shards=1))
    return engine, store


def test_a_seal_raced_by_a_delete_keeps_the_records_it_began_with(tmp_path: Path) -> None:
    """The delete was lost with its frame, so the records it took are back, byte for
    byte: the seal writes the payload it began with, not the emptied one (the one-join
    framing clipped the records to the freed buffer and wrote them empty but live, so a
    reader skipped three acknowledged records with no tombstone while count said 4)."""
    engine, store = crash_after_a_seal_raced_by_a_delete(tmp_path)
    page = engine.diff("f", 0, limit=100)
    assert [(r["$seq"], r["data"]) for r in page.records()] == [
        (1, "kept"), (2, 0), (3, 1), (4, 2),
    ]  # fmt: skip
    assert engine.get_topic("f", touch=False).count == 4
    store.close()


def test_catches_a_seal_that_writes_the_freed_payload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutation: the segment is framed from the chunk's payload at write time.
    original = seal_module.write_segment

    def late(directory: Path, chunk: Chunk, dead: bytes, fileio: FileIO, buf: bytes) -> None:
        original(directory, chunk, dead, fileio, chunk.buf)

    monkeypatch.setattr(seal_module, "write_segment", late)
    engine, store = crash_after_a_seal_raced_by_a_delete(tmp_path)
    assert [r["$seq"] for r in engine.diff("f", 0, limit=100).records()] == [1]  # 2..4 silent
    store.close()
