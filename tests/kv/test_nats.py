"""The KV layer and ``watch_applied`` against a real nats-server with JetStream."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.js import api

from waymark.kv import (
    AlreadyExists,
    BatchConfig,
    Connection,
    CursorExpired,
    ExportRequest,
    KvError,
    KvStore,
    KvUpdate,
    NatsConnectionConfig,
    Op,
    RevisionMismatch,
    SnapshotIoError,
    StoreConfig,
    Timeout,
    VersionToken,
    WatchCursor,
    WatchError,
    WatchScope,
    open_store,
    watch_applied,
)
from waymark.kv import bucket as bucket_module
from waymark.kv import consumer as consumer_module
from waymark.kv.consumer import OrderedFeed
from waymark.kv.deadline import cancel_and_wait, timed
from waymark.kv.server import EmbeddedNats
from waymark.kv.stores.protocol import SnapshotStore

pytestmark = pytest.mark.timeout(60)


async def bulk_put(kv: KvStore, items: Sequence[tuple[str, bytes]]) -> None:
    for key, value in items:
        await kv.js.publish_async(f"{kv.subject_prefix}{key}", value)
    await kv.js.publish_async_completed()


async def fold(
    kv: KvStore,
    store: SnapshotStore | None,
    *,
    scope: WatchScope | None = None,
    resume: WatchCursor | None = None,
    reader: bool = True,
    config: BatchConfig | None = None,
    seen: list[KvUpdate] | None = None,
    apply: Callable[[list[Any]], object] | None = None,
) -> WatchCursor:
    """Run watch_applied until the fold has caught up with the stream's last sequence."""
    _, target = await kv.stream_bounds()
    done = asyncio.Event()
    deliveries = seen if seen is not None else []

    def parse(u: KvUpdate) -> KvUpdate:
        deliveries.append(u)
        return u

    def on_applied(cursor: WatchCursor) -> None:
        if cursor.as_u64() >= target:
            done.set()

    if (resume or (store.cursor if store else WatchCursor())).as_u64() >= target:
        done.set()
    return await asyncio.wait_for(
        watch_applied(
            kv.watcher(),
            scope or WatchScope.all(),
            apply or (lambda batch: None),
            resume=resume,
            parse=parse,
            store=store,
            reader=kv.reader() if reader else None,
            config=config or BatchConfig(max=500, channel_capacity=500),
            on_applied=on_applied,
            shutdown=done,
        ),
        30,
    )


async def scan_state(kv: KvStore) -> dict[str, bytes]:
    return {e.key: e.value for e in await kv.reader().scan()}


def fold_state(store: SnapshotStore) -> dict[str, bytes]:
    return {e.key: e.value for e in store.range()}


async def test_cas_semantics(conn: Connection, bucket_name: str) -> None:
    kv = await conn.store(bucket_name)
    w, r = kv.writer(), kv.reader()
    v1 = await w.create("lock", b"a")
    with pytest.raises(AlreadyExists):
        await w.create("lock", b"b")
    v2 = await w.update("lock", b"b", v1)
    with pytest.raises(RevisionMismatch):
        await w.update("lock", b"c", v1)  # a stale version loses
    with pytest.raises(RevisionMismatch):
        await w.delete_with_version("lock", v1)
    assert await w.delete_with_version("lock", v2)
    # The CAS tombstone: hidden from get/keys/scan, visible to entry() with its version.
    assert await r.get("lock") is None
    assert await r.keys() == []
    tomb = await r.entry("lock")
    assert tomb is not None and tomb.value == b"" and tomb.version.as_u64() == v2.as_u64() + 1
    v3 = await w.create("lock", b"again")  # create takes the tombstone's place, by CAS
    assert (await r.get("lock")).version == v3  # type: ignore[union-attr]
    await w.delete("lock")  # a soft-delete marker is a tombstone too
    assert await r.get("lock") is None
    await w.create("lock", b"third")
    assert (await r.get("lock")).value == b"third"  # type: ignore[union-attr]
    with pytest.raises(RevisionMismatch):
        await w.update("lock", b"x", VersionToken(b"\x01" * 10))  # not a NATS revision


async def test_bucket_config_applies_only_at_creation(conn: Connection, bucket_name: str) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_history=3, max_bytes=1 << 20))
    await kv.writer().put("k", b"v")
    again = await conn.store(bucket_name, StoreConfig(max_history=1))
    info = await again.js.stream_info(again.stream)
    assert info.config.max_msgs_per_subject == 3
    assert (await again.reader().get("k")).value == b"v"  # type: ignore[union-attr]


async def test_scan_and_keys_are_not_truncated_at_max_ack_pending(
    conn: Connection, bucket_name: str
) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k.{i:05}", b"v%d" % i) for i in range(2500)])
    await kv.writer().put("other.x", b"1")
    r = kv.reader()
    assert len(await r.keys()) == 2501
    scanned = await r.scan("k.")
    assert len(scanned) == 2500
    assert {e.key: e.value for e in scanned}["k.00042"] == b"v42"
    assert await r.keys(["other.", "none."]) == ["other.x"]
    assert await r.keys("none.") == []


async def test_watch_is_state_sync_then_live_and_prefixes_share_one_consumer(
    conn: Connection, bucket_name: str
) -> None:
    kv = await conn.store(bucket_name)
    w = kv.writer()
    await w.put("a.1", b"old")
    await w.put("a.1", b"new")
    await w.put("b.1", b"x")
    await w.put("c.1", b"y")
    await w.delete("b.1")
    watch = await kv.watcher().watch_prefixes(["a.", "b."])
    info = await kv.js.stream_info(kv.stream)
    assert info.state.consumer_count == 1
    first = await watch.next_chunk()
    assert [(u.op, u.key, u.value) for u in first] == [
        (Op.PUT, "a.1", b"new"),
        (Op.DELETE, "b.1", b""),
    ]
    await w.put("c.2", b"not mine")
    await w.put("a.2", b"live")
    live = await asyncio.wait_for(watch.next_chunk(), 5)
    assert [(u.key, u.value) for u in live] == [("a.2", b"live")]
    await watch.stop()


async def test_resume_delivers_only_the_delta(
    conn: Connection, bucket_name: str, make_store: Callable[[], SnapshotStore]
) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k.{i}", b"v") for i in range(400)])
    store = make_store()
    first: list[KvUpdate] = []
    await fold(kv, store, seen=first)
    assert len(first) == 400
    store.close()
    await bulk_put(kv, [(f"k.{i}", b"changed") for i in range(25)])
    store = make_store()  # a restart: only the store's cursor survives
    delta: list[KvUpdate] = []
    cursor = await fold(kv, store, seen=delta)
    # A full replay would converge as well; the delivery count tells them apart.
    assert len(delta) == 25 and all(u.value == b"changed" for u in delta)
    assert cursor.as_u64() == 425 and fold_state(store) == await scan_state(kv)
    store.close()


async def test_nats_clamps_silently_and_resume_window_refuses(
    conn: Connection, bucket_name: str
) -> None:
    kv = await conn.store(bucket_name)
    w = kv.writer()
    for i in range(10):
        await w.put(f"k{i}", b"v")
    await kv.js.purge_stream(kv.stream, seq=6)  # retention took sequences 1..5
    first, last = await kv.stream_bounds()
    assert (first, last) == (6, 10)

    # The fact being guarded against: a raw consumer asked for sequence 3 gets 6, no error.
    sub = await kv.js.subscribe(
        f"{kv.subject_prefix}>",
        stream=kv.stream,
        ordered_consumer=True,
        config=api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=3
        ),
    )
    msg = await sub.next_msg(timeout=5)
    assert msg.metadata.sequence.stream == 6
    await sub.unsubscribe()
    # ... and one asked to start beyond the last sequence (a recreated bucket) just waits.
    sub = await kv.js.subscribe(
        f"{kv.subject_prefix}>",
        stream=kv.stream,
        ordered_consumer=True,
        config=api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=51
        ),
    )
    with pytest.raises(Exception):  # noqa: B017 - nats-py's timeout type
        await sub.next_msg(timeout=0.3)
    await sub.unsubscribe()

    watcher = kv.watcher()
    with pytest.raises(CursorExpired):
        await watcher.watch_all_from(WatchCursor.from_u64(3))
    with pytest.raises(CursorExpired):
        await watcher.watch_all_from(WatchCursor.from_u64(50))
    ok = await watcher.watch_all_from(WatchCursor.from_u64(5))  # 6 is still held: sound
    # The five may come in several chunks (a loaded machine hands over what has
    # arrived so far): read until all five are in, within a deadline.
    revisions: list[int | None] = []
    async with asyncio.timeout(10):
        while len(revisions) < 5:
            chunk = await ok.next_chunk()
            assert chunk is not None
            revisions += [u.revision for u in chunk]
    assert revisions == [6, 7, 8, 9, 10]
    await ok.stop()


async def _expire_with_gap(kv: KvStore, store: SnapshotStore) -> WatchCursor:
    """Fold k0..k9, then in the gap: delete k1, delete-then-recreate k2, change k3, add k10,
    touch the rest, and evict k1's delete marker with the old head."""
    await bulk_put(kv, [(f"k{i}", b"v%d" % i) for i in range(10)])
    cursor = await fold(kv, store)
    w = kv.writer()
    await w.delete("k1")
    await w.delete("k2")
    await w.put("k2", b"recreated")
    await w.put("k3", b"changed")
    await w.put("k10", b"new")
    for i in (0, 4, 5, 6, 7, 8, 9):
        await w.put(f"k{i}", b"v%d" % i)
    await kv.js.purge_stream(kv.stream, subject=f"{kv.subject_prefix}k1")
    first, _ = await kv.stream_bounds()
    assert first > cursor.as_u64() + 1  # the cursor really expired
    return cursor


async def test_cursor_expiry_resyncs_deletes_and_recreates_from_the_gap(
    conn: Connection, bucket_name: str, make_store: Callable[[], SnapshotStore]
) -> None:
    kv = await conn.store(bucket_name)
    store = make_store()
    await _expire_with_gap(kv, store)
    applied: list[KvUpdate] = []
    await fold(kv, store, apply=applied.extend)
    state = fold_state(store)
    assert "k1" not in state and state["k2"] == b"recreated" and state["k3"] == b"changed"
    assert state == await scan_state(kv)
    # The synthetic delete reached apply too, before any re-list put.
    synthetic = [u for u in applied if u.version.is_unknown]
    assert [u.key for u in synthetic] == ["k1"] and applied.index(synthetic[0]) == 0
    store.close()


async def test_without_a_reader_expiry_leaves_gap_deletes_stale(
    conn: Connection, bucket_name: str, tmp_path: Path
) -> None:
    """Pinned: re-list alone cannot see keys whose delete markers were evicted."""
    kv = await conn.store(bucket_name)
    store = open_store(f"lmdb:{tmp_path / 'f'}")
    await _expire_with_gap(kv, store)
    await fold(kv, store, reader=False)
    assert "k1" in fold_state(store)
    store.close()


class FailingStore:
    """Fault injector: a real store whose chosen ``apply`` calls fail (a disk error on demand)."""

    def __init__(self, inner: SnapshotStore, fail_calls: set[int]) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.fail_calls = fail_calls
        self.calls = 0

    @property
    def cursor(self) -> WatchCursor:
        return self.inner.cursor

    def apply(self, batch: Sequence[KvUpdate], cursor: WatchCursor) -> None:
        self.calls += 1
        if self.calls in self.fail_calls:
            raise SnapshotIoError(f"injected failure on apply #{self.calls}")
        self.inner.apply(batch, cursor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_transient_store_failure_never_leaves_a_cursor_gap(
    conn: Connection, bucket_name: str, make_store: Callable[[], SnapshotStore]
) -> None:
    kv = await conn.store(bucket_name)
    await bulk_put(kv, [(f"k{i:03}", b"v%d" % i) for i in range(300)])
    store = FailingStore(make_store(), fail_calls={2})
    cursor = await fold(kv, store, config=BatchConfig(max=50, channel_capacity=50))  # type: ignore[arg-type]
    assert store.calls >= 3  # the failure was followed by successful flushes
    store.inner.close()
    reopened = make_store()  # what a restart would resume from
    assert reopened.cursor == cursor
    assert fold_state(reopened) == await scan_state(kv)
    reopened.close()


async def test_a_store_failing_16_times_in_a_row_fail_stops(
    conn: Connection, bucket_name: str, tmp_path: Path
) -> None:
    kv = await conn.store(bucket_name)
    await bulk_put(kv, [(f"k{i}", b"v") for i in range(20)])
    store = FailingStore(open_store(f"lmdb:{tmp_path / 'f'}"), fail_calls=set(range(1, 100)))
    with pytest.raises(WatchError, match="16 times"):
        await fold(kv, store, config=BatchConfig(window=0.001))  # type: ignore[arg-type]
    assert store.calls == 16 and store.inner.cursor.is_none
    store.inner.close()


async def _overrun(kv: KvStore) -> None:
    """Write far more than flow control lets the server push to a reader that is not
    reading, then evict the head (retention, done here by purge) past what it was sent."""
    await bulk_put(kv, [(f"k{i}", b"x" * 4000) for i in range(2000)])
    _, last = await kv.stream_bounds()
    await kv.js.purge_stream(kv.stream, seq=last - 5)


async def test_floor_guard_in_band_fails_a_live_watch_overrun_by_retention(
    conn: Connection, bucket_name: str
) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await kv.writer().put("start", b"x")
    # No backstop within the test: only the in-band check can trip.
    watch = await kv.watcher().watch_all_from(
        WatchCursor.from_u64(1), capacity=16, floor_interval=600, heartbeat=0.5
    )
    await _overrun(kv)
    seen = 0
    with pytest.raises(WatchError, match="overrun by retention"):
        while True:
            chunk = await asyncio.wait_for(watch.next_chunk(), 10)
            seen += len(chunk or [])
    assert 0 < seen < 2000  # what was delivered before the gap, and nothing past it
    await watch.stop()


async def test_floor_guard_backstop_catches_an_overrun_without_deliveries(
    conn: Connection, bucket_name: str
) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await kv.writer().put("start", b"x")
    watch = await kv.watcher().watch_all_from(
        WatchCursor.from_u64(1), capacity=16, floor_interval=0.3
    )
    await _overrun(kv)
    with pytest.raises(WatchError, match="overrun by retention"):
        while True:
            await asyncio.wait_for(watch.next_chunk(), 10)
    await watch.stop()


async def test_export_request_runs_between_flushes_at_the_stored_cursor(
    conn: Connection, bucket_name: str, make_store: Callable[[], SnapshotStore]
) -> None:
    kv = await conn.store(bucket_name)
    await bulk_put(kv, [(f"k{i}", b"v") for i in range(50)])
    store = make_store()
    requests: asyncio.Queue[ExportRequest] = asyncio.Queue()
    stop = asyncio.Event()
    task = asyncio.create_task(
        watch_applied(
            kv.watcher(), WatchScope.all(), store=store, export_requests=requests, shutdown=stop
        )
    )
    while store.cursor.as_u64() < 50:
        await asyncio.sleep(0.01)
    request = ExportRequest(lambda s, c: (c, s.cursor, len(list(s.iter_keys()))))
    await requests.put(request)
    cursor, store_cursor, n = await asyncio.wait_for(request.reply, 5)
    assert cursor == store_cursor == WatchCursor.from_u64(50) and n == 50
    stop.set()
    assert await task == WatchCursor.from_u64(50)
    store.close()


async def test_every_operation_is_bounded_by_a_timeout() -> None:
    with pytest.raises(Timeout):
        await timed(asyncio.sleep(10), 0.05, "sleep")


async def test_cancel_and_wait_ends_a_task_that_swallowed_its_first_cancel() -> None:
    """What ``waymark fold`` does with its exporter and reporter when it stops: a task
    that swallows one cancel (as nats-py's own ``wait_for`` can) is cancelled again
    until it ends, where one cancel and an await waited for it forever."""
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task), 10)
    assert task.cancelled() and swallowed == 1


async def test_a_cancel_that_meets_the_answer_is_not_swallowed() -> None:
    """The answer arrives, then the task awaiting it is cancelled before it has run
    again (a fold told to stop while its export round's request completes), one to
    three loop steps later. A cancel of a task not yet done must win: Python 3.11's
    ``asyncio.wait_for`` returned the answer instead, the task went on as if never
    cancelled, and a ``waymark fold`` given SIGTERM waited for it forever."""
    loop = asyncio.get_running_loop()
    for steps in range(4):
        answer: asyncio.Future[int] = loop.create_future()

        async def request(answer: asyncio.Future[int] = answer) -> int:
            return await answer

        task = asyncio.create_task(timed(request(), 10, "request"))
        await asyncio.sleep(0)  # it waits for the answer
        answer.set_result(1)
        for _ in range(steps):
            await asyncio.sleep(0)
        if task.cancel():  # not done yet: the cancel wins
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            assert await task == 1, steps


class Progress:
    """``on_applied`` for a test: the last cursor reported, and a way to wait for one."""

    def __init__(self) -> None:
        self.cursor = 0
        self._changed = asyncio.Event()

    def __call__(self, cursor: WatchCursor) -> None:
        self.cursor = cursor.as_u64()
        self._changed.set()

    async def reach(self, target: int, loop_task: asyncio.Task[Any]) -> None:
        """Wait until the cursor reaches ``target``; raise what ended ``loop_task`` first."""
        while self.cursor < target:
            self._changed.clear()
            changed = asyncio.ensure_future(self._changed.wait())
            done, _ = await asyncio.wait({changed, loop_task}, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            if loop_task in done:
                loop_task.result()  # raises what killed the loop
                raise AssertionError("watch_applied ended before reaching the cursor")


async def test_an_export_requester_that_gave_up_does_not_kill_the_fold(
    conn: Connection, bucket_name: str, tmp_path: Path
) -> None:
    kv = await conn.store(bucket_name)
    await bulk_put(kv, [(f"k{i}", b"v") for i in range(10)])
    store = open_store(f"lmdb:{tmp_path / 'f'}")
    requests: asyncio.Queue[ExportRequest] = asyncio.Queue()
    stop = asyncio.Event()
    progress = Progress()
    task = asyncio.create_task(
        watch_applied(
            kv.watcher(),
            WatchScope.all(),
            store=store,
            export_requests=requests,
            shutdown=stop,
            on_applied=progress,
        )
    )
    await asyncio.wait_for(progress.reach(10, task), 10)

    # A requester gives up (its wait is cancelled, as wait_for's timeout does)
    # while the export runs on the worker thread.
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    release = threading.Event()

    def slow_export(s: SnapshotStore, c: WatchCursor) -> WatchCursor:
        loop.call_soon_threadsafe(started.set)
        release.wait(10)
        return c

    abandoned = ExportRequest(slow_export)
    await requests.put(abandoned)
    requester = asyncio.ensure_future(asyncio.wait_for(abandoned.reply, 30))
    await asyncio.wait_for(started.wait(), 10)
    requester.cancel()
    await asyncio.gather(requester, return_exceptions=True)
    assert abandoned.reply.cancelled()
    release.set()

    # One that gave up before its turn came: its export is not run at all.
    ran: list[WatchCursor] = []
    early = ExportRequest(lambda s, c: ran.append(c))
    early.reply.cancel()
    await requests.put(early)

    # The fold keeps applying ...
    await bulk_put(kv, [(f"k{i}", b"w") for i in range(10, 15)])
    await asyncio.wait_for(progress.reach(15, task), 10)
    # ... and a later export request is answered at the stored cursor.
    later = ExportRequest(lambda s, c: (c, s.cursor))
    await requests.put(later)
    assert await asyncio.wait_for(later.reply, 10) == (WatchCursor.from_u64(15),) * 2
    assert ran == []
    stop.set()
    assert await task == WatchCursor.from_u64(15)
    store.close()


async def test_an_unknown_marker_reason_reads_as_a_removal_without_stalling(
    nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path
) -> None:
    """A marker of a kind this client does not know (a newer server's) has no value:
    listings, reads and folds treat it as a delete. Skipping it instead left it
    uncounted, so a listing waited out its whole timeout."""
    # The default 30 s timeout: the stall this used to be.
    async with Connection(NatsConnectionConfig(url=nats_server.url)) as conn:
        kv = await conn.store(bucket_name)
        w = kv.writer()
        for key in ("a", "gone", "z"):
            await w.put(key, b"v-" + key.encode())
        store = open_store(f"lmdb:{tmp_path / 'f'}")
        await fold(kv, store)
        await kv.js.publish(
            f"{kv.subject_prefix}gone", b"", headers={"Nats-Marker-Reason": "SomeFutureReason"}
        )
        r = kv.reader()
        assert await asyncio.wait_for(r.keys(), 5) == ["a", "z"]
        scanned = await asyncio.wait_for(r.scan(), 5)
        assert [(e.key, e.value) for e in scanned] == [("a", b"v-a"), ("z", b"v-z")]
        assert await r.get("gone") is None
        watch = await kv.watcher().watch_all()
        chunk = await asyncio.wait_for(watch.next_chunk(), 5)
        assert [(u.op, u.key) for u in chunk] == [(Op.PUT, "a"), (Op.PUT, "z"), (Op.DELETE, "gone")]
        await watch.stop()
        await fold(kv, store)  # resumes from the cursor: the marker arrives as a delete
        assert fold_state(store) == {"a": b"v-a", "z": b"v-z"}
        store.close()


def losing_one_delivery(
    at: int, change: Callable[[], Awaitable[None]] | None = None, *, every_consumer: bool = False
) -> type[OrderedFeed]:
    """Fault injector: a listing's consumer loses its ``at``-th delivery in transit, as a
    dropped message would, after ``change()`` wrote to the bucket under it. The gap in
    consumer sequence is what makes a real ordered consumer reset mid-listing."""
    fired = False

    class LosingFeed(OrderedFeed):
        lost_one = False

        async def _on_msg(self, gen: int, msg: Msg) -> None:
            nonlocal fired
            lose = not self.lost_one and (every_consumer or not fired)
            if lose and msg.reply and self.delivered == at - 1:
                fired = self.lost_one = True
                if change is not None:
                    await change()
                return
            await super()._on_msg(gen, msg)

    return LosingFeed


@pytest.mark.parametrize("read", ["scan", "keys"])
async def test_a_consumer_reset_mid_listing_still_lists_the_current_contents(
    conn: Connection, bucket_name: str, monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    kv = await conn.store(bucket_name)
    contents = {f"k{i:03}": b"v0" for i in range(300)}
    await bulk_put(kv, list(contents.items()))
    w = kv.writer()

    async def change() -> None:
        """Keys already listed and keys not yet listed change while the listing runs."""
        for key in ("k010", "k200"):
            await w.put(key, b"new")
            contents[key] = b"new"
        for key in ("k020", "k250"):
            await w.delete(key)
            del contents[key]
        await w.put("k999", b"added")
        contents["k999"] = b"added"

    monkeypatch.setattr(bucket_module, "OrderedFeed", losing_one_delivery(100, change))
    r = kv.reader()
    if read == "scan":
        listed = await asyncio.wait_for(r.scan(), 20)
        assert sorted((e.key, e.value) for e in listed) == sorted(contents.items())
        current = [await r.get(e.key) for e in listed]
        assert [e.version for e in listed] == [c.version for c in current if c is not None]
    else:
        assert sorted(await asyncio.wait_for(r.keys(), 20)) == sorted(contents)


async def test_a_listing_whose_consumer_keeps_getting_lost_fails_instead_of_looping(
    conn: Connection, bucket_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kv = await conn.store(bucket_name)
    await bulk_put(kv, [(f"k{i}", b"v") for i in range(50)])
    monkeypatch.setattr(bucket_module, "OrderedFeed", losing_one_delivery(10, every_consumer=True))
    with pytest.raises(KvError, match="lost"):
        await asyncio.wait_for(kv.reader().keys(), 20)
    assert (await kv.js.stream_info(kv.stream)).state.consumer_count == 0


async def test_a_listing_whose_messages_are_purged_under_it_starts_over(
    conn: Connection, bucket_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing's consumer was created owing 400 messages; after the server stopped at
    its flow-control window the stream is purged. nats-server skips the removed ones one
    per wake-up, so the listing used to wait out its timeout ("scan stalled") and a
    resync's listing failed the fold. It now starts over at the next idle heartbeat and
    lists what the bucket holds. (A values listing: headers alone never fill the window.)"""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None, max_history=64))
    value = b"x" * 16_384  # 2 MB (the server's flow-control window) is ~128 of them
    await bulk_put(kv, [(f"k{i:04}", value) for i in range(400)])
    purged = False

    class Overtaken(OrderedFeed):
        async def _on_msg(self, gen: int, msg: Msg) -> None:
            """Fault injector: the reader is slow at the 10th message (a loaded client);
            meanwhile retention takes what the server has not sent yet."""
            nonlocal purged
            if not purged and msg.reply and self.delivered == 10:
                purged = True
                arrived, sub = -1, self._sub
                while sub is not None and sub.delivered != arrived:
                    arrived = sub.delivered  # until the server stops at its window
                    await asyncio.sleep(0.05)
                assert arrived < 350, "the server sent past the purge point"
                await kv.js.purge_stream(kv.stream, seq=350)
            await super()._on_msg(gen, msg)

    monkeypatch.setattr(bucket_module, "OrderedFeed", Overtaken)
    listed = await asyncio.wait_for(kv.reader().scan(), 20)
    assert purged
    assert sorted(e.key for e in listed) == [f"k{i:04}" for i in range(349, 400)]  # k0349: 350


async def test_a_delivery_whose_handling_fails_fails_the_watch(
    conn: Connection, bucket_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-py gives an error raised in a subscription's callback to the connection's
    error callback (which ignores it) and goes on with the next message: a delivery
    whose handling failed was skipped without a word. It fails the watch now."""
    kv = await conn.store(bucket_name)
    w = kv.writer()
    await w.put("a", b"1")
    await w.delete("b")
    await w.put("c", b"3")

    def failing_update_op(headers: dict[str, str] | None) -> Op:
        """Fault injector: reading the delete marker's headers fails (a client bug)."""
        raise ValueError("cannot read the marker")

    monkeypatch.setattr(consumer_module, "update_op", failing_update_op)
    seen: list[str] = []
    async with await kv.watcher().watch_all() as watch:
        with pytest.raises(WatchError, match="delivery failed: ValueError"):
            async with asyncio.timeout(10):
                async for update in watch.updates():
                    seen.append(update.key)
    assert "c" not in seen  # nothing after the failed one
