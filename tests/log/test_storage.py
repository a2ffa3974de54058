"""The WAL on disk: torn tails, corruption, recovery of every durability class, and a
disk that fills up (through a fault-injecting file layer)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Durability, Engine, ErrorCode, RecordIn, TagMatch, TopicError
from waymark.log.storage import frames
from waymark.log.storage.fileio import FileIO
from waymark.log.storage.frames import CorruptFrame, FrameKind
from waymark.log.storage.recovery import open_engine
from waymark.log.storage.store import Store


def reopen(data_dir: Path, **kwargs) -> tuple[Engine, Store]:
    engine, store, _ = open_engine(data_dir, **kwargs)
    return engine, store


def shut(engine: Engine, store: Store, clean: bool = True) -> None:
    if clean:
        engine.close()
    store.sync_blocking()
    store.close()


def seqs(engine: Engine, topic: str, from_seq: int = 0) -> list[int]:
    """Every seq after ``from_seq``, following pages (a page stops before a crash hole)."""
    found: list[int] = []
    while True:
        page = engine.diff(topic, from_seq, limit=10_000)
        found += [r["$seq"] for r in page.records()]
        from_seq = page.next_from_seq
        if page.caught_up:
            return found


def wal_file(data_dir: Path, engine: Engine, topic: str) -> Path:
    assert engine.journal is not None
    return engine.journal.shard_of(topic).path  # type: ignore[attr-defined]


# --- frames -----------------------------------------------------------------------------


def test_frames_round_trip_and_torn_tails(tmp_path: Path) -> None:
    data = b"".join(frames.encode(FrameKind.HEAD, b"x" * n) for n in (1, 50, 3))
    whole, end = frames.scan(data, tmp_path)
    assert [bytes(f.payload) for f in whole] == [b"x", b"x" * 50, b"xxx"] and end == len(data)
    for cut in range(1, 12):  # a final frame cut anywhere is a torn write: dropped
        got, end = frames.scan(data[:-cut], tmp_path)
        assert len(got) == 2 and end == len(data) - len(frames.encode(FrameKind.HEAD, b"xxx"))
    got, _ = frames.scan(data + bytes(100), tmp_path)  # a zero-extended tail
    assert len(got) == 3


def test_a_flipped_byte_mid_file_is_reported_with_file_and_offset(tmp_path: Path) -> None:
    first = frames.encode(FrameKind.HEAD, b"a" * 40)
    data = bytearray(first + frames.encode(FrameKind.HEAD, b"b" * 40))
    data[10] ^= 0x01
    with pytest.raises(CorruptFrame) as info:
        frames.scan(bytes(data), tmp_path / "x.wal")
    assert info.value.offset == 0 and "x.wal" in str(info.value)
    data = bytearray(first + frames.encode(FrameKind.HEAD, b"b" * 40))
    data[len(first) : len(first) + 4] = (2**31).to_bytes(4, "little")  # impossible length
    with pytest.raises(CorruptFrame) as info:
        frames.scan(bytes(data), tmp_path / "x.wal")
    assert info.value.offset == len(first)


# --- recovery ---------------------------------------------------------------------------


def test_torn_final_frame_is_dropped_silently(tmp_path: Path) -> None:
    engine, wal = reopen(tmp_path)
    for i in range(5):
        engine.append("t", [RecordIn.of(i)])
    shut(engine, wal, clean=False)
    path = wal_file(tmp_path, engine, "t")
    path.write_bytes(path.read_bytes()[:-7])  # the last append's frame, torn
    engine, wal, report = open_engine(tmp_path)
    assert report.torn_bytes > 0
    assert seqs(engine, "t") == [1, 2, 3, 4]
    # New frames follow the last whole one, and the lost seq 5 is never reused.
    assert engine.append("t", [RecordIn.of("new")]).seqs[0] > 5
    shut(engine, wal)
    engine, wal = reopen(tmp_path)
    assert seqs(engine, "t")[:4] == [1, 2, 3, 4] and len(seqs(engine, "t")) == 5
    shut(engine, wal)


def test_corruption_mid_file_refuses_to_start(tmp_path: Path) -> None:
    engine, wal = reopen(tmp_path)
    for i in range(5):
        engine.append("t", [RecordIn.of(i)])
    shut(engine, wal)
    path = wal_file(tmp_path, engine, "t")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFrame):
        open_engine(tmp_path)
    waymark = Path(sys.executable).parent / "waymark"
    result = subprocess.run([str(waymark), "serve", "--port", "0", "--data-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 2
    assert "corrupt frame at offset" in result.stderr and str(path) in result.stderr


def test_everything_recovers(tmp_path: Path) -> None:
    clock = ManualClock()
    engine, wal = reopen(tmp_path, clock=clock)
    engine.put_topic("cfg", ConfigPatch(cap_records=3, ttl_ms=60_000, priority=7))
    for i in range(5):
        engine.append("cfg", [RecordIn.of(i, tag=f"k{i % 2}", node="n", id=f"id{i}")])
    engine.delete("cfg", match=TagMatch.parse("k0"))
    engine.append("gone", [RecordIn.of(1)])
    engine.delete_topic("gone")
    engine.append("again", [RecordIn.of(1)])
    engine.delete_topic("again")
    engine.append("again", [RecordIn.of(2)])
    engine.put_topic("mem", ConfigPatch(durability=Durability.MEMORY))
    engine.append("mem", [RecordIn.of("m")])
    before = {t.name: t for t in engine.list_topics()}
    pages = {name: engine.diff(name, 0).to_json() for name in before}
    shut(engine, wal)
    engine, wal = reopen(tmp_path, clock=clock)
    # The memory topic's records recover gradually (§2.2): see test_memory_recovery.py.
    assert [t.name for t in engine.list_topics() if t.recovering] == ["mem"]
    assert engine.recovering is not None
    engine.recovering.finish_all()
    after = {t.name: t for t in engine.list_topics()}
    assert set(after) == {"cfg", "again", "mem"}
    for name in after:
        assert after[name].config == before[name].config
        assert after[name].epoch == before[name].epoch
        assert (after[name].head_seq, after[name].earliest_seq, after[name].count) == (
            before[name].head_seq, before[name].earliest_seq, before[name].count)  # fmt: skip
        assert engine.diff(name, 0).to_json() == pages[name]
    # Dedupe state survived: a repeated id answers the original seq.
    assert engine.append("cfg", [RecordIn.of(3, id="id3")]).seqs == [4]
    # Epochs keep growing across restarts.
    engine.delete_topic("again")
    assert engine.append("again", [RecordIn.of(3)]).seqs == [1]
    assert engine.get_topic("again").epoch > before["again"].epoch
    shut(engine, wal)


def test_ephemeral_records_are_lost_on_restart_but_never_silently(tmp_path: Path) -> None:
    engine, wal = reopen(tmp_path)
    engine.put_topic("e", ConfigPatch(durability=Durability.EPHEMERAL))
    for i in range(4):
        assert engine.append("e", [RecordIn.of(i)]).durability is Durability.EPHEMERAL
    shut(engine, wal)
    engine, wal = reopen(tmp_path)
    page = engine.diff("e", 2)
    assert page.records() == []
    assert page.tombstone is not None
    assert (page.tombstone.reason, page.tombstone.gap_from, page.tombstone.gap_to) == (
        "lost", 3, 4)  # fmt: skip
    assert engine.append("e", [RecordIn.of("next")]).seqs == [5]  # the head was preserved
    shut(engine, wal)


def test_a_crash_never_lets_a_seq_be_reused(tmp_path: Path) -> None:
    engine, wal = reopen(tmp_path)
    for i in range(10):
        engine.append("d", [RecordIn.of(i)])
    shut(engine, wal, clean=False)  # no exact head: only the synced ceiling is known
    engine, wal = reopen(tmp_path)
    assert seqs(engine, "d") == list(range(1, 11))
    new = engine.append("d", [RecordIn.of("after")]).seqs[0]
    assert new > 10
    page = engine.diff("d", 10)
    assert page.tombstone is not None and page.tombstone.reason == "lost"
    assert page.tombstone.gap_to == new - 1 and [r["$seq"] for r in page.records()] == [new]
    shut(engine, wal)


# --- a disk that fills up -----------------------------------------------------------------


class FullDiskInjector(FileIO):
    """Fault injector: while ``full`` is set, every WAL write fails with ENOSPC after
    writing half of what it was given (a partial write, as a real full disk does)."""

    def __init__(self) -> None:
        self.full = threading.Event()
        self.failures = 0

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.full.is_set():
            self.failures += 1
            super().write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(fd, data)


def test_a_full_disk_refuses_new_writes_loses_nothing_and_recovers(tmp_path: Path) -> None:
    disk = FullDiskInjector()
    engine, wal = reopen(tmp_path, fileio=disk)
    engine.put_topic("f", ConfigPatch(durable=True))

    async def scenario() -> None:
        first = engine.append("f", [RecordIn.of("before")])
        await first.commit.wait()  # type: ignore[union-attr]
        disk.full.set()
        pending = engine.append("f", [RecordIn.of("in flight")])
        with pytest.raises(TopicError) as info:
            await pending.commit.wait()  # type: ignore[union-attr]
        assert info.value.code is ErrorCode.STORAGE_UNAVAILABLE and info.value.status == 503
        # While the disk is full new writes are refused: nothing changes.
        with pytest.raises(TopicError) as info:
            engine.append("f", [RecordIn.of("refused")])
        assert info.value.code is ErrorCode.STORAGE_UNAVAILABLE
        state = engine.get_topic("f")  # the one in flight is handed out, not readable
        assert (state.head_seq, state.assigned_head_seq) == (1, 2)
        # Reads keep working, and show only what is durable (fsync class).
        assert [r["data"] for r in engine.diff("f", 0).records()] == ["before"]
        disk.full.clear()  # space returns
        for _ in range(200):
            await asyncio.sleep(0.01)
            if pending.commit.durable:  # type: ignore[union-attr]
                break
        resumed = engine.append("f", [RecordIn.of("after")])
        await resumed.commit.wait()  # type: ignore[union-attr]
        assert [r["data"] for r in engine.diff("f", 0).records()] == [
            "before", "in flight", "after"]  # fmt: skip

    asyncio.run(scenario())
    assert disk.failures >= 1
    shut(engine, wal)
    engine, wal = reopen(tmp_path)
    data = [r["data"] for r in engine.diff("f", 0).records()]
    assert data == ["before", "in flight", "after"]  # the partial write left no garbage
    shut(engine, wal)


def test_sink_epochs_and_publish_ledgers_survive_restarts_and_checkpoints(
    tmp_path: Path,
) -> None:
    from waymark.log.staging import PartKey

    engine, store, _ = open_engine(tmp_path)
    epoch = engine.staging.open_writer("query-1")
    part = PartKey(0, 0)
    engine.staging.stage("out", "query-1", epoch, 7, part, [RecordIn.of("a"), RecordIn.of("b")])
    first = engine.staging.publish("out", "query-1", epoch, 7, [(part, 1)])
    shut(engine, store, clean=False)  # the ledger entry is only in the WAL frame
    engine, store, _ = open_engine(tmp_path)
    again = engine.staging.publish("out", "query-1", epoch, 7, [(part, 1)])
    assert (again.first_seq, again.count, again.replayed) == (first.first_seq, 2, True)
    assert engine.staging.open_writer("query-1") == epoch + 1  # never the same epoch twice
    store.checkpoint(engine)  # now the WAL frame is trimmed: the catalog carries both
    shut(engine, store, clean=False)
    engine, store, _ = open_engine(tmp_path)
    assert engine.staging.publish("out", "query-1", epoch + 1, 7, [(part, 1)]).replayed
    with pytest.raises(TopicError) as info:
        engine.staging.publish("out", "query-1", epoch, 8, [(part, 1)])
    assert info.value.code is ErrorCode.FENCED
    assert [r["data"] for r in engine.diff("out", 0).records()] == ["a", "b"]
    shut(engine, store)


def test_fsync_readers_see_only_durable_records(tmp_path: Path) -> None:
    """A reader must never act on a record a crash could take back."""
    disk = FullDiskInjector()
    engine, store, _ = open_engine(tmp_path, fileio=disk)
    engine.put_topic("f", ConfigPatch(durable=True))
    engine.put_topic("d", ConfigPatch(durable=False))

    async def scenario() -> None:
        await engine.append("f", [RecordIn.of(1)]).commit.wait()  # type: ignore[union-attr]
        disk.full.set()  # nothing reaches the disk for now
        pending = engine.append("f", [RecordIn.of(2)])
        engine.append("d", [RecordIn.of(2)])
        page = engine.diff("f", 0)
        assert [r["data"] for r in page.records()] == [1]
        assert page.head_seq == 1 and page.caught_up
        assert len(engine.diff("d", 0).records()) == 1  # disk: readable at once
        disk.full.clear()
        with contextlib.suppress(TopicError):
            await pending.commit.wait()  # type: ignore[union-attr]
        for _ in range(200):
            if pending.commit.durable:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.01)
        assert [r["data"] for r in engine.diff("f", 0).records()] == [1, 2]

    asyncio.run(scenario())
    shut(engine, store)


def test_an_fsync_topic_reports_no_loss_after_a_crash(tmp_path: Path) -> None:
    engine, store = reopen(tmp_path)
    engine.put_topic("f", ConfigPatch(durable=True))
    for i in range(5):
        engine.append("f", [RecordIn.of(i)])
    shut(engine, store, clean=False)
    engine, store = reopen(tmp_path)
    new = engine.append("f", [RecordIn.of("after")]).seqs[0]
    assert new > 5  # never reused...
    store.sync_blocking()  # (fsync: readable once durable)
    records, tombstones = [], []
    cursor = 0
    while True:
        page = engine.diff("f", cursor)
        records += page.records()
        tombstones += [page.tombstone] if page.tombstone else []
        cursor = page.next_from_seq
        if page.caught_up:
            break
    assert tombstones == [] and [r["$seq"] for r in records] == [1, 2, 3, 4, 5, new]  # ...silent
    shut(engine, store)


def test_an_ephemeral_topic_never_reuses_seqs_after_a_crash(tmp_path: Path) -> None:
    engine, store = reopen(tmp_path)
    engine.put_topic("e", ConfigPatch(durability=Durability.EPHEMERAL))
    for i in range(5):
        engine.append("e", [RecordIn.of(i)])
    shut(engine, store, clean=False)
    engine, store = reopen(tmp_path)
    assert engine.append("e", [RecordIn.of("after")]).seqs[0] > 5
    page = engine.diff("e", 3)
    assert page.tombstone is not None and page.tombstone.reason == "lost"
    shut(engine, store)


def test_a_write_only_fsync_topic_does_not_accumulate_sync_bookkeeping(tmp_path: Path) -> None:
    engine, store = reopen(tmp_path)
    engine.put_topic("f", ConfigPatch(durable=True))
    for i in range(200):
        engine.append("f", [RecordIn.of(i)])
        if i % 50 == 49:
            store.sync_blocking()
    store.sync_blocking()
    engine.append("f", [RecordIn.of("last")])
    # Nobody read the topic: only the appends still waiting for their sync are remembered.
    assert len(engine._topics["f"].unsynced) <= 1
    shut(engine, store)
