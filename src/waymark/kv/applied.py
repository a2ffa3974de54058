"""``watch_applied``: batch, apply, *then* advance the cursor and fold into the store.

The single invariant: a persisted or reported cursor ``C`` implies every update
with revision <= ``C`` has been through ``apply`` (and, with a store, through
``store.apply``). The cursor is sourced from apply's completion, never from the
channel's delivery: a cursor moved on receipt would, after a crash, resume past
updates that were still sitting in an unapplied batch.

:class:`AppliedCursor` is that discipline as a synchronous state machine with
no I/O; :func:`watch_applied` drives it from a NATS watch. The property-based
models in tests/kv drive the same class.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from waymark.clock import Clock, SystemClock
from waymark.kv.bucket import KvReader
from waymark.kv.consumer import END, Failed
from waymark.kv.deadline import cancel_and_wait
from waymark.kv.errors import CursorExpired, WatchError
from waymark.kv.guards import fallback_may_start
from waymark.kv.stores.protocol import SnapshotStore, stale_keys
from waymark.kv.types import NO_CURSOR, KvUpdate, WatchCursor, WatchScope
from waymark.kv.watcher import FLOOR_GUARD_INTERVAL, KvWatcher

log = logging.getLogger("waymark.kv")

T = TypeVar("T")

MAX_STORE_APPLY_FAILURES = 16
"""Consecutive failed ``store.apply`` calls before the watch fail-stops."""


@dataclass(frozen=True)
class BatchConfig:
    """When a batch flushes, and how deep the watch-to-loop channel is.

    ``window`` (seconds) bounds how long a batch stays open; ``max`` flushes
    early. ``channel_capacity`` is how many updates may wait between the watch
    task and the loop: a full channel backpressures the watch, and during a
    state-sync of a large bucket it is the effective batch boundary.
    """

    window: float = 0.010
    max: int = 100
    channel_capacity: int = 256
    floor_interval: float = FLOOR_GUARD_INTERVAL


@dataclass
class Flush(Generic[T]):
    """One flush in progress: what goes to ``apply`` and to the store, and its high revision."""

    parsed: list[T]
    raw: list[KvUpdate]
    high: int


class AppliedCursor(Generic[T]):
    """Cursor authority for ``watch_applied``, free of I/O.

    Per flush the driver calls ``begin_flush``, runs ``apply``, calls
    ``applied`` (the only place the cursor moves), runs the store, then
    ``stored`` or ``store_failed``.

    * ``batch_high`` covers every revision received, rejected ones included:
      revisions arrive in order, so having seen the highest means having seen
      all below it. An update with the unknown version never touches it.
    * A failed store apply re-queues its raw batch in front of the next one,
      so the store's data and cursor always advance together; 16 failures in
      a row fail-stop the watch.
    """

    def __init__(
        self,
        cursor: WatchCursor = NO_CURSOR,
        parse: Callable[[KvUpdate], T | None] | None = None,
        *,
        keep_parsed: bool = True,
        max_failures: int = MAX_STORE_APPLY_FAILURES,
    ) -> None:
        self.cursor = cursor  # every revision <= cursor has been through apply
        self.stored_cursor = cursor  # ... and through the store
        self.failures = 0
        self._parse = parse
        self._keep_parsed = keep_parsed
        self._max_failures = max_failures
        self._parsed: list[Any] = []
        self._raw: list[KvUpdate] = []  # not yet stored, re-queued batches first
        self._high = 0
        self._fresh = 0

    @property
    def batch_len(self) -> int:
        """Updates received since the last flush."""
        return self._fresh

    @property
    def has_work(self) -> bool:
        return bool(self._raw)

    def receive(self, updates: list[KvUpdate]) -> None:
        self._raw.extend(updates)
        self._fresh += len(updates)
        if self._keep_parsed:
            parse = self._parse
            if parse is None:
                self._parsed.extend(updates)
            else:
                for u in updates:
                    item = parse(u)
                    if item is not None:
                        self._parsed.append(item)
        for u in reversed(updates):  # in revision order: the last known one is the highest
            rev = u.version.as_u64()
            if rev is not None:
                self._high = max(self._high, rev)
                break

    def begin_flush(self) -> Flush[T]:
        f: Flush[T] = Flush(self._parsed, self._raw, self._high)
        self._parsed, self._raw, self._high, self._fresh = [], [], 0, 0
        return f

    def applied(self, flush: Flush[T]) -> WatchCursor:
        """``apply`` returned for ``flush``: only now may the cursor cover it."""
        if flush.high:
            self.cursor = WatchCursor.from_u64(flush.high)
        return self.cursor

    def stored(self, flush: Flush[T]) -> WatchCursor:
        self.stored_cursor = self.cursor
        self.failures = 0
        return self.cursor

    def store_failed(self, flush: Flush[T], error: BaseException) -> None:
        """Re-queue the raw batch; raise WatchError once failures reach the limit."""
        self._requeue(flush.raw)
        self.failures += 1
        if self.failures >= self._max_failures:
            raise WatchError(
                f"fold store failed {self.failures} times in a row; last error: {error}"
            ) from error

    def _requeue(self, raw: list[KvUpdate]) -> None:
        self._raw[:0] = raw

    def resync(self, store: SnapshotStore, live: Iterable[str], scope: WatchScope) -> list[str]:
        """Queue a synthetic delete for every in-scope fold key absent from ``live``.

        The deletes carry the unknown version, so they never move the cursor:
        a crash mid-resync re-runs the same idempotent diff on the next start.
        """
        stale = stale_keys(store, live, scope)
        self.receive([KvUpdate.delete(k, None) for k in stale])
        return stale


class ResyncRequest:
    """The watch task's listing of live keys, acknowledged by the loop once applied."""

    def __init__(self, live: frozenset[str]) -> None:
        self.live = live
        self.acknowledged = False
        self.error: BaseException | None = None
        self._done = asyncio.Event()

    def acknowledge(self) -> None:
        self.acknowledged = True
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._done.set()

    async def wait(self) -> None:
        await self._done.wait()


@dataclass
class ExportRequest:
    """Ask ``watch_applied`` to run ``action(store, cursor)`` between flushes.

    The pending batch is flushed first, so the cursor handed to ``action`` is
    exactly the one the store holds. ``action`` runs on a worker thread; its
    result (or error) arrives on ``reply``. This is the hook the export of
    fold artifacts plugs into. A requester may give up by cancelling ``reply``:
    the request is then skipped, or its late result dropped. A request the
    fold will never run (it stopped) gets WatchError on ``reply``: see
    :func:`submit_export`. It may be built anywhere; ``reply`` belongs to the
    event loop that first reads it.
    """

    action: Callable[[SnapshotStore, WatchCursor], Any]
    _reply: asyncio.Future[Any] | None = field(default=None, init=False, repr=False)

    @property
    def reply(self) -> asyncio.Future[Any]:
        if self._reply is None:
            self._reply = asyncio.get_running_loop().create_future()
        return self._reply


# Export queues whose fold stopped, and why: a request put on one afterwards is
# answered at once instead of waiting for a fold that is gone.
_stopped_queues: weakref.WeakKeyDictionary[asyncio.Queue[ExportRequest], BaseException] = (
    weakref.WeakKeyDictionary()
)


async def submit_export(requests: asyncio.Queue[ExportRequest], request: ExportRequest) -> Any:
    """Queue ``request`` for the fold reading ``requests`` and wait for its result.

    Raises WatchError at once if that fold has stopped (or stops before the
    request's turn), rather than waiting forever.
    """
    await requests.put(request)
    if (stopped := _stopped_queues.get(requests)) is not None:
        _answer_stopped(requests, stopped)
    return await request.reply


def _close_export_queue(requests: asyncio.Queue[ExportRequest], why: BaseException) -> None:
    """The fold reading ``requests`` stopped: answer what waits, and what comes later."""
    _stopped_queues[requests] = why
    _answer_stopped(requests, why)


def _answer_stopped(requests: asyncio.Queue[ExportRequest], why: BaseException) -> None:
    while not requests.empty():
        request = requests.get_nowait()
        _answer(request.reply, error=WatchError(f"the fold stopped before this export ran: {why}"))


async def _maybe_await(result: object) -> None:
    if inspect.isawaitable(result):
        await result


async def _run_watch(
    watcher: KvWatcher,
    scope: WatchScope,
    resume: WatchCursor,
    reader: KvReader | None,
    resync_possible: bool,
    data: asyncio.Queue[object],
    config: BatchConfig,
) -> None:
    """The watch task: resume (or resync and re-list) and forward chunks to the loop.

    A cursor found expired at the start, or by a reset mid-stream (the next
    revisions were evicted while the consumer was being recreated), takes the
    same resync path: list the live keys, have the loop delete the vanished
    ones, then re-list. The resync request travels on ``data`` behind every
    chunk already forwarded, so the loop applies those first.
    """
    try:
        watch = None
        if not resume.is_none:
            try:
                watch = await watcher.watch(
                    scope,
                    resume,
                    capacity=config.channel_capacity,
                    floor_interval=config.floor_interval,
                )
            except CursorExpired as e:
                await _resync_before_relist(e, scope, reader, resync_possible, data)
        while True:
            if watch is None:
                watch = await watcher.watch(scope, capacity=config.channel_capacity)
            try:
                async for chunk in watch:
                    await data.put(chunk)
            except CursorExpired as e:
                await watch.stop()
                watch = None
                await _resync_before_relist(e, scope, reader, resync_possible, data)
                continue
            finally:
                if watch is not None:
                    await watch.stop()
            break
        await data.put(END)
    except asyncio.CancelledError as e:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # watch_applied is stopping this task
        # Not ours: a cancellation that leaked out of a watch. Ending on it would
        # leave the loop waiting at its cursor for good (docs/semantics/kv.md §4.4).
        await data.put(Failed(WatchError(f"the watch ended on a stray cancellation: {e!r}")))
    except BaseException as e:
        await data.put(Failed(e))


async def _resync_before_relist(
    expired: CursorExpired,
    scope: WatchScope,
    reader: KvReader | None,
    resync_possible: bool,
    data: asyncio.Queue[object],
) -> None:
    log.warning("%s; resyncing", expired)
    if reader is None or not resync_possible:
        log.warning("no reader or store: keys deleted during the gap may stay stale")
        return
    try:
        live = await reader.keys(list(scope.prefixes) or "")
    except Exception as le:
        raise WatchError(f"resync could not list live keys: {le}") from le
    request = ResyncRequest(frozenset(live))
    await data.put(request)
    await request.wait()
    if not fallback_may_start(request.acknowledged):
        raise WatchError(f"resync failed: {request.error}") from request.error


async def watch_applied(
    watcher: KvWatcher,
    scope: WatchScope,
    apply: Callable[[list[Any]], object] | None = None,
    *,
    resume: WatchCursor | None = None,
    parse: Callable[[KvUpdate], Any | None] | None = None,
    store: SnapshotStore | None = None,
    reader: KvReader | None = None,
    config: BatchConfig | None = None,
    on_applied: Callable[[WatchCursor], object] | None = None,
    shutdown: asyncio.Event | None = None,
    export_requests: asyncio.Queue[ExportRequest] | None = None,
    clock: Clock | None = None,
) -> WatchCursor:
    """KvWatch ``scope``, apply batches, and advance the cursor only after they are applied.

    ``parse`` turns an update into the caller's item (None rejects it; without
    ``parse`` apply gets the raw updates). ``apply`` may be sync or async.
    With a ``store`` each flush folds the raw batch into it with the new
    cursor, on a worker thread, so read the store from ``on_applied`` or an
    ``ExportRequest`` rather than concurrently. ``resume`` defaults to the
    store's cursor. On ``CursorExpired`` with a ``reader`` and a ``store`` the
    fold is repaired first: keys that vanished during the gap get synthetic
    deletes, acknowledged before the state-sync re-list starts.

    Returns the cursor that both apply and store have reached, once
    ``shutdown`` is set or the watch ends; raises WatchError when the watch
    fails (stream lost, floor guard tripped, store failing 16 times in a row).
    """
    config = config or BatchConfig()
    clock = clock or SystemClock()
    if export_requests is not None:
        _stopped_queues.pop(export_requests, None)  # read again
    if resume is None:
        resume = store.cursor if store is not None else NO_CURSOR
    core: AppliedCursor[Any] = AppliedCursor(resume, parse, keep_parsed=apply is not None)
    window_ms = config.window * 1000
    deadline: float | None = None

    async def flush() -> None:
        nonlocal deadline
        deadline = None
        if not core.has_work:
            return
        f = core.begin_flush()
        if apply is not None and f.parsed:
            await _maybe_await(apply(f.parsed))
        cursor = core.applied(f)
        if store is not None:
            try:
                await asyncio.to_thread(store.apply, f.raw, cursor)
            except Exception as e:
                core.store_failed(f, e)
                log.warning(
                    "fold store apply failed (%d in a row), batch re-queued: %s", core.failures, e
                )
                # Retry even if no update arrives, backing off.
                deadline = clock.now_ms() + window_ms * min(2**core.failures, 100)
                return
        core.stored(f)
        if on_applied is not None:
            await _maybe_await(on_applied(cursor))

    data: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
    watch_task = asyncio.create_task(
        _run_watch(watcher, scope, resume, reader, store is not None, data, config)
    )
    waits: dict[str, asyncio.Future[Any]] = {"data": asyncio.ensure_future(data.get())}
    if shutdown is not None:
        waits["shutdown"] = asyncio.ensure_future(shutdown.wait())
    if export_requests is not None:
        waits["export"] = asyncio.ensure_future(export_requests.get())
    try:
        while True:
            timeout = None if deadline is None else max(0.0, (deadline - clock.now_ms()) / 1000)
            done, _ = await asyncio.wait(
                waits.values(), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                await flush()  # the window elapsed
                continue
            ready = {name for name, fut in waits.items() if fut in done}
            if "shutdown" in ready:
                await flush()
                return core.stored_cursor
            if "export" in ready:
                export: ExportRequest = waits["export"].result()
                waits["export"] = asyncio.ensure_future(export_requests.get())  # type: ignore[union-attr]
                await _export(core, flush, store, export)
            if "data" in ready:
                item = waits["data"].result()
                if item is END:
                    await flush()
                    return core.stored_cursor
                if isinstance(item, Failed):
                    await flush()
                    err = item.error
                    raise err if isinstance(err, WatchError) else WatchError(str(err)) from err
                waits["data"] = asyncio.ensure_future(data.get())
                if isinstance(item, ResyncRequest):
                    await _resync(core, flush, store, scope, item)
                    continue
                core.receive(item)  # type: ignore[arg-type]
                if core.batch_len >= config.max:
                    await flush()
                elif deadline is None:
                    deadline = clock.now_ms() + window_ms
    finally:
        for fut in waits.values():
            fut.cancel()
        if export_requests is not None:
            stopped = WatchError("watch_applied returned")
            taken = waits.get("export")
            if taken is not None and taken.done() and not taken.cancelled():
                # Taken off the queue in the round that returned: answer it too.
                _answer(taken.result().reply, error=WatchError(f"the fold stopped: {stopped}"))
            _close_export_queue(export_requests, stopped)
        with contextlib.suppress(Exception):  # it hands its failures over on ``data``
            await cancel_and_wait(watch_task)


async def _resync(
    core: AppliedCursor[Any],
    flush: Callable[[], Awaitable[None]],
    store: SnapshotStore | None,
    scope: WatchScope,
    request: ResyncRequest,
) -> None:
    """Flush, diff the fold against the listing, run synthetic deletes, then acknowledge."""
    try:
        await flush()
        assert store is not None  # the watch task asks only when a store is wired
        stale = core.resync(store, request.live, scope)
        await flush()
    except asyncio.CancelledError as e:
        request.fail(e)
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the fold is being stopped: not a failure of the resync
        # Not asked for (leaked out of apply): a failure, as in _run_watch
        # (docs/semantics/kv.md §4.4).
        raise WatchError(f"resync failed: a stray cancellation: {e!r}") from e
    except Exception as e:
        request.fail(e)
        raise WatchError(f"resync failed: {e}") from e
    log.warning("resync: %d stale key(s) deleted from the fold", len(stale))
    request.acknowledge()


async def _export(
    core: AppliedCursor[Any],
    flush: Callable[[], Awaitable[None]],
    store: SnapshotStore | None,
    request: ExportRequest,
) -> None:
    reply = request.reply
    if reply.done():
        # The requester gave up (a cancelled wait cancels the future) before
        # its turn: nobody would see the result, so spare the fold the export.
        log.info("export request withdrawn before it ran; skipped")
        return
    await flush()
    if store is None or core.has_work:
        _answer(
            reply,
            error=WatchError(
                "export refused: no fold store, or the store is behind the applied cursor"
            ),
        )
        return
    try:
        result = await asyncio.to_thread(request.action, store, core.stored_cursor)
    except Exception as e:
        _answer(reply, error=e)
    else:
        _answer(reply, result)


def _answer(
    reply: asyncio.Future[Any], result: Any = None, error: BaseException | None = None
) -> None:
    """Settle ``reply`` unless the requester gave up meanwhile; the fold goes on either way."""
    if reply.done():
        if error is not None:
            log.warning("export failed after its requester gave up: %s", error)
        return
    if error is not None:
        reply.set_exception(error)
    else:
        reply.set_result(result)
