"""Live watches over a bucket, delivered as chunks of :class:`KvUpdate`.

Every watch without a cursor is a state-sync stream (last value per key first,
then live), so a consumer converges from the watch alone with no seed-then-
watch race. The ``_from`` variants resume after a cursor and deliver only the
delta; they check the resume window before attaching because NATS would
silently clamp a start below its first sequence, and silently deliver nothing
from beyond its last one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from nats.js import api

from waymark.kv.consumer import END, HEARTBEAT, ConsumerSpec, Failed, OrderedFeed
from waymark.kv.errors import CursorExpired, WatchError
from waymark.kv.guards import resume_window_ok, resume_within_stream
from waymark.kv.types import KvUpdate, WatchCursor, WatchScope

if TYPE_CHECKING:
    from waymark.kv.bucket import KvStore

DEFAULT_CAPACITY = 256
FLOOR_GUARD_INTERVAL = 30.0


class KvWatch:
    """A running watch. Iterate it for chunks (lists) of updates, in revision order.

    At most ``capacity`` updates wait in a chunk handed over, and one chunk
    waits in the channel: a slow reader backpressures the consumer, and
    through flow control the server.
    """

    def __init__(self, feed: OrderedFeed, queue: asyncio.Queue[object]) -> None:
        self._feed = feed
        self._queue = queue
        self._backstop: asyncio.Task[None] | None = None

    @property
    def frontier(self) -> int:
        """The last stream sequence delivered."""
        return self._feed.frontier

    async def next_chunk(self) -> list[KvUpdate] | None:
        """The next chunk; None once the watch was stopped. Raises the error that ended it."""
        item = await self._queue.get()
        if item is END:
            self._queue.put_nowait(END)  # stay ended for later calls
            return None
        if isinstance(item, Failed):
            self._queue.put_nowait(item)
            raise item.error
        return item  # type: ignore[return-value]

    def __aiter__(self) -> AsyncIterator[list[KvUpdate]]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[list[KvUpdate]]:
        while (chunk := await self.next_chunk()) is not None:
            yield chunk

    async def updates(self) -> AsyncIterator[KvUpdate]:
        """The same stream, one update at a time."""
        async for chunk in self._chunks():
            for u in chunk:
                yield u

    async def stop(self) -> None:
        if self._backstop is not None:
            self._backstop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._backstop
        await self._feed.stop()

    async def __aenter__(self) -> KvWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class KvWatcher:
    def __init__(self, store: KvStore) -> None:
        self._s = store

    async def watch_all(self, *, capacity: int = DEFAULT_CAPACITY) -> KvWatch:
        return await self.watch(WatchScope.all(), capacity=capacity)

    async def watch_prefix(self, prefix: str, *, capacity: int = DEFAULT_CAPACITY) -> KvWatch:
        return await self.watch(WatchScope.prefix(prefix), capacity=capacity)

    async def watch_prefixes(
        self, prefixes: Sequence[str], *, capacity: int = DEFAULT_CAPACITY
    ) -> KvWatch:
        """Several prefixes through ONE consumer (``filter_subjects``)."""
        return await self.watch(WatchScope.of(tuple(prefixes)), capacity=capacity)

    async def watch_all_from(
        self,
        cursor: WatchCursor,
        *,
        capacity: int = DEFAULT_CAPACITY,
        floor_interval: float = FLOOR_GUARD_INTERVAL,
        heartbeat: float = HEARTBEAT,
    ) -> KvWatch:
        return await self.watch(
            WatchScope.all(),
            cursor,
            capacity=capacity,
            floor_interval=floor_interval,
            heartbeat=heartbeat,
        )

    async def watch_prefix_from(
        self, prefix: str, cursor: WatchCursor, *, capacity: int = DEFAULT_CAPACITY
    ) -> KvWatch:
        return await self.watch(WatchScope.prefix(prefix), cursor, capacity=capacity)

    async def watch_prefixes_from(
        self, prefixes: Sequence[str], cursor: WatchCursor, *, capacity: int = DEFAULT_CAPACITY
    ) -> KvWatch:
        return await self.watch(WatchScope.of(tuple(prefixes)), cursor, capacity=capacity)

    async def check_resume_window(self, cursor: WatchCursor) -> None:
        """Raise CursorExpired unless resuming after ``cursor`` would miss nothing."""
        rev = cursor.as_u64()
        first, last = await self._s.stream_bounds()
        if not resume_within_stream(rev, last):
            raise CursorExpired(rev, first, last, "beyond the last sequence: bucket recreated?")
        if not resume_window_ok(rev, first):
            raise CursorExpired(rev, first, last, "retention evicted the sequences after it")

    async def watch(
        self,
        scope: WatchScope,
        cursor: WatchCursor | None = None,
        *,
        capacity: int = DEFAULT_CAPACITY,
        floor_interval: float = FLOOR_GUARD_INTERVAL,
        heartbeat: float = HEARTBEAT,
    ) -> KvWatch:
        """State-sync watch of ``scope``, or with a cursor, the delta after it.

        An All-scope resume watch runs the live floor guard: NATS silently skips
        messages that retention evicts under a live consumer, so a delivery
        that jumps the frontier, or (every ``floor_interval`` seconds without
        deliveries) the stream's head overtaking it, fails the watch with
        WatchError. A prefix watch sees sparse revisions by nature and cannot
        tell eviction from filtering; its protection is the resume-window
        check at the next restart. ``heartbeat`` is the consumer's idle
        heartbeat; after three silent ones the consumer is recreated from the
        frontier.
        """
        s = self._s
        resume = cursor is not None and not cursor.is_none
        frontier = 0
        if resume:
            assert cursor is not None
            await self.check_resume_window(cursor)
            frontier = cursor.as_u64()
        guarded = resume and scope.is_all
        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
        spec = ConsumerSpec(
            s.stream,
            s.subject_prefix,
            s.filters(scope.prefixes),
            api.DeliverPolicy.BY_START_SEQUENCE if resume else api.DeliverPolicy.LAST_PER_SUBJECT,
            start_seq=frontier + 1 if resume else None,
        )
        feed = OrderedFeed(
            s.js,
            spec,
            queue,
            chunk_max=capacity,
            timeout=s.timeout,
            floor_check=self._floor_check if guarded else None,
            frontier=frontier,
            heartbeat=heartbeat,
            reset_attempts=s.reset_attempts,
        )
        await feed.start()
        watch = KvWatch(feed, queue)
        if guarded:
            watch._backstop = asyncio.create_task(self._backstop(feed, floor_interval))
        return watch

    async def _floor_check(self, frontier: int, delivered: int) -> None:
        first, _ = await self._s.stream_bounds()
        if not resume_window_ok(frontier, first):
            raise WatchError(
                f"live watch overrun by retention: delivered {delivered} after {frontier}, "
                f"stream now starts at {first}"
            )

    async def _backstop(self, feed: OrderedFeed, interval: float) -> None:
        """Catch an overrun when nothing is delivered, so there is no in-band evidence."""
        seen = feed.delivered
        while True:
            await asyncio.sleep(interval)
            if feed.delivered != seen:
                seen = feed.delivered
                continue
            try:
                await self._floor_check(feed.frontier, feed.frontier)
            except Exception as e:
                await feed.fail(e if isinstance(e, WatchError) else WatchError(str(e)))
                return
