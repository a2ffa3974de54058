"""Topic priority (docs/topics.md, Priority) through the real server: when more
delivery work is ready than a round takes, the higher-priority topics' subscribers are
served first, and priority changes neither the order nor the content of what each
subscriber gets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from waymark.client import AsyncClient, RecordEvent, RecordIn
from waymark.log import ConfigPatch

BURST = 50


# One wakeup per round, or all four in one round: either way highest priority first.
@pytest.mark.parametrize("budget", ["1", "32"])
async def test_high_priority_subscribers_are_delivered_first(
    start_waymark: Callable[..., Any], budget: str
) -> None:
    server = start_waymark("--delivery-budget", budget)
    # Interleaved: routers forward in the order they were made, so the burst commits
    # low-1, high-1, low-2, high-2, and commit order alone would alternate them.
    dests = {"low-1": -1000, "high-1": 1000, "low-2": -1000, "high-2": 1000}
    arrivals: list[str] = []  # the topic of each event, in the order they reached us
    received: dict[str, list[object]] = {name: [] for name in dests}
    attached = {name: asyncio.Event() for name in dests}
    async with AsyncClient(server.url) as client:
        for name, priority in dests.items():
            await client.put_topic(name, ConfigPatch(priority=priority))
            await client.put_router(f"to-{name}", "burst", name)

        async def follow(name: str) -> None:
            async for event in client.watch(name):
                assert isinstance(event, RecordEvent)
                received[name].append(event.record.data)
                arrivals.append(name)
                attached[name].set()
                if len(received[name]) == 1 + BURST:
                    return

        followers = [asyncio.create_task(follow(name)) for name in dests]
        # One record first: each subscriber has it once its stream is attached.
        await client.append("burst", [RecordIn.of("warm-up")])
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in attached.values())), 30)
        arrivals.clear()
        # The burst: one source append, four dest commits in one forwarding step, four
        # subscribers to wake.
        await client.append("burst", [RecordIn.of(i) for i in range(BURST)])
        await asyncio.wait_for(asyncio.gather(*followers), 30)

    order = list(dict.fromkeys(arrivals))  # each topic where its first burst event came
    assert sorted(order[:2]) == ["high-1", "high-2"], arrivals
    last_high = max(i for i, name in enumerate(arrivals) if name.startswith("high"))
    first_low = min(i for i, name in enumerate(arrivals) if name.startswith("low"))
    assert last_high < first_low, arrivals
    # Priority orders delivery only: every subscriber got every record, in seq order.
    for name in dests:
        assert received[name] == ["warm-up", *range(BURST)], name
