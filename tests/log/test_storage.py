"""The WAL on disk: torn tails, corruption, recovery of every durability class, and a
disk that fills up (through a fault-injecting file layer)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Durability, Engine, ErrorCode, RecordIn, TagMatch, TopicError
from waymark.log.config import StorageConfig
from waymark.log.storage import frames
from waymark.log.storage.fileio import FileIO
from waymark.log.storage.frames import CorruptFrame, FrameKind
from waymark.log.storage.restore import open_engine
from waymark.log.storage.store import Store
from waymark.log.storage.wal import Wal, WalCommit
from waymark.protocol import TopicType


def reopen(data_dir: Path, wal_shards: int = 2, **kwargs) -> tuple[Engine, Store]:
    engine, store, _ = open_engine(StorageConfig(data_dir, wal_shards=wal_shards), **kwargs)
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
    engine, wal, report = open_engine(StorageConfig(tmp_path))
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
        open_engine(StorageConfig(tmp_path))
    waymark = Path(sys.executable).parent / "waymark"
    result = subprocess.run([str(waymark), "serve", "--port", "0", "--data-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 3  # damaged data (docs/cli.md, "Exit codes")
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
    # The memory topic's records recover gradually (docs/semantics/topics.md §2.2): see
    # test_memory_recovery.py.
    assert [t.name for t in engine.list_topics() if t.recovering] == ["mem"]
    assert engine.replaying is not None
    engine.replaying.finish_all()
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
    engine, wal = reopen(tmp_path, clock=ManualClock())  # a burst: the ceiling leads
    for i in range(12):
        engine.append("d", [RecordIn.of(i)])
    assert engine.kernel.existing("d").ceiling > 12
    shut(engine, wal, clean=False)  # no exact head: only the synced ceiling is known
    engine, wal = reopen(tmp_path)
    assert seqs(engine, "d") == list(range(1, 13))
    new = engine.append("d", [RecordIn.of("after")]).seqs[0]
    assert new > 13
    page = engine.diff("d", 12)
    assert page.tombstone is not None and page.tombstone.reason == "lost"
    assert page.tombstone.gap_to == new - 1 and [r["$seq"] for r in page.records()] == [new]
    # What may have been lost is bounded by what the burst handed out, not a fixed block.
    assert page.tombstone.gap_to - page.tombstone.gap_from + 1 <= 12
    shut(engine, wal)


def test_a_crash_while_idle_reports_nothing_lost(tmp_path: Path) -> None:
    engine, wal = reopen(tmp_path, clock=ManualClock())
    for i in range(12):
        engine.append("d", [RecordIn.of(i)])
    assert engine.trim_ceilings() == 0  # written since the previous pass: not idle yet
    assert engine.trim_ceilings() == 1  # nothing handed out since: its ceiling is its head
    shut(engine, wal, clean=False)
    engine, wal = reopen(tmp_path)
    new = engine.append("d", [RecordIn.of("after")])
    assert new.seqs == [13] and new.must_sync  # above the durable ceiling: the ack waits
    assert seqs(engine, "d") == list(range(1, 14))
    assert engine.diff("d", 0, limit=100).tombstone is None
    shut(engine, wal)


class UnsyncedWritesLost(FileIO):
    """Fault injector: a disk whose writes reach the file only at fdatasync, while
    ``hold`` keeps every sync waiting. :meth:`crash` then drops what was never synced,
    as a power cut does, and lets the WAL threads end."""

    def __init__(self) -> None:
        self.pending: dict[int, list[bytes]] = {}
        self.released = threading.Event()
        self.released.set()
        self.crashed = False

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self.pending.setdefault(fd, []).append(bytes(data))
        return len(data)

    def fdatasync(self, fd: int) -> None:
        self.released.wait()
        for data in self.pending.pop(fd, []):
            if not self.crashed:
                super().write(fd, data)
        super().fdatasync(fd)

    def hold(self) -> None:
        self.released.clear()

    def crash(self) -> None:
        self.crashed = True
        self.released.set()


def test_acknowledged_records_lost_in_a_crash_read_as_a_bounded_gap(tmp_path: Path) -> None:
    disk = UnsyncedWritesLost()
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=ManualClock(), fileio=disk)

    async def acked(data: int) -> int:
        result = engine.append("d", [RecordIn.of(data)])
        if result.must_sync:
            await result.commit.wait()  # type: ignore[union-attr]
        return result.seqs[0]

    async def scenario() -> int:
        for i in range(1, 9):  # a burst: the durable ceiling leads the head
            assert await acked(i) == i
        ceiling = engine.kernel.existing("d").ceiling
        assert 8 < ceiling <= 16  # it leads, by no more than the burst handed out
        await asyncio.to_thread(store.sync_blocking)  # 1..8 are on disk
        disk.hold()  # nothing reaches the disk from now on
        # Acknowledged at once (under the durable ceiling) and readable: then lost.
        for i in range(9, ceiling + 1):
            result = engine.append("d", [RecordIn.of(i)])
            assert not result.must_sync and result.seqs == [i]
        assert [r["$seq"] for r in engine.diff("d", 0, limit=100).records()][-1] == ceiling
        # Above it: not acknowledged until the new ceiling is durable.
        beyond = engine.append("d", [RecordIn.of(0)])
        assert beyond.must_sync and beyond.seqs == [ceiling + 1]
        return ceiling

    ceiling = asyncio.run(scenario())
    disk.crash()
    store.close()
    engine, store, _ = open_engine(StorageConfig(tmp_path))
    assert seqs(engine, "d", 0)[:8] == list(range(1, 9))
    page = engine.diff("d", 8)
    # The acknowledged 9..ceiling are gone and reported; the seq above the ceiling,
    # never acknowledged, is handed out again.
    assert page.tombstone is not None and page.tombstone.reason == "lost"
    assert (page.tombstone.gap_from, page.tombstone.gap_to) == (9, ceiling)
    assert engine.append("d", [RecordIn.of("next")]).seqs == [ceiling + 1]
    shut(engine, store)


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
    engine, store = reopen(tmp_path, fileio=disk)
    engine.put_topic("f", ConfigPatch(durable=True))

    async def scenario() -> None:
        first = engine.append("f", [RecordIn.of("before")])
        await first.commit.wait()  # type: ignore[union-attr]
        disk.full.set()
        pending = engine.append("f", [RecordIn.of("in flight")])
        # Taken before the disk refused it: never refused, it waits until stored.
        waiting = asyncio.ensure_future(pending.commit.wait())  # type: ignore[union-attr]
        shard = store.wal.shard_of("f")
        for _ in range(500):
            if shard.error is not None:
                break
            await asyncio.sleep(0.01)
        assert shard.error is not None and not waiting.done()
        # While the disk is full new writes are refused: nothing changes.
        with pytest.raises(TopicError) as info:
            engine.append("f", [RecordIn.of("refused")])
        assert info.value.code is ErrorCode.STORAGE_UNAVAILABLE and info.value.status == 503
        state = engine.get_topic("f")  # the one in flight is handed out, not readable
        assert (state.head_seq, state.assigned_head_seq) == (1, 2)
        # Reads keep working, and show only what is durable (fsync class).
        assert [r["data"] for r in engine.diff("f", 0).records()] == ["before"]
        assert not waiting.done()
        disk.full.clear()  # space returns: the retry stores it, and it is acknowledged
        await asyncio.wait_for(waiting, 30)
        resumed = engine.append("f", [RecordIn.of("after")])
        await resumed.commit.wait()  # type: ignore[union-attr]
        assert [r["data"] for r in engine.diff("f", 0).records()] == [
            "before", "in flight", "after"]  # fmt: skip

    asyncio.run(scenario())
    assert disk.failures >= 1
    shut(engine, store)
    engine, store = reopen(tmp_path)
    data = [r["data"] for r in engine.diff("f", 0).records()]
    assert data == ["before", "in flight", "after"]  # the partial write left no garbage
    shut(engine, store)


class FailedSyncInjector(FileIO):
    """Fault injector: the next ``fdatasync`` fails with EIO once ``fail`` is set, after
    the write before it landed (what the written bytes hold then is unknown)."""

    def __init__(self) -> None:
        self.fail = threading.Event()

    def fdatasync(self, fd: int) -> None:
        if self.fail.is_set():
            self.fail.clear()
            raise OSError(errno.EIO, "Input/output error")
        super().fdatasync(fd)


def test_a_failed_sync_is_retried_without_writing_its_frames_twice(tmp_path: Path) -> None:
    disk = FailedSyncInjector()
    engine, store = reopen(tmp_path, fileio=disk)
    engine.put_topic("d", ConfigPatch(durability=Durability.DISK))
    store.sync_blocking()
    disk.fail.set()
    engine.append("d", [RecordIn.of(i) for i in range(3)])
    deadline = time.monotonic() + 30
    while True:
        try:
            store.sync_blocking()  # raises while the shard's last round failed
            break
        except TopicError:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert not disk.fail.is_set()  # it did fail once
    shut(engine, store, clean=False)
    engine, store = reopen(tmp_path)
    assert [r["data"] for r in engine.diff("d", 0).records()] == [0, 1, 2]
    assert engine.get_topic("d").count == 3
    shut(engine, store)


def wait_for_sync(store: Store) -> None:
    """Wait until every frame taken so far is stored (the shard retries a failed round)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            store.sync_blocking()  # raises while the shard's last round failed
            return
        except TopicError:
            assert time.monotonic() < deadline, "the WAL never stored its frames"
            time.sleep(0.01)


def fills_after_first_frame(
    wal: Wal, disk: FullDiskInjector, name: str
) -> Callable[[str, bytes | list[bytes]], WalCommit]:
    """``wal.write`` that fills the disk once ``name``'s first frame is queued, and
    returns when the shard has met the full disk and refuses."""
    write = wal.write

    def fills(topic: str, frame: bytes | list[bytes]) -> WalCommit:
        commit = write(topic, frame)
        if topic == name and not disk.full.is_set():
            disk.full.set()
            shard = wal.shard_of(topic)
            deadline = time.monotonic() + 30
            while shard.error is None:  # the writer met the full disk: the shard refuses
                assert time.monotonic() < deadline
                time.sleep(0.001)
        return commit

    return fills


def test_a_disk_that_fills_mid_append_leaves_what_the_client_was_told(tmp_path: Path) -> None:
    """The disk fills between the first frame of a topic-creating append (its TOPIC
    frame) and its records frame: the shard starts refusing after the check that
    admitted the append. Whatever the client is told, memory and replay agree with it:
    a 503 leaves no topic behind (no create frame that replay would apply), an ack a
    topic with its record (docs/durability.md, "Full disk")."""
    disk = FullDiskInjector()
    engine, store = reopen(tmp_path, fileio=disk)
    wal = store.wal
    write = wal.write
    wal.write = fills_after_first_frame(wal, disk, "new")  # type: ignore[method-assign]
    try:
        result = engine.append("new", [RecordIn.of("x")], create=True)
        told = "acked"
    except TopicError as error:
        assert error.code is ErrorCode.STORAGE_UNAVAILABLE and error.status == 503
        told = "refused"
    wal.write = write  # type: ignore[method-assign]
    disk.full.clear()
    wait_for_sync(store)

    def check(engine: Engine) -> None:
        if told == "refused":
            with pytest.raises(TopicError) as info:
                engine.get_topic("new")
            assert info.value.code is ErrorCode.TOPIC_NOT_FOUND, "a refused write made a topic"
        else:
            assert [r["data"] for r in engine.diff("new", 0).records()] == ["x"]

    check(engine)
    shut(engine, store, clean=False)
    engine, store = reopen(tmp_path)
    check(engine)  # replay agrees with what the client was told
    shut(engine, store)
    # The shard had admitted the append before the disk refused: it takes it whole.
    assert told == "acked" and result.seqs == [1]


def test_a_disk_that_fills_mid_queue_creation_leaves_what_the_client_was_told(
    tmp_path: Path,
) -> None:
    """A queue's creation journals the queue, then its leases log: the disk fills
    between the two. As for an append: a 503 leaves no queue behind, in memory or after
    a restart; an answer of created leaves both (docs/durability.md, "Full disk")."""
    disk = FullDiskInjector()
    engine, store = reopen(tmp_path, wal_shards=1, fileio=disk)  # both on one shard
    wal = store.wal
    write = wal.write
    wal.write = fills_after_first_frame(wal, disk, "q")  # type: ignore[method-assign]
    try:
        engine.put_topic("q", ConfigPatch(), TopicType.QUEUE)
        told = "created"
    except TopicError as error:
        assert error.code is ErrorCode.STORAGE_UNAVAILABLE and error.status == 503
        told = "refused"
    wal.write = write  # type: ignore[method-assign]
    disk.full.clear()
    wait_for_sync(store)

    def check(engine: Engine) -> None:
        if told == "refused":
            with pytest.raises(TopicError) as info:
                engine.get_topic("q")
            assert info.value.code is ErrorCode.TOPIC_NOT_FOUND, "a refused create made a queue"
        else:
            assert engine.get_topic("q").type is TopicType.QUEUE
            engine.append("q", [RecordIn.of("job")])
            (job,) = engine.claim("q", "worker", 5)
            assert b'"data":"job"' in job.record

    check(engine)
    shut(engine, store, clean=False)
    engine, store = reopen(tmp_path, wal_shards=1)
    check(engine)  # replay agrees with what the client was told
    shut(engine, store)
    assert told == "created"  # admitted before the disk refused: taken whole


class FailedTruncateInjector(FailedSyncInjector):
    """Fault injector: once ``fail`` is set, the next WAL round fails — its fdatasync
    (EIO, after the write landed) or, ``partial``, its write (ENOSPC after writing half,
    as a full disk does) — and cutting the file back fails too (EIO), ``truncates``
    times; every refused cut after the first waits for ``go``, so a test can look at
    the shard while no cut has succeeded."""

    def __init__(self, truncates: int, partial: bool) -> None:
        super().__init__()
        self.truncates = truncates
        self.partial = partial
        self.refused = threading.Event()  # set at the first refused truncate
        self.go = threading.Event()

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.partial and self.fail.is_set():
            self.fail.clear()
            super().write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(fd, data)

    def fdatasync(self, fd: int) -> None:
        if not self.partial:
            super().fdatasync(fd)
        else:
            FileIO.fdatasync(self, fd)

    def truncate(self, fd: int, size: int) -> None:
        if self.truncates:
            if self.refused.is_set():
                self.go.wait()
            self.truncates -= 1
            self.refused.set()
            raise OSError(errno.EIO, "Input/output error")
        super().truncate(fd, size)


@pytest.mark.parametrize("partial", [False, True], ids=["failed-sync", "partial-write"])
def test_a_failed_cut_after_a_failed_round_never_writes_after_its_bytes(
    tmp_path: Path, partial: bool
) -> None:
    """A round's write or fdatasync failed, and cutting the file back failed too: the
    bytes of the failed round (whole frames, or half of one) are still there. The shard refuses new
    writes until a cut succeeds, and only then writes the frames again: replay finds each
    record once (docs/durability.md, "Full disk")."""
    disk = FailedTruncateInjector(truncates=2, partial=partial)
    engine, store = reopen(tmp_path, fileio=disk)
    engine.put_topic("d", ConfigPatch(durability=Durability.DISK))
    store.sync_blocking()
    disk.fail.set()
    try:
        engine.append("d", [RecordIn.of(i) for i in range(3)])
        assert disk.refused.wait(30)  # the round failed, then the cut
        shard = store.wal.shard_of("d")
        deadline = time.monotonic() + 30
        while shard.error is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        with pytest.raises(TopicError) as info:  # no cut has succeeded: nothing new is taken
            engine.append("d", [RecordIn.of("refused")])
        assert info.value.code is ErrorCode.STORAGE_UNAVAILABLE
    finally:
        disk.go.set()  # the retry's cut is refused once more, then succeeds
    wait_for_sync(store)
    engine.append("d", [RecordIn.of("after")])
    shut(engine, store, clean=False)
    engine, store = reopen(tmp_path)
    assert [r["data"] for r in engine.diff("d", 0).records()] == [0, 1, 2, "after"]
    assert engine.get_topic("d").count == 4
    shut(engine, store)
    assert not disk.fail.is_set() and disk.truncates == 0  # every fault did happen


class ClockThatBreaks(ManualClock):
    """Fault injector: once ``broken``, reading the time raises (a bug in the writer
    thread's round, after its sync)."""

    broken = False

    def now_ms(self) -> int:
        if self.broken:
            raise RuntimeError("injected: the writer's clock fails")
        return super().now_ms()


class BreaksTheClockOnSync(FileIO):
    """Fault injector: once ``armed``, a round's ``fdatasync`` succeeds and then breaks
    the writer's clock: its frames are durable, the thread dies before it says so."""

    def __init__(self, clock: ClockThatBreaks) -> None:
        self.clock = clock
        self.armed = False

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        if self.armed:
            self.clock.broken = True


def test_a_writer_that_fails_after_its_sync_answers_its_frames_stored_and_refuses_the_rest(
    tmp_path: Path,
) -> None:
    """A writer thread that dies on a bug once its round is synced: those frames are
    durable and come back after a restart, so their waiters are answered as stored, not
    503; a later frame of an admitted mutation is refused; new ones are refused at once
    (docs/durability.md, "A failed WAL writer")."""
    clock = ClockThatBreaks()
    disk = BreaksTheClockOnSync(clock)
    wal = Wal(tmp_path, shards=1, fileio=disk, clock=clock)
    shard = wal.shards[0]
    frame = [frames.encode(FrameKind.HEAD, b"%d" % n) for n in range(3)]

    async def scenario() -> None:
        await wal.write("t", frame[0]).wait()
        disk.armed = True
        with wal.admit("t"):
            synced = wal.write("t", frame[1])
            await asyncio.wait_for(synced.wait(), 10)  # stored: answered so
            assert shard.failure is not None
            later = wal.write("t", frame[2])  # admitted before the failure: taken
        with pytest.raises(TopicError) as refused:
            await asyncio.wait_for(later.wait(), 10)
        assert refused.value.code is ErrorCode.STORAGE_UNAVAILABLE
        with pytest.raises(TopicError) as new:
            wal.check_available("t")
        assert new.value.code is ErrorCode.STORAGE_UNAVAILABLE
        assert wal.writer_failures() == 1

    asyncio.run(scenario())
    wal.close()
    stored = [bytes(f.payload) for _, _, found, _ in Wal.existing_frames(tmp_path) for f in found]
    assert stored == [b"0", b"1"]


class BrokenRoundUncut(FileIO):
    """Fault injector: once ``armed``, a round's ``fdatasync`` raises a RuntimeError (a
    bug) and cutting the file back fails too (EIO)."""

    armed = False

    def fdatasync(self, fd: int) -> None:
        if self.armed:
            raise RuntimeError("injected: the writer's round fails")
        super().fdatasync(fd)

    def truncate(self, fd: int, size: int) -> None:
        if self.armed:
            raise OSError(errno.EIO, "Input/output error")
        super().truncate(fd, size)


def test_a_failed_writer_that_cannot_cut_answers_no_written_frame_and_refuses_the_rest(
    tmp_path: Path,
) -> None:
    """The round's bytes stay in the file (the cut failed), so the restart may replay
    them: their writes are not refused, nor answered stored; they wait, as after a
    timeout ("not known"). A frame the writer never took is refused all the same
    (docs/durability.md, "A failed WAL writer")."""
    disk = BrokenRoundUncut()
    wal = Wal(tmp_path, shards=1, fileio=disk)
    shard = wal.shards[0]
    frame = [frames.encode(FrameKind.HEAD, b"%d" % n) for n in range(3)]

    async def scenario() -> None:
        await wal.write("t", frame[0]).wait()
        disk.armed = True
        with wal.admit("t"):
            taken = wal.write("t", frame[1])
            waiting = asyncio.ensure_future(taken.wait())
            await asyncio.to_thread(shard._thread.join, 10)  # noqa: SLF001 -- failed, done
            assert shard.failure is not None
            later = wal.write("t", frame[2])
        with pytest.raises(TopicError) as refused:
            await later.wait()
        assert refused.value.code is ErrorCode.STORAGE_UNAVAILABLE
        late = asyncio.ensure_future(taken.wait())  # a waiter that comes after the failure
        for _ in range(3):  # every answer the writer sent has run
            await asyncio.sleep(0)
        assert not waiting.done() and not late.done()
        waiting.cancel()
        late.cancel()

    asyncio.run(scenario())
    wal.close()


def test_sink_epochs_and_publish_ledgers_survive_restarts_and_seals(
    tmp_path: Path,
) -> None:
    from waymark.log.writers import PartKey

    engine, store, _ = open_engine(StorageConfig(tmp_path))
    epoch = engine.writers.open_writer("query-1")
    part = PartKey(0, 0)
    engine.writers.stage("out", "query-1", epoch, 7, part, [RecordIn.of("a"), RecordIn.of("b")])
    first = engine.writers.publish("out", "query-1", epoch, 7, [(part, 1)])
    shut(engine, store, clean=False)  # the ledger entry is only in the WAL frame
    engine, store, _ = open_engine(StorageConfig(tmp_path))
    again = engine.writers.publish("out", "query-1", epoch, 7, [(part, 1)])
    assert (again.first_seq, again.count, again.replayed) == (first.first_seq, 2, True)
    assert engine.writers.open_writer("query-1") == epoch + 1  # never the same epoch twice
    store.seal(engine)  # now the WAL frame is trimmed: the catalog carries both
    shut(engine, store, clean=False)
    engine, store, _ = open_engine(StorageConfig(tmp_path))
    assert engine.writers.publish("out", "query-1", epoch + 1, 7, [(part, 1)]).replayed
    with pytest.raises(TopicError) as info:
        engine.writers.publish("out", "query-1", epoch, 8, [(part, 1)])
    assert info.value.code is ErrorCode.FENCED
    assert [r["data"] for r in engine.diff("out", 0).records()] == ["a", "b"]
    shut(engine, store)


def test_fsync_readers_see_only_durable_records(tmp_path: Path) -> None:
    """A reader must never act on a record a crash could take back."""
    disk = FullDiskInjector()
    engine, store, _ = open_engine(StorageConfig(tmp_path), fileio=disk)
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


def test_an_fsync_topic_crashed_twice_before_a_seal_reports_no_loss(tmp_path: Path) -> None:
    """The first restart moves past the ceiling's lead silently and journals it: the
    second meets records above the skipped seqs and must not take them for lost."""
    clock = ManualClock()  # (the lead follows the append rate: a still clock makes it long)
    engine, store = reopen(tmp_path, clock=clock)
    engine.put_topic("f", ConfigPatch(durable=True))
    for i in range(5):
        engine.append("f", [RecordIn.of(i)])
    shut(engine, store, clean=False)
    engine, store = reopen(tmp_path, clock=clock)
    moved = engine.append("f", [RecordIn.of(5)]).seqs[0]
    assert moved > 6  # past a lead
    shut(engine, store, clean=False)
    engine, store = reopen(tmp_path, clock=clock)
    page = engine.diff("f", 0)
    assert page.tombstone is None and page.caught_up
    assert [(r["$seq"], r["data"]) for r in page.records()] == [
        (1, 0), (2, 1), (3, 2), (4, 3), (5, 4), (moved, 5)]  # fmt: skip
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
    assert len(engine.kernel.existing("f").unsynced) <= 1
    shut(engine, store)


# --- ephemeral topics skip the WAL for records and their deletions ----------------------------


class SyncGate(FileIO):
    """Fault injector: while ``held`` is set, every fdatasync of the WAL waits for it to
    clear — a disk that takes as long as the test says to make anything durable."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.released = threading.Event()
        self.released.set()

    def hold(self) -> None:
        self.released.clear()
        self.held.set()

    def release(self) -> None:
        self.held.clear()
        self.released.set()

    def fdatasync(self, fd: int) -> None:
        self.released.wait()
        super().fdatasync(fd)


def test_an_ephemeral_delete_writes_no_wal_frame_and_waits_for_no_sync(tmp_path: Path) -> None:
    import httpx

    from waymark.server import App

    gate = SyncGate()
    engine, store, _ = open_engine(
        StorageConfig(tmp_path, wal_shards=1), fileio=gate
    )  # every topic, one shard
    wal = store.wal

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=App(engine=engine, store=store))
        async with httpx.AsyncClient(transport=transport, base_url="http://waymark") as http:
            put = await http.put("/v0/topics/e", json={"durability": "ephemeral"})
            assert put.status_code == 201
            for tag in ("a", "b", "a", "b"):
                await http.post("/v0/topics/e/records", json={"records": [{"data": 1, "tag": tag}]})
            await http.put("/v0/topics/d", json={"durability": "disk"})
            gate.hold()  # from now on nothing becomes durable, and the shard has frames
            engine.append("d", [RecordIn.of(1)])  # waiting for their sync, as under load
            frames_before = wal.submitted()
            delete = http.post("/v0/topics/e/delete", json={"match": "a"})
            response = await asyncio.wait_for(delete, 10)
            assert response.status_code == 200 and response.json()["deleted"] == 2
            # No Delete frame; at most the seq ceiling that covers the deletion's own seq
            # (best effort, as an ephemeral append's), which nothing waits for.
            assert wal.submitted() <= frames_before + 1, "an ephemeral delete reached the WAL"
            frames_before = wal.submitted()
            assert [r["data"] for r in engine.diff("e", 0).records()] == [1, 1]
            # The injector does hold syncs: a disk topic's delete still waits for its frame.
            disk_delete = asyncio.ensure_future(http.post("/v0/topics/d/delete",
                                                          json={"before_seq": 2}))  # fmt: skip
            for _ in range(50):  # every step the in-process request can take without a sync
                await asyncio.sleep(0)
            # its Delete frame, after the ceiling covering its own seq if that needed one
            assert not disk_delete.done() and wal.submitted() - frames_before in (1, 2)
            gate.release()
            assert (await disk_delete).status_code == 200
            # A queue's acks are deletions too: an ephemeral queue's never reach the WAL.
            frames_before = wal.submitted()
            engine.delete_seqs("e", [2])
            assert wal.submitted() == frames_before

    try:
        asyncio.run(scenario())
    finally:
        gate.release()
    shut(engine, store)


def test_no_ack_under_a_seq_ceiling_before_it_is_durable(tmp_path: Path) -> None:
    """A disk append is acknowledged at once only under a ceiling already synced: one
    that a raise just wrote could still be lost with it, and its seqs handed out again."""
    gate = SyncGate()
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=ManualClock(), fileio=gate)
    engine.put_topic("d", ConfigPatch(durability=Durability.DISK))
    store.sync_blocking()
    try:
        gate.hold()
        raised = engine.append("d", [RecordIn.of(1), RecordIn.of(2)])
        assert raised.must_sync and engine.kernel.existing("d").ceiling > 3  # it leads the head
        under = engine.append("d", [RecordIn.of(3)])  # under the ceiling, not yet synced
        assert under.must_sync
        gate.release()
        store.sync_blocking()
        assert not engine.append("d", [RecordIn.of(4)]).must_sync  # under a synced one
    finally:
        gate.release()
    shut(engine, store)


# --- ephemeral restarts, from every reader's point of view ------------------------------------

EPHEMERAL_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4), st.sampled_from(["a", "b", None])),
        st.tuples(st.just("delete_below"), st.integers(0, 30), st.none()),
        st.tuples(st.just("delete_tag"), st.just(0), st.sampled_from(["a", "b"])),
        st.tuples(st.just("cap"), st.integers(0, 6), st.none()),
    ),
    max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=EPHEMERAL_OPS, restart=st.sampled_from(["sigterm", "seal_then_kill", "kill"]))
# A deleted record past the last live one: one hole over both told the reader between them
# of a loss that never happened.
@example(ops=[("append", 1, "a"), ("append", 1, "b"), ("delete_tag", 0, "b")], restart="sigterm")
@example(ops=[("append", 3, "a"), ("append", 2, "b"), ("delete_tag", 0, "b"), ("append", 1, "a")],
         restart="seal_then_kill")  # fmt: skip
# A reader below a cap eviction: its tombstone runs to the earliest seq, past the hole.
@example(ops=[("append", 1, "a"), ("cap", 2, None), ("append", 1, "b"), ("append", 1, "a"),
              ("delete_tag", 0, "a")], restart="sigterm")  # fmt: skip
def test_an_ephemeral_restart_tells_each_reader_of_exactly_its_loss(
    ops: list[tuple[str, int, str | None]], restart: str
) -> None:
    """After any restart an ephemeral topic is empty with its head kept. A reader at any
    cursor is told (a tombstone) of every record that was live past it, and, when the
    restart knew the topic (a seal), of nothing else: deletions stay silent."""
    status: dict[int, str] = {}  # seq -> live | deleted | cap
    tags: dict[int, str | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        engine, store = reopen(Path(tmp), clock=ManualClock())
        engine.put_topic("e", ConfigPatch(durability=Durability.EPHEMERAL))
        for op, n, tag in ops:
            live = [s for s in sorted(status) if status[s] == "live"]
            if op == "append":
                seqs = engine.append("e", [RecordIn.of(0, tag=tag)] * n).seqs
                status.update(dict.fromkeys(seqs, "live"))
                tags.update(dict.fromkeys(seqs, tag))
            elif op == "delete_below":
                engine.delete("e", before_seq=n)
                status.update(dict.fromkeys((s for s in live if s < n), "deleted"))
            elif op == "delete_tag":
                engine.delete("e", match=TagMatch.parse(tag))
                status.update(dict.fromkeys((s for s in live if tags[s] == tag), "deleted"))
            else:
                engine.put_topic("e", ConfigPatch(cap_records=n))
            live = [s for s in sorted(status) if status[s] == "live"]
            cap = engine.get_topic("e").config.cap_records
            if cap and len(live) > cap:
                status.update(dict.fromkeys(live[: len(live) - cap], "cap"))
        head = engine.get_topic("e").head_seq
        if restart == "sigterm":  # what waymark serve does on SIGTERM
            engine.close()
        if restart != "kill":
            store.seal(engine)
        store.sync_blocking()
        store.close()
        engine, store = reopen(Path(tmp))
        state = engine.get_topic("e")
        assert state.count == 0 and state.head_seq >= head
        exact = restart != "kill"  # the catalog knew the topic's front and floors
        if restart == "sigterm":
            assert state.head_seq == head  # exact heads: no lead
        # Seqs above the old head are the ceiling's lead, left by a kill: never more than
        # the topic handed out (it was never idle here).
        lead = set(range(head + 1, state.head_seq + 1))
        assert len(lead) <= head
        for cursor in range(head + 1):
            told: set[int] = set()
            page = engine.diff("e", cursor)
            for _ in range(10):
                assert page.records() == []
                if page.tombstone is not None:
                    told.update(range(page.tombstone.gap_from, page.tombstone.gap_to + 1))
                if page.caught_up:
                    break
                page = engine.diff("e", page.next_from_seq)
            assert page.caught_up
            gone = {s for s, st_ in status.items() if s > cursor and st_ in ("live", "cap")}
            assert gone <= told, f"reader at {cursor} not told of {sorted(gone - told)}"
            evicted = max((s for s, st_ in status.items() if st_ == "cap"), default=0)
            if exact and cursor >= evicted:
                # A reader below a cap eviction gets the eviction tombstone, which runs to
                # the earliest seq (docs/semantics/topics.md §5); past it, a reader is told
                # of exactly what it lost: deleted records stay silent.
                false = {s for s in told - lead - gone if s > cursor}
                assert not false, f"reader at {cursor} told of losses that never happened: {false}"
        assert engine.append("e", [RecordIn.of("next")]).seqs == [state.head_seq + 1]
        shut(engine, store)


def test_a_crash_between_a_seals_trim_and_the_wal_rotation_loses_nothing(
    tmp_path: Path,
) -> None:
    """A seal trims the WAL files before its start while the writer thread may not
    have opened the new one yet: a SIGKILL then leaves a shard directory with no file
    at all. The restart must write at or after the catalog's start, or the next
    restart takes its file for a seal's leftover and deletes acknowledged frames (found
    by tests/recovery/test_kills.py: acked records and their changes gone)."""
    engine, store = reopen(tmp_path, wal_shards=1)
    engine.put_topic("t", ConfigPatch(durability=Durability.FSYNC))
    for round_ in range(3):  # every seal rotates: the catalog's start moves up
        engine.append("t", [RecordIn.of(round_)])
        store.sync_blocking()
        store.seal(engine)
    shut(engine, store, clean=False)
    (shard,) = (tmp_path / "wal").iterdir()
    for path in shard.iterdir():  # the state the SIGKILL left: no WAL file yet
        path.unlink()
    engine, store = reopen(tmp_path, wal_shards=1)
    acked = engine.append("t", [RecordIn.of("acked")]).seqs
    store.sync_blocking()
    shut(engine, store, clean=False)  # a crash: the record is in the WAL only
    engine, store = reopen(tmp_path, wal_shards=1)
    assert seqs(engine, "t") == [1, 2, 3, *acked]
    shut(engine, store)
