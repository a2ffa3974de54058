"""A watch whose consumer is recreated (a reset) resumes strictly after what it handed over.

A reset is what the heartbeat monitor, a consumer-sequence gap, a reconnect or a
server restart all end in (docs/semantics/kv.md §watch resumption). Forcing one is
the fault injector here: ``force_reset`` calls the same recreation they call, at
the moment the test chooses (a reader idle, the feed blocked on a full channel).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.kv.test_nats import bulk_put, fold_state

from waymark.kv import (
    BatchConfig,
    Connection,
    CursorExpired,
    KvUpdate,
    NatsConnectionConfig,
    StoreConfig,
    Timeout,
    WatchCursor,
    WatchError,
    WatchScope,
    watch_applied,
)
from waymark.kv import consumer as consumer_module
from waymark.kv import watcher as watcher_module
from waymark.kv.consumer import OrderedFeed
from waymark.kv.server import EmbeddedNats
from waymark.kv.stores.append_log import AppendLogStore
from waymark.kv.stores.protocol import SnapshotStore
from waymark.kv.watcher import KvWatch, KvWatcher

pytestmark = pytest.mark.timeout(60)

KEYS = 5_000
_pause_buckets = itertools.count()


def force_reset(feed: OrderedFeed) -> None:
    """Fault injector: recreate the feed's consumer now, as its monitors would."""
    feed._reset()


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def backpressured(feed: OrderedFeed, queue: asyncio.Queue[object]) -> bool:
    """The reader is idle: a chunk waits in the channel and the feed has delivered past it."""
    if not queue.full():
        return False
    waiting = queue._queue[0]  # type: ignore[attr-defined]
    return isinstance(waiting, list) and feed.frontier > (waiting[-1].revision or 0)


async def test_a_reset_while_the_reader_is_idle_loses_nothing(
    conn: Connection, bucket_name: str
) -> None:
    kv = await conn.store(bucket_name)
    await bulk_put(kv, [(f"k{i:05}", b"v") for i in range(KEYS)])
    watch: KvWatch = await kv.watcher().watch_all(capacity=256)
    feed = watch._feed
    await wait_until(lambda: backpressured(feed, watch._queue), "the feed to block")
    force_reset(feed)
    revisions: list[int] = []
    async with asyncio.timeout(20):
        while not revisions or revisions[-1] < KEYS:
            chunk = await watch.next_chunk()
            assert chunk is not None
            revisions += [u.revision or 0 for u in chunk]
    await watch.stop()
    missing = sorted(set(range(1, KEYS + 1)) - set(revisions))
    assert not missing, f"{len(missing)} revisions never delivered, from {missing[0]}"
    assert revisions == list(range(1, KEYS + 1))


def held_fold(
    kv: Any,
    store: SnapshotStore,
    batch: int,
    shutdown: asyncio.Event,
    on_applied: Callable[[Any], object] | None = None,
) -> tuple[asyncio.Task[Any], asyncio.Event]:
    """A fold of every key of ``kv`` into ``store`` whose apply waits until the returned
    event is set, so its feed backs up; and the fold's task."""
    release = asyncio.Event()

    async def apply(batch: list[KvUpdate]) -> None:
        await release.wait()

    fold = watch_applied(
        kv.watcher(), WatchScope.all(), apply, store=store, reader=kv.reader(),
        config=BatchConfig(max=batch, channel_capacity=batch), on_applied=on_applied,
        shutdown=shutdown,
    )  # fmt: skip
    return asyncio.create_task(fold), release


def resetting_once(after: int) -> tuple[type[OrderedFeed], list[OrderedFeed]]:
    """An OrderedFeed that remembers its instances, for the test to reset one of them."""
    feeds: list[OrderedFeed] = []

    class Recorded(OrderedFeed):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            feeds.append(self)

    return Recorded, feeds


async def test_a_fold_whose_feed_resets_under_an_idle_apply_misses_no_key(
    conn: Connection,
    bucket_name: str,
    make_store: Callable[[], SnapshotStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through watch_applied into each store: apply is held while the feed blocks and
    resets, then released; the fold must hold every key at the stream's last revision."""
    kv = await conn.store(bucket_name)
    await bulk_put(kv, [(f"k{i:05}", b"v") for i in range(KEYS)])
    recorded, feeds = resetting_once(0)
    monkeypatch.setattr(watcher_module, "OrderedFeed", recorded)
    done = asyncio.Event()

    def on_applied(cursor: object) -> None:
        if cursor.as_u64() >= KEYS:  # type: ignore[attr-defined]
            done.set()

    store = make_store()
    task, release = held_fold(kv, store, 100, done, on_applied)
    await wait_until(lambda: bool(feeds), "the feed to start")
    feed = feeds[0]
    await wait_until(lambda: backpressured(feed, feed._out), "the feed to block")
    force_reset(feed)
    release.set()
    cursor = await asyncio.wait_for(task, 30)
    assert cursor.as_u64() == KEYS
    assert len(fold_state(store)) == KEYS
    store.close()


async def test_a_reset_that_finds_its_next_revisions_evicted_fails_with_cursor_expired(
    conn: Connection, bucket_name: str
) -> None:
    """Retention took what the reader had not been handed yet: the watch says so."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k{i:05}", b"v") for i in range(KEYS)])
    watch: KvWatch = await kv.watcher().watch_all(capacity=256)
    feed = watch._feed
    await wait_until(lambda: backpressured(feed, watch._queue), "the feed to block")
    await kv.js.purge_stream(kv.stream, seq=KEYS - 10)
    force_reset(feed)
    revisions: list[int] = []
    with pytest.raises(CursorExpired, match="evicted"):
        async with asyncio.timeout(20):
            while chunk := await watch.next_chunk():
                revisions += [u.revision or 0 for u in chunk]
    assert revisions == list(range(1, len(revisions) + 1))  # in order, nothing skipped
    await watch.stop()


async def test_a_fold_whose_reset_finds_revisions_evicted_resyncs_to_the_bucket(
    conn: Connection,
    bucket_name: str,
    make_store: Callable[[], SnapshotStore],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Keys deleted and keys written in the evicted range: after the resync the fold
    holds exactly what the bucket holds, and the fold goes on live."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k{i:05}", b"v") for i in range(KEYS)])
    w = kv.writer()
    for i in range(0, 200, 2):
        await w.delete(f"k{i:05}")  # the markers are evicted below
    recorded, feeds = resetting_once(0)
    monkeypatch.setattr(watcher_module, "OrderedFeed", recorded)
    store = make_store()
    shutdown = asyncio.Event()
    task, release = held_fold(kv, store, 100, shutdown)
    await wait_until(lambda: bool(feeds), "the feed to start")
    feed = feeds[0]
    await wait_until(lambda: backpressured(feed, feed._out), "the feed to block")
    _, last = await kv.stream_bounds()
    await kv.js.purge_stream(kv.stream, seq=last - 3)  # the last markers stay, the rest go
    force_reset(feed)
    release.set()
    after = (await w.put("after", b"live")).as_u64() or 0
    await wait_until(lambda: (store.cursor.as_u64() or 0) >= after, "the fold to go live", 20)
    shutdown.set()
    await asyncio.wait_for(task, 10)
    assert "resyncing" in caplog.text
    assert fold_state(store) == {e.key: e.value for e in await kv.reader().scan()}
    store.close()


@pytest.mark.parametrize("evicted", [False, True], ids=["gap-benign", "gap-evicted"])
async def test_a_reset_during_the_floor_check_neither_stalls_nor_skips_the_fold(
    conn: Connection,
    bucket_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    evicted: bool,
) -> None:
    """A delivery that jumps the frontier is held in the live floor guard's stream-info
    check (docs/semantics/kv.md §5) when a reset recreates the consumer. Unsubscribing
    cancels that delivery; the reset, not the cancellation, decides what comes next:
    resume after the last revision handed over, or (the next one evicted) resync.
    Before the fix the cancellation became the watch's failure, the fold's watch task
    ended on it without a word, and the fold stalled at its cursor for good."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    w = kv.writer()
    first = (await w.put("a", b"1")).as_u64() or 0
    store = AppendLogStore(tmp_path / "fold.log")
    store.apply([KvUpdate.put("a", b"1", first)], WatchCursor.from_u64(first))
    await w.put("b", b"2")
    await w.put("c", b"3")
    await w.put("b", b"4")  # history 1: the first "b" goes, a benign jump past it
    checking, gate = asyncio.Event(), asyncio.Event()
    real_check = KvWatcher._floor_check

    async def slow_floor_check(self: KvWatcher, frontier: int, delivered: int) -> None:
        """Fault injector: the floor guard's stream-info request is slow (a loaded server)."""
        checking.set()
        await gate.wait()
        await real_check(self, frontier, delivered)

    monkeypatch.setattr(KvWatcher, "_floor_check", slow_floor_check)
    recorded, feeds = resetting_once(0)
    monkeypatch.setattr(watcher_module, "OrderedFeed", recorded)
    shutdown = asyncio.Event()
    task = asyncio.create_task(
        watch_applied(
            kv.watcher(), WatchScope.all(), store=store, reader=kv.reader(), shutdown=shutdown
        )
    )
    await asyncio.wait_for(checking.wait(), 10)
    if evicted:  # retention takes "c" too, before the reset's window check
        await w.put("d", b"4")
        _, last = await kv.stream_bounds()
        await kv.js.purge_stream(kv.stream, seq=last)
    force_reset(feeds[0])
    gate.set()
    last = (await w.put("after", b"live")).as_u64() or 0
    await wait_until(
        lambda: (store.cursor.as_u64() or 0) >= last or task.done(), "the fold to go on", 15
    )
    assert not task.done(), f"the fold stopped: {task.exception()!r}"
    assert (store.cursor.as_u64() or 0) == last
    assert fold_state(store) == {e.key: e.value for e in await kv.reader().scan()}
    assert ("resyncing" in caplog.text) == evicted
    shutdown.set()
    await asyncio.wait_for(task, 10)
    store.close()


async def test_a_cancellation_leaking_to_the_fold_s_watch_task_fails_the_fold_loudly(
    conn: Connection, bucket_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The safety net behind the fix above: whatever cancellation reaches the fold's
    watch task without the fold stopping it ends the fold with WatchError, never in
    a silent wait at its cursor."""
    kv = await conn.store(bucket_name)
    await kv.writer().put("a", b"1")
    real_next_chunk = KvWatch.next_chunk

    async def leaking_next_chunk(self: KvWatch) -> list[KvUpdate] | None:
        """Fault injector: the watch hands its reader a cancellation, as the feed did
        before the fix above."""
        chunk = await real_next_chunk(self)
        if chunk:
            raise asyncio.CancelledError
        return chunk

    monkeypatch.setattr(KvWatch, "next_chunk", leaking_next_chunk)
    store = AppendLogStore(tmp_path / "fold.log")
    fold = watch_applied(kv.watcher(), WatchScope.all(), store=store, reader=kv.reader())
    with pytest.raises(WatchError, match="stray cancellation"):
        await asyncio.wait_for(fold, 15)
    store.close()


def recording_with_heartbeat(heartbeat: float) -> tuple[type[OrderedFeed], list[OrderedFeed]]:
    """An OrderedFeed that remembers its instances and heartbeats every ``heartbeat`` s."""
    feeds: list[OrderedFeed] = []

    class Recorded(OrderedFeed):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["heartbeat"] = heartbeat
            super().__init__(*args, **kwargs)
            feeds.append(self)

    return Recorded, feeds


async def caught_up_fold(
    kv: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, heartbeat: float
) -> tuple[list[int], AppendLogStore, asyncio.Event, asyncio.Task[Any], list[OrderedFeed]]:
    """A fold of ``kv`` after 50 puts, its feeds recorded with ``heartbeat``, once it
    applied them: the revisions it applied, its store, its shutdown, its task, its feeds."""
    await bulk_put(kv, [(f"a{i:03}", b"v") for i in range(50)])
    recorded, feeds = recording_with_heartbeat(heartbeat)
    monkeypatch.setattr(watcher_module, "OrderedFeed", recorded)
    applied: list[int] = []

    def apply(batch: list[KvUpdate]) -> None:
        applied.extend(u.revision or 0 for u in batch)

    store = AppendLogStore(tmp_path / "fold.log")
    shutdown = asyncio.Event()
    task = asyncio.create_task(
        watch_applied(
            kv.watcher(), WatchScope.all(), apply, store=store, reader=kv.reader(),
            shutdown=shutdown,
        )
    )  # fmt: skip
    await wait_until(lambda: (store.cursor.as_u64() or 0) >= 50, "the fold to catch up")
    return applied, store, shutdown, task, feeds


async def test_a_state_sync_listing_whose_messages_are_purged_under_it_resyncs_at_once(
    conn: Connection,
    bucket_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The "fold stuck at 66 of 718" stall (docs/kv.md, "How it is tested"). A bucket
    keeping history lists last-per-subject from a list of sequences taken when the
    consumer is created; retention takes some before they are sent (here: apply is held,
    the server stops at its flow-control window, then the stream is purged). nats-server
    then skips one missing sequence per wake-up (a write, an idle heartbeat), so the
    listing crawled on at one key per heartbeat (5 s each by default) with no error.
    The listing must be recreated at the first idle heartbeat it still owes messages
    at: its next revision is gone, so the fold resyncs and goes on."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None, max_history=64))
    value = b"x" * 16_384  # 2 MB (the server's flow-control window) is ~128 of them
    await bulk_put(kv, [(f"k{i:04}", value) for i in range(400)])
    recorded, feeds = recording_with_heartbeat(1.0)
    monkeypatch.setattr(watcher_module, "OrderedFeed", recorded)
    store = AppendLogStore(tmp_path / "fold.log")
    shutdown = asyncio.Event()
    task, release = held_fold(kv, store, 8, shutdown)
    await wait_until(lambda: bool(feeds) and feeds[0]._sub is not None, "the listing to start")
    sub = feeds[0]._sub
    assert sub is not None
    arrived = -1
    while sub.delivered != arrived:  # the server stopped at its flow-control window
        arrived = sub.delivered
        await asyncio.sleep(0.05)
    assert arrived < 300, "the server sent past the purge point: nothing to test"
    await kv.js.purge_stream(kv.stream, seq=350)
    release.set()
    await wait_until(
        lambda: (store.cursor.as_u64() or 0) >= 400 or task.done(), "the fold to go on", 8
    )
    assert not task.done(), f"the fold stopped: {task.exception()!r}"
    assert "resyncing" in caplog.text
    assert fold_state(store) == {e.key: e.value for e in await kv.reader().scan()}
    shutdown.set()
    await asyncio.wait_for(task, 10)
    store.close()


@pytest.mark.parametrize("how", ["fold-cancelled", "apply-leaks-a-cancellation"])
async def test_a_cancellation_during_a_resync(
    conn: Connection, bucket_name: str, tmp_path: Path, how: str
) -> None:
    """Cancelling the fold (a shutdown) while its resync runs the synthetic deletes
    through apply ends it with CancelledError, as a cancellation anywhere else does;
    the resync does not report it as its failure. A cancellation nobody asked for
    (here leaked out of apply) is a failure: WatchError, never a silent end."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    w = kv.writer()
    first = (await w.put("gone", b"1")).as_u64() or 0
    store = AppendLogStore(tmp_path / "fold.log")
    store.apply([KvUpdate.put("gone", b"1", first)], WatchCursor.from_u64(first))
    await w.delete("gone")
    last = (await w.put("kept", b"2")).as_u64() or 0
    await kv.js.purge_stream(kv.stream, seq=last)  # the cursor expires: resync at start
    in_apply = asyncio.Event()

    async def apply(batch: list[KvUpdate]) -> None:
        in_apply.set()  # the synthetic delete of "gone"
        if how == "apply-leaks-a-cancellation":
            raise asyncio.CancelledError
        await asyncio.Event().wait()

    task = asyncio.create_task(
        watch_applied(kv.watcher(), WatchScope.all(), apply, store=store, reader=kv.reader())
    )
    await asyncio.wait_for(in_apply.wait(), 10)
    if how == "fold-cancelled":
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
    else:
        with pytest.raises(WatchError, match="resync failed: a stray cancellation"):
            await asyncio.wait_for(task, 10)
    store.close()


# --- a reset that cannot recreate its consumer at the first try (issue 27) -----------


@pytest.fixture(scope="module")
def pausable_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A nats-server of this module's own: a test SIGSTOPs it."""
    with EmbeddedNats(tmp_path_factory.mktemp("nats-pause")) as server:
        yield server


@contextlib.contextmanager
def paused(server: EmbeddedNats) -> Iterator[None]:
    """SIGSTOP the server: connections stay open, nothing is answered; SIGCONT on exit."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


async def test_a_reset_whose_consumer_create_times_out_retries_and_skips_nothing(
    pausable_nats: EmbeddedNats,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 27: the server stops answering (SIGSTOP) under a running fold. Its feed
    misses three heartbeats and resets; the reset's first attempt times out (its window
    check's stream info, or its consumer create: the same path). The server
    answers again once the test saw that attempt fail: the fold must not have stopped,
    must resume after the last revision applied, and must say that it retried. Before
    the fix the one failed attempt ended the fold with WatchError ("watch consumer lost
    and could not be recreated: ... timed out")."""
    config = NatsConnectionConfig(url=pausable_nats.url, timeout=1.0)
    async with Connection(config) as conn:
        kv = await conn.store(f"pause{next(_pause_buckets)}", StoreConfig(max_bytes=None))
        applied, store, shutdown, task, feeds = await caught_up_fold(
            kv, tmp_path, monkeypatch, heartbeat=0.2
        )
        with paused(pausable_nats):
            await wait_until(
                lambda: "re-creating it failed" in caplog.text or task.done(),
                "a reset's attempt to fail",
                15,
            )
        assert not task.done(), f"the fold stopped: {task.exception()!r}"
        await bulk_put(kv, [(f"b{i:03}", b"w") for i in range(50)])
        _, last = await kv.stream_bounds()
        await wait_until(
            lambda: (store.cursor.as_u64() or 0) >= last or task.done(), "the fold to go on", 15
        )
        assert not task.done(), f"the fold stopped: {task.exception()!r}"
        assert applied == list(range(1, last + 1)), "every revision applied once, in order"
        assert fold_state(store) == {e.key: e.value for e in await kv.reader().scan()}
        # Two attempts, or more if one timed out again on a loaded machine.
        assert "re-created after" in caplog.text
        assert len(feeds) == 1 and feeds[0].reset_retries >= 1
        shutdown.set()
        await asyncio.wait_for(task, 10)
    store.close()


async def test_a_reset_that_finds_its_bucket_deleted_fails_the_fold_at_once(
    conn: Connection, bucket_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not transient: the bucket's stream is gone. The reset does not wait for it to come
    back; the fold fails loudly with WatchError, without a retry."""
    kv = await conn.store(bucket_name)
    last = (await kv.writer().put("a", b"1")).as_u64() or 0
    store = AppendLogStore(tmp_path / "fold.log")
    recorded, feeds = resetting_once(0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(watcher_module, "OrderedFeed", recorded)
        task = asyncio.create_task(
            watch_applied(kv.watcher(), WatchScope.all(), store=store, reader=kv.reader())
        )
        await wait_until(
            lambda: (store.cursor.as_u64() or 0) >= last or task.done(), "the fold to catch up"
        )
    await kv.js.delete_stream(kv.stream)
    force_reset(feeds[0])
    with pytest.raises(WatchError, match=r"could not be recreated: .*not found"):
        await asyncio.wait_for(task, 10)
    assert "retrying" not in caplog.text
    store.close()


def failing_creates(
    slept: list[float], sleep: Callable[[float], Awaitable[object]] | None = None
) -> tuple[type[OrderedFeed], list[OrderedFeed]]:
    """An OrderedFeed whose every consumer create after the first times out (fault
    injector: a cluster that does not answer) and whose waits between a reset's attempts
    are recorded in ``slept`` and, unless ``sleep`` waits, take no time."""
    feeds: list[OrderedFeed] = []

    async def no_wait(delay: float) -> None:
        slept.append(delay)

    class Failing(OrderedFeed):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["sleep"] = sleep or no_wait
            kwargs["rng"] = random.Random(0)
            super().__init__(*args, **kwargs)
            feeds.append(self)

        async def _create(self, policy: Any, start_seq: int | None) -> None:
            if self._gen > 0:
                raise Timeout("create consumer timed out (fault injector)")
            await super()._create(policy, start_seq)

    return Failing, feeds


async def test_a_reset_gives_up_after_reset_attempts_with_watch_error(
    nats_server: EmbeddedNats, bucket_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NatsConnectionConfig(reset_attempts=N): N attempts, the backoff's delays between
    them (injected: no real sleep), then WatchError naming the last failure."""
    slept: list[float] = []
    failing, feeds = failing_creates(slept)
    monkeypatch.setattr(watcher_module, "OrderedFeed", failing)
    config = NatsConnectionConfig(url=nats_server.url, timeout=5.0, reset_attempts=4)
    async with Connection(config) as conn:
        kv = await conn.store(bucket_name)
        await kv.writer().put("a", b"1")
        watch = await kv.watcher().watch_all()
        assert [u.key for u in await watch.next_chunk() or []] == ["a"]
        force_reset(feeds[0])
        with pytest.raises(WatchError, match=r"create consumer timed out .*\(4 attempts\)"):
            async with asyncio.timeout(10):
                await watch.next_chunk()
        await watch.stop()
    backoff = consumer_module.RESET_BACKOFF
    assert len(slept) == 3 and feeds[0].reset_retries == 3
    for attempt, delay in enumerate(slept, 1):
        assert backoff.ceiling(attempt) / 2 <= delay <= backoff.ceiling(attempt)
    with pytest.raises(ValueError, match="reset_attempts"):
        NatsConnectionConfig(reset_attempts=0)


async def test_a_watch_stopped_while_its_reset_backs_off_stops_at_once(
    conn: Connection, bucket_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unbounded retries (the default) must not hold up a stop: the wait between two
    attempts is cancelled, and no attempt follows it."""
    slept: list[float] = []
    backing_off = asyncio.Event()

    async def forever(delay: float) -> None:
        slept.append(delay)
        backing_off.set()
        await asyncio.Event().wait()

    failing, feeds = failing_creates(slept, forever)
    monkeypatch.setattr(watcher_module, "OrderedFeed", failing)
    kv = await conn.store(bucket_name)
    watch = await kv.watcher().watch_all()
    force_reset(feeds[0])
    await asyncio.wait_for(backing_off.wait(), 10)
    await asyncio.wait_for(watch.stop(), 2)
    assert await watch.next_chunk() is None  # stopped, not failed
    assert len(slept) == 1


# --- a nats-server restarted under a fold (the fault campaign's nats-kill) ------------


async def test_a_fold_whose_nats_server_restarts_goes_on_at_the_reconnect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-server SIGKILLed and started again on its store directory and port (the
    campaign's ``nats-kill``, docs/faults.md) keeps the bucket but forgets every consumer:
    a feed's is kept in memory. The client reconnects by itself; the feed must then
    recreate its consumer strictly after the last revision it delivered, not wait for
    three missed heartbeats (15 s by default; 180 s here, so only the reconnect can
    wake it). Before the fix the fold sat idle until the heartbeats said so: the
    campaign saw it export nothing for 15 s after each restart."""
    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        async with Connection(NatsConnectionConfig(url=server.url, timeout=2.0)) as conn:
            kv = await conn.store("restarted", StoreConfig(max_bytes=None))
            applied, store, shutdown, task, feeds = await caught_up_fold(
                kv, tmp_path, monkeypatch, heartbeat=60.0
            )
            server.stop()  # SIGKILL
            server.start()
            for i in range(50):  # each written once the client is back
                key = f"b{i:03}"
                deadline = time.monotonic() + 30
                while True:
                    try:
                        await kv.writer().put(key, b"w")
                        break
                    except Exception:
                        assert time.monotonic() < deadline, f"{key} not written within 30 s"
                        await asyncio.sleep(0.1)
            _, last = await kv.stream_bounds()
            await wait_until(
                lambda: (store.cursor.as_u64() or 0) >= last or task.done(),
                "the fold to go on after the restart",
                30,
            )
            assert not task.done(), f"the fold stopped: {task.exception()!r}"
            assert applied == list(range(1, last + 1)), "every revision applied once, in order"
            assert fold_state(store) == {e.key: e.value for e in await kv.reader().scan()}
            assert len(feeds) == 1
            shutdown.set()
            await asyncio.wait_for(task, 10)
        store.close()
    finally:
        server.stop()
