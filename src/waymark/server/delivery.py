"""Delivery rounds: the engine's priority scheduler (:mod:`waymark.log.scheduler`) run
on the event loop.

Work that delivers a topic's data (waking its SSE streams, long-polls and queue
``/work`` streams after a commit, a router forwarding step of a source, a gradual
recovery step) is added here instead of being run on the spot. The first addition
schedules a round for the next turn of the loop; a round runs at most ``budget`` items,
highest effective priority first, and if work is left schedules the next round behind
whatever else is ready. So when the server keeps up, every item runs on the next turn,
and when more is ready than a round takes, the higher-priority topics' deliveries go
first while the rest wait their turn (aging makes sure they get one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..log import Engine
from ..log.scheduler import DeliveryScheduler

log = logging.getLogger(__name__)

# The work, called with its topic. It returns how much of a round it used, in items
# (None: one), so one heavy step can take a whole round, as a recovery step does.
Step = Callable[[str], int | None]
ROUND_BUDGET = 32  # items per round when the server is not told otherwise


class Deliveries:
    def __init__(self, engine: Engine, budget: int = ROUND_BUDGET) -> None:
        if budget < 1:
            raise ValueError("a delivery round runs at least one item")
        self.budget = budget
        self.scheduler: DeliveryScheduler[tuple[Step, str]] = DeliveryScheduler(
            engine.clock, engine.delivery_priority
        )
        self._round: asyncio.Handle | None = None

    def add(self, step: Step, topic: str) -> None:
        """Run ``step(topic)`` in a coming round: once, however often it is added
        before it runs. Must be called on the event loop."""
        if self.scheduler.add((step, topic), topic) and self._round is None:
            self._round = asyncio.get_running_loop().call_soon(self._run_round)

    def _run_round(self) -> None:
        self._round = None
        scheduler = self.scheduler
        # No more items than were pending: work a step adds (a forwarding step's next
        # page, the wakeups of its dest) waits for the next turn of the loop.
        left = min(self.budget, len(scheduler))
        while left > 0:
            key = scheduler.pop()
            if key is None:
                return
            step, topic = key
            try:
                left -= step(topic) or 1
            except Exception:
                # One failed step must not strand the work queued behind it.
                log.exception("delivery step %s(%r) failed", step.__name__, topic)
                left -= 1
        if scheduler and self._round is None:
            self._round = asyncio.get_running_loop().call_soon(self._run_round)
