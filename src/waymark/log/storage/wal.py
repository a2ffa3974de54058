"""The write-ahead log: sharded by topic, one writer thread per shard, group commit.

The engine thread hands a shard whole frames (:meth:`Wal.write`) and gets back a
:class:`WalCommit`. The shard's writer takes everything queued since its last
round, writes it with one ``write`` and makes it durable with one
``fdatasync`` — the group commit that makes many small durable writes cheap.

If the disk refuses a write (ENOSPC, EIO), the shard keeps the frames it already
accepted, cuts the file back to its last synced size and retries them with backoff;
meanwhile it reports itself unavailable so the engine refuses new mutations with
503 instead of accepting what it cannot store. A frame it accepted is never refused
afterwards: its waiters wait until it is stored, since it will be, and a write
answered 503 must never become readable (docs/durability.md, "Full disk"). A mutation
of several frames is admitted once, before its first (:meth:`Wal.admit`): its frames
are then all taken, or, refused, it wrote none.

A writer thread that fails on anything else (a bug, a fault no retry can fix) fails
closed: what it had synced is answered as stored, the file is cut back to its last
good sync, every frame still unsynced is answered 503 and the shard refuses writes
until the server restarts (docs/durability.md, "A failed WAL writer").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import zlib
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

from ...clock import Clock, SystemClock
from ..errors import ErrorCode, TopicError
from .fileio import FileIO
from .frames import Frame, scan

log = logging.getLogger(__name__)

WAL_SUFFIX = ".wal"
_ROTATE = b""  # queued like a frame: the writer moves to the next file at this point
SYNC_EWMA_WEIGHT = 0.125  # of each new round in the reported sync time: recent rounds count


def wal_path(directory: Path, index: int) -> Path:
    return directory / f"{index:020d}{WAL_SUFFIX}"


def wal_index(path: Path) -> int:
    return int(path.stem)


class WalCommit:
    """A frame's place in its shard; awaitable until the frame is durable."""

    __slots__ = ("lsn", "shard")

    def __init__(self, shard: WalShard, lsn: int) -> None:
        self.shard = shard
        self.lsn = lsn

    @property
    def durable(self) -> bool:
        return self.shard.synced_lsn >= self.lsn

    async def wait(self) -> None:
        """Return once the frame is synced. While the disk refuses writes this waits: the
        frame is kept and retried, so it is not refused."""
        if self.shard.synced_lsn >= self.lsn:
            return
        await self.shard.wait_synced(self.lsn)


class WalShard:
    def __init__(
        self,
        directory: Path,
        fileio: FileIO,
        retry_s: float = 0.05,
        max_retry_s: float = 1.0,
        clock: Clock | None = None,
        first: int = 0,
    ) -> None:
        """``first``: the catalog's first file to replay for this shard. Frames go on
        at or after it even when the directory holds no file: a crash between a seal's
        trim and the writer's move to the new file leaves none, and a file numbered
        below it would be taken for a seal's leftover by the next restart and removed,
        acknowledged frames and all."""
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._io = fileio
        self._retry_s = retry_s
        self._max_retry_s = max_retry_s
        existing = sorted(directory.glob(f"*{WAL_SUFFIX}"))
        # the file frames go to now
        self.index = max(wal_index(existing[-1]) if existing else 0, first)
        self.path = wal_path(directory, self.index)
        self._fd = fileio.open_append(self.path)
        self._size = os.fstat(self._fd).st_size
        # The file's size after its last good sync, and whether a failed round's bytes
        # may lie past it (its cut back failed too): then the next round cuts first,
        # then writes (see _write_pending).
        self._synced_size = self._size
        self._uncut = False
        self._file = self.index  # the file the writer thread writes (it lags self.index)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[bytes | list[bytes]] = []
        self.submitted = 0  # lsn of the last frame handed to this shard
        self.synced_lsn = 0  # every frame up to here is durable
        self.error: OSError | None = None  # the disk's last refusal, while it lasts
        # Why the writer thread died, for good: the shard refuses until a restart.
        self.failure: Exception | None = None
        self._taken = 0  # lsn of the last frame the writer took from the queue
        # After a failure: frames up to here may be on disk unsynced (the cut failed),
        # so they are never answered; later ones are refused (see :meth:`_fail`).
        self._unknown_upto = 0
        # Mutations admitted and still writing their frames (the engine thread's): their
        # frames are taken even once the shard refuses (see :meth:`admit`).
        self._admitted = 0
        self._clock = clock or SystemClock()
        # How long a group commit (its write and fdatasync) takes, in ms: a moving average
        # of the rounds so far, what an fsync topic's state reports as fsync_ms
        # (docs/semantics/topics.md §2.2).
        self.sync_ms = 0.0
        self._rounds = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"wal-{directory.name}", daemon=True)
        self._thread.start()

    # --- the engine thread ---------------------------------------------------------
    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Admit one mutation of one or more frames: 503 ``storage_unavailable`` now if
        the shard refuses, else every frame it submits inside is taken, even should the
        writer meet a full disk meanwhile. A topic-creating append writes its TOPIC
        frame, maybe a HEAD frame, then its records: refusing a later one would leave
        the first queued, a topic that replay makes although the client was told 503
        (docs/durability.md, "Full disk")."""
        refusal = self.refusal()
        if refusal is not None:
            raise refusal
        self._admitted += 1
        try:
            yield
        finally:
            self._admitted -= 1

    def submit(self, frame: bytes | list[bytes]) -> WalCommit:
        """Queue one frame, whole or in parts (joined by the writer thread)."""
        with self._lock:
            if not self._admitted and (refusal := self.refusal()) is not None:
                raise refusal
            # A frame of an admitted mutation is taken even from a failed shard: its
            # commit is refused (:meth:`wait_synced`), as are all it has not synced.
            self._queue.append(frame)
            self.submitted += 1
            lsn = self.submitted
            self._wake.notify()
        return WalCommit(self, lsn)

    def rotate(self) -> int:
        """Send every later frame to a new file; returns that file's index. Everything
        submitted before stays in the older files (what a seal may trim)."""
        with self._lock:
            self._queue.append(_ROTATE)
            self.index += 1
            self._wake.notify()
            return self.index

    def refusal(self) -> TopicError | None:
        """The 503 a new mutation gets now, or None if the shard takes it."""
        if self.failure is not None:
            return writer_failed(self.failure)
        error = self.error
        return None if error is None else unavailable(error)

    async def wait_synced(self, lsn: int) -> None:
        """Return once frame ``lsn`` is synced; 503 if the writer failed before it was."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._loop = loop
            if self.synced_lsn >= lsn:
                return
            if self.failure is not None and lsn > self._unknown_upto:
                raise writer_failed(self.failure)
            self._waiters.append((lsn, future))
        await future

    def sync_blocking(self, timeout: float = 30.0) -> None:
        """Wait, off the event loop, until everything submitted so far is durable."""
        target = self.submitted
        deadline = time.monotonic() + timeout
        while self.synced_lsn < target:
            if (refusal := self.refusal()) is not None:
                raise refusal
            if time.monotonic() > deadline:
                raise TimeoutError("the WAL did not sync in time")
            time.sleep(0.001)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._wake.notify()
        self._thread.join()
        self._io.close(self._fd)

    # --- the writer thread ---------------------------------------------------------
    def _run(self) -> None:
        pending: list[bytes | list[bytes]] = []
        try:
            self._loop_rounds(pending)
        except Exception as exc:
            # Not the disk refusing (that is retried in _loop_rounds): a bug or a fault
            # the writer cannot reason about, its bookkeeping may be off. It writes no
            # more; what it could not sync is refused rather than left waiting forever
            # (docs/durability.md, "A failed WAL writer").
            log.exception(
                "WAL %s: the writer thread failed; the shard refuses writes until the "
                "server restarts",
                self.directory.name,
            )
            self._fail(exc, pending)

    def _loop_rounds(self, pending: list[bytes | list[bytes]]) -> None:
        upto = 0
        delay = self._retry_s
        while True:
            with self._lock:
                while not self._queue and not pending and not self._closing:
                    self._wake.wait()
                if self._closing and not self._queue and not pending:
                    return
                pending.extend(self._queue)
                self._queue.clear()
                upto = self.submitted
                self._taken = upto
            started = self._clock.now_ms()
            try:
                self._write_pending(pending)
            except OSError as exc:
                self._failed(exc)
                time.sleep(delay)
                delay = min(delay * 2, self._max_retry_s)
                continue
            delay = self._retry_s
            self._measured(max(0, self._clock.now_ms() - started))
            self._synced(upto)

    def _measured(self, elapsed_ms: int) -> None:
        self._rounds += 1
        weight = 1.0 if self._rounds == 1 else SYNC_EWMA_WEIGHT
        self.sync_ms += (elapsed_ms - self.sync_ms) * weight

    def _write_pending(self, pending: list[bytes | list[bytes]]) -> None:
        """Write and sync ``pending`` in order, switching files at each rotation mark.

        Consumes the list in place, so after a failure it holds exactly what is left.
        """
        while pending:
            cut = pending.index(_ROTATE) if _ROTATE in pending else len(pending)
            synced = self._synced_size
            if self._uncut:
                # A failed round's bytes are still there (whole frames, or part of
                # one): nothing is written after them, or a frame would replay twice
                # or a torn one stand mid-file. Until a cut succeeds the shard stays
                # unavailable (docs/durability.md, "Full disk").
                self._io.truncate(self._fd, synced)
                self._uncut = False
            try:
                if cut:
                    self._write_all(_pieces(pending[:cut]))
                self._io.fdatasync(self._fd)
            except OSError:
                # Nothing of a failed round may stay behind: the retry writes it again,
                # and a frame written twice would replay twice. (After a failed
                # fdatasync the written bytes' fate is unknown: they go too.)
                self._size = synced
                try:
                    self._io.truncate(self._fd, synced)
                except OSError:
                    self._uncut = True  # the retry cuts first
                raise
            self._synced_size = self._size
            del pending[:cut]
            if pending:  # a rotation mark: the older file is complete and durable
                # The new file is opened first: should that fail, the retry finds this
                # one still open (a closed descriptor's number may be another file's).
                fd = self._io.open_append(wal_path(self.directory, self._file + 1))
                self._io.close(self._fd)
                self._fd, self._file, self._size = fd, self._file + 1, 0
                self._synced_size = 0
                del pending[0]

    def _write_all(self, pieces: Iterator[bytes]) -> None:
        for piece in pieces:
            view = memoryview(piece)
            while view:
                written = self._io.write(self._fd, view)
                view = view[written:]
            self._size += len(piece)

    def _failed(self, exc: OSError) -> None:
        # New frames are refused from now on; those already taken are not (their
        # waiters keep waiting): each is retried until stored, so answering it 503
        # would call refused a write that later becomes readable (docs/durability.md,
        # "Full disk").
        with self._lock:
            self.error = exc

    def _fail(self, exc: Exception, pending: list[bytes | list[bytes]]) -> None:
        """Fail closed. ``pending`` holds exactly the frames taken and not synced (see
        :meth:`_write_pending`), the last of them frame ``_taken``: those before are
        durable and answered so. Their bytes past the last good sync are cut, so the
        frames answered 503 never replay. Should the cut fail, the taken frames' waiters
        are left waiting, as after a timeout, since a 503 could then be contradicted by
        the restart; frames never taken are refused either way."""
        durable = self._taken - sum(1 for frame in pending if frame != _ROTATE)
        try:
            self._io.truncate(self._fd, self._synced_size)
        except Exception:
            log.exception("WAL %s: cutting back the unsynced frames failed", self.directory.name)
            unknown = self._taken
        else:
            unknown = durable
        with self._lock:
            self.failure = exc
            self._unknown_upto = unknown
            self.synced_lsn = max(self.synced_lsn, durable)
            ready = [w for w in self._waiters if w[0] <= durable]
            refused = [w for w in self._waiters if w[0] > unknown]
            self._waiters = [w for w in self._waiters if durable < w[0] <= unknown]
        loop = self._loop
        if loop is not None and (ready or refused):
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                loop.call_soon_threadsafe(_release_waiters, ready)
                loop.call_soon_threadsafe(_refuse_waiters, refused, writer_failed(exc))

    def _synced(self, upto: int) -> None:
        with self._lock:
            self.synced_lsn = upto
            self.error = None
            ready = [w for w in self._waiters if w[0] <= upto]
            self._waiters = [w for w in self._waiters if w[0] > upto]
        loop = self._loop
        if ready and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                loop.call_soon_threadsafe(_release_waiters, ready)


# Frames are written in pieces of about this size: small parts joined (one write call,
# not thousands), a larger one written as it is. Joining a 50 MB frame whole held the
# GIL, and the event loop with it, for as long as the copy took (docs/security.md, Limits).
PIECE_BYTES = 1 << 20


def _pieces(frames: list[bytes | list[bytes]]) -> Iterator[bytes]:
    batch: list[bytes] = []
    size = 0
    for part in chain.from_iterable((f,) if isinstance(f, bytes) else f for f in frames):
        if len(part) >= PIECE_BYTES:
            if batch:
                yield b"".join(batch)
                batch, size = [], 0
            yield part
            continue
        batch.append(part)
        size += len(part)
        if size >= PIECE_BYTES:
            yield b"".join(batch)
            batch, size = [], 0
    if batch:
        yield b"".join(batch)


def _release_waiters(waiters: list[tuple[int, asyncio.Future[None]]]) -> None:
    for _lsn, future in waiters:
        if not future.done():
            future.set_result(None)


def _refuse_waiters(waiters: list[tuple[int, asyncio.Future[None]]], error: TopicError) -> None:
    for _lsn, future in waiters:
        if not future.done():
            future.set_exception(error)


def writer_failed(exc: Exception) -> TopicError:
    return TopicError(
        ErrorCode.STORAGE_UNAVAILABLE,
        f"the write-ahead log's writer failed ({type(exc).__name__}): this write changed "
        "nothing that a restart keeps; nothing acknowledged is lost and writes to this "
        "shard resume once the server restarts",
        {"error": type(exc).__name__},
    )


def unavailable(exc: OSError) -> TopicError:
    return TopicError(
        ErrorCode.STORAGE_UNAVAILABLE,
        f"the write-ahead log cannot write right now ({exc.strerror or exc}): this write "
        "changed nothing; nothing acknowledged is lost and writes resume once the disk "
        "accepts them",
        {"errno": exc.errno},
    )


class Wal:
    """The WAL of one data directory: ``shards`` files, a topic always in the same one."""

    def __init__(
        self,
        directory: Path,
        shards: int = 2,
        fileio: FileIO | None = None,
        clock: Clock | None = None,
        start: dict[str, int] | None = None,
    ) -> None:
        """``clock`` times the group commits (the fsync_ms an fsync topic reports);
        ``start``: the catalog's first file per shard (see :class:`WalShard`)."""
        self.directory = directory
        self._io = fileio or FileIO()
        firsts = start or {}
        self.shards = [
            WalShard(
                directory / f"shard-{i}", self._io, clock=clock, first=firsts.get(f"shard-{i}", 0)
            )
            for i in range(shards)
        ]
        self._shard_of: dict[str, WalShard] = {}

    def shard_of(self, topic: str) -> WalShard:
        shard = self._shard_of.get(topic)
        if shard is None:
            if len(self._shard_of) > 100_000:  # names of deleted topics: keep it bounded
                self._shard_of.clear()
            # A stable hash (not Python's salted one): a topic must map to the same shard
            # across restarts, so its frames replay in order.
            shard = self.shards[zlib.crc32(topic.encode()) % len(self.shards)]
            self._shard_of[topic] = shard
        return shard

    def write(self, topic: str, frame: bytes | list[bytes]) -> WalCommit:
        return self.shard_of(topic).submit(frame)

    def latest(self, topic: str) -> WalCommit:
        shard = self.shard_of(topic)
        return WalCommit(shard, shard.submitted)

    def file(self, topic: str) -> int:
        """The file ``topic``'s next frame goes to (only :meth:`rotate` moves it on)."""
        return self.shard_of(topic).index

    def sync_ms(self, topic: str) -> int:
        """How long a group commit of ``topic``'s shard takes lately, in whole ms."""
        return round(self.shard_of(topic).sync_ms)

    def check_available(self, topic: str) -> None:
        refusal = self.shard_of(topic).refusal()
        if refusal is not None:
            raise refusal

    def check_writers(self) -> None:
        """Raise 503 storage_unavailable if a shard's writer thread failed: what memory
        holds then includes mutations the WAL refused, which a seal must not store
        (docs/durability.md, "A failed WAL writer")."""
        for shard in self.shards:
            if shard.failure is not None:
                raise writer_failed(shard.failure)

    def writer_failures(self) -> int:
        """How many shards' writer threads failed (each refuses until a restart)."""
        return sum(shard.failure is not None for shard in self.shards)

    def admit(self, topic: str) -> contextlib.AbstractContextManager[None]:
        """Admit one mutation of ``topic``'s: see :meth:`WalShard.admit`."""
        return self.shard_of(topic).admit()

    def submitted(self) -> int:
        """How many frames were ever handed to this WAL (a cheap "anything new?" check)."""
        return sum(shard.submitted for shard in self.shards)

    def sync_blocking(self) -> None:
        for shard in self.shards:
            shard.sync_blocking()

    def close(self) -> None:
        for shard in self.shards:
            shard.close()

    def rotate(self) -> dict[str, int]:
        """Rotate every shard; returns, per shard, the first file written after this call."""
        return {shard.directory.name: shard.rotate() for shard in self.shards}

    @staticmethod
    def existing_frames(
        directory: Path, start: dict[str, int] | None = None
    ) -> Iterator[tuple[Path, bytes, list[Frame], int]]:
        """(file, its bytes, frames, end of whole frames) for every WAL file from ``start``
        on (per shard), shard by shard, in order. Older files are a seal's
        leftovers: removed."""
        for shard_dir in sorted(directory.glob("shard-*")):
            first = (start or {}).get(shard_dir.name, 0)
            for path in sorted(shard_dir.glob(f"*{WAL_SUFFIX}")):
                if wal_index(path) < first:
                    path.unlink()
                    continue
                data = path.read_bytes()
                yield path, data, *scan(data, path)

    def trim(self, start: dict[str, int]) -> None:
        """Remove the files a durable seal made unnecessary."""
        for shard in self.shards:
            for path in shard.directory.glob(f"*{WAL_SUFFIX}"):
                if wal_index(path) < start.get(shard.directory.name, 0):
                    path.unlink(missing_ok=True)
