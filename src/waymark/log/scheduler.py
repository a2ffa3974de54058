"""Delivery scheduling by effective priority: higher P_eff is served first.

What priority does in waymark, and what it never does, is in docs/topics.md (Priority).

Pending delivery work (waking a topic's readers after a commit, a forwarding step of
a router source, a gradual-replay step) waits here as one item per key, with its
topic and the time it was enqueued, and :meth:`DeliveryScheduler.pop` hands out the
highest P_eff first. The scheduler only decides *when* work runs: the work itself
reads the log by cursor as always, so priority never changes seq order, retention or
what a reader sees.

P_eff is evaluated at one instant for every pending item, the aging tick, which is
never more than ``TICK_MS`` old when an item is added or popped. An item added between
two ticks is evaluated at the same instant (it has not aged yet), so the pending items
are always ordered by values of one moment, and between ticks each add and pop costs
a heap operation. Ties go to the item that has waited longest.

Aging adds +100 per second waited, up to +1000 at ``AGE_CAP_MS``: that cannot lift a
priority -1000 topic above a busy +1000 one (the manual and recency terms span 2500).
So an item whose aging is saturated is *starving* and goes before every other item,
the longest-waiting first. With K distinct keys and pops in rounds of B, any item is
therefore served within ceil(K / B) rounds once it has waited AGE_CAP_MS + TICK_MS.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from heapq import heapify, heappop, heappush
from typing import Generic, TypeVar

from ..clock import Clock
from .priority import AGE_CAP_MS

TICK_MS = 50

K = TypeVar("K", bound=Hashable)
# (topic, now, enqueued_at) -> P_eff of work for that topic waiting since enqueued_at;
# the server passes Engine.delivery_priority.
Rank = Callable[[str, int, int], int]

STARVING, RANKED = 0, 1
# (STARVING, 0, enqueued_at, serial, key, topic) or (RANKED, -P_eff, ...): the unique
# serial decides before the key is ever compared.
_Entry = tuple[int, int, int, int, K, str]


class DeliveryScheduler(Generic[K]):
    def __init__(self, clock: Clock, rank: Rank) -> None:
        self._clock = clock
        self._rank = rank
        self._heap: list[_Entry[K]] = []
        self._pending: set[K] = set()
        self._serial = 0
        self._due = -1  # the next aging tick is due at this clock time
        self.evaluated_at = 0  # the instant every pending item's P_eff is computed at

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, key: K, topic: str) -> bool:
        """Enqueue work ``key`` for ``topic``; False if ``key`` is already pending (it
        keeps its place and its older enqueue time: one run serves both)."""
        if key in self._pending:
            return False
        now = self._clock.now_ms()
        if now >= self._due:
            self._tick(now)
        self._serial += 1
        heappush(self._heap, self._entry(key, topic, now, self._serial))
        self._pending.add(key)
        return True

    def pop(self) -> K | None:
        """The pending key to serve now (highest P_eff; starving keys first), or None."""
        if not self._heap:
            return None
        now = self._clock.now_ms()
        if now >= self._due:
            self._tick(now)
        key = heappop(self._heap)[4]
        self._pending.discard(key)
        return key

    def _tick(self, now: int) -> None:
        self.evaluated_at = now
        self._due = now + TICK_MS
        if self._heap:
            self._heap = [self._entry(k, t, e, s) for _, _, e, s, k, t in self._heap]
            heapify(self._heap)

    def _entry(self, key: K, topic: str, enqueued_at: int, serial: int) -> _Entry[K]:
        at = self.evaluated_at
        if at - enqueued_at >= AGE_CAP_MS:
            return (STARVING, 0, enqueued_at, serial, key, topic)
        return (RANKED, -self._rank(topic, at, enqueued_at), enqueued_at, serial, key, topic)
