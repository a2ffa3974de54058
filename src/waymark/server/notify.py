"""Wake long-polls, SSE streams and queue ``/work`` streams when a topic changes.

The engine calls :meth:`Notifier.notify` synchronously after every commit, on
the event-loop thread. All waiters of one topic share a single future, so a
commit costs one dict lookup when nobody waits. When someone does, the wakeup is
delivery work for the topic's priority (:mod:`waymark.server.delivery`): it runs in
the next round, higher-priority topics first, and one ``set_result`` wakes every
reader of the topic, however many commits came before it ran.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from .delivery import Deliveries

# Streams that read and send in one turn of the event loop; the others woken by the
# same commit wait for the next turns (see Notifier.turn).
STREAMS_PER_TURN = 64


class Notifier:
    def __init__(self, deliveries: Deliveries, per_turn: int = STREAMS_PER_TURN) -> None:
        self._deliveries = deliveries
        self._changed: dict[str, asyncio.Future[None]] = {}
        self._closed: asyncio.Future[None] | None = None
        self.closing = False
        self._per_turn = per_turn
        self._taken = 0  # turns taken in this turn of the loop
        self._queued: deque[asyncio.Future[None]] = deque()
        self._next_turn: asyncio.Handle | None = None
        # SSE streams waiting for a change, by topic: a change queues them for turns.
        self._streams: dict[str, dict[asyncio.Future[None], None]] = {}

    async def turn(self) -> None:
        """Wait for this stream's turn to read and send. One commit wakes every stream
        of its topic at once, and 2,000 streams reading and sending (each its own TLS
        write) in one turn of the loop held every other request for most of a second;
        taking turns, at most ``per_turn`` of them go each turn, and between turns the
        loop reads its sockets, so a health check waits for a few turns, not all of
        them (docs/security.md, Limits). Returns at once when few streams are woken."""
        if self._taken < self._per_turn and not self._queued:
            self._taken += 1
            self._schedule_turn()
            return
        mine = asyncio.get_running_loop().create_future()
        self._queued.append(mine)
        self._schedule_turn()
        await mine

    def _schedule_turn(self) -> None:
        if self._next_turn is None:
            self._next_turn = asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        self._next_turn = None
        self._taken = 0
        queued = self._queued
        while queued and self._taken < self._per_turn:
            waiter = queued.popleft()
            if not waiter.done():  # (a stream that went away)
                waiter.set_result(None)
                self._taken += 1
        if queued:
            self._schedule_turn()

    def notify(self, topic: str) -> None:
        if topic in self._changed:
            self._deliveries.add(self._wake, topic)

    def _wake(self, topic: str) -> None:
        future = self._changed.pop(topic, None)
        if future is not None and not future.done():
            future.set_result(None)
        streams = self._streams.pop(topic, None)
        if streams:
            self._queued.extend(streams)
            self._schedule_turn()

    def wake_all(self) -> None:
        """Wake every waiter as if its topic changed: each stream re-checks what it may
        still send (a tokens reload may have revoked it, docs/security.md)."""
        for topic in set(self._changed) | set(self._streams):
            self._wake(topic)

    def close(self) -> None:
        """Release every waiter for good: the server is shutting down."""
        self.closing = True
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def next_change(self, topic: str) -> asyncio.Future[None]:
        """The future the next commit to ``topic`` completes. A reader that awaits
        something (a send) between its read and its wait takes this *before* the read,
        so a commit landing in between wakes it instead of being missed."""
        changed = self._changed.get(topic)
        if changed is None or changed.done():
            changed = self._changed[topic] = asyncio.get_running_loop().create_future()
        return changed

    async def wait(
        self,
        topic: str,
        timeout: float,
        also: asyncio.Future[Any] | None = None,
        changed: asyncio.Future[None] | None = None,
    ) -> bool:
        """Wait until ``topic`` changes (``changed``: since that future was taken),
        ``timeout`` seconds pass, ``also`` completes or the server closes. True when
        the topic changed."""
        if self.closing:
            return False
        loop = asyncio.get_running_loop()
        if changed is None:
            changed = self.next_change(topic)
        if self._closed is None:
            self._closed = loop.create_future()
        waits: set[asyncio.Future[Any]] = {changed, self._closed}
        if also is not None:
            waits.add(also)
        # asyncio.wait (unlike wait_for) never cancels the shared future on timeout.
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return changed.done()

    async def wait_turn(
        self,
        topic: str,
        timeout: float,
        also: asyncio.Future[Any],
        changed: asyncio.Future[None],
    ) -> bool:
        """:meth:`wait` for an SSE stream, which a change wakes in its turn (see
        :meth:`turn`): the streams of a topic are queued for turns when it changes, not
        all woken at once, since even waking 2,000 of them in one turn of the loop held
        it for a tenth of a second. True when the topic changed; the stream then has
        its turn."""
        if self.closing:
            return False
        if changed.done():  # a change since the stream's last read
            await self.turn()
            return True
        loop = asyncio.get_running_loop()
        if self._closed is None:
            self._closed = loop.create_future()
        mine: asyncio.Future[None] = loop.create_future()
        waiting = self._streams.setdefault(topic, {})
        waiting[mine] = None
        try:
            await asyncio.wait((mine, also, self._closed), timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            if not mine.done():  # a timeout, a disconnect: no turn for it, and no entry
                mine.cancel()
                waiting.pop(mine, None)
                if not waiting and self._streams.get(topic) is waiting:
                    del self._streams[topic]
        return not mine.cancelled()
