"""The server's delivery rounds (waymark.server.delivery) on a real event loop: one round
per turn of the loop, at most ``budget`` items, highest topic priority first."""

from __future__ import annotations

import asyncio
import logging

import pytest

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Engine
from waymark.server.delivery import Deliveries


def engine_with(priorities: dict[str, int]) -> Engine:
    engine = Engine(clock=ManualClock())
    for name, priority in priorities.items():
        engine.put_topic(name, ConfigPatch(priority=priority, auto_priority=False))
    return engine


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_without_pressure_everything_runs_at_the_next_turn() -> None:
    deliveries = Deliveries(engine_with({"a": 0, "b": 5}), budget=32)
    ran: list[str] = []
    deliveries.add(ran.append, "a")
    deliveries.add(ran.append, "b")
    deliveries.add(ran.append, "a")  # still pending: one run serves both
    assert ran == []  # never on the spot: the committing request finishes first
    await turns(1)
    assert ran == ["b", "a"]


async def test_under_pressure_a_round_takes_the_budget_highest_first() -> None:
    priorities = {"low": -1000, "mid": 0, "high": 1000, "top": 1000}
    deliveries = Deliveries(engine_with(priorities), budget=2)
    ran: list[str] = []
    for name in priorities:
        deliveries.add(ran.append, name)
    await turns(1)
    assert ran == ["high", "top"]  # equal priorities: in the order they were added
    deliveries.add(ran.append, "high")  # new high work overtakes what waits
    await turns(1)
    assert ran == ["high", "top", "high", "mid"]
    await turns(1)
    assert ran == ["high", "top", "high", "mid", "low"]


async def test_work_added_by_a_step_waits_for_the_next_round() -> None:
    deliveries = Deliveries(engine_with({"src": 0, "dst": 1000}), budget=8)
    ran: list[str] = []

    def forward(topic: str) -> None:
        ran.append(f"forward {topic}")
        deliveries.add(lambda t: ran.append(f"wake {t}"), "dst")  # its dest's readers
        if ran.count("forward src") < 3:
            deliveries.add(forward, "src")  # more to forward: the next page

    deliveries.add(forward, "src")
    await turns(1)
    assert ran == ["forward src"]
    await turns(1)
    assert ran == ["forward src", "wake dst", "forward src"]


async def test_a_step_may_take_the_whole_round() -> None:
    deliveries = Deliveries(engine_with({"mem": 1000, "other": 0}), budget=8)
    ran: list[str] = []

    def recover(topic: str) -> int:
        ran.append(topic)
        return deliveries.budget

    deliveries.add(recover, "mem")
    deliveries.add(ran.append, "other")
    await turns(1)
    assert ran == ["mem"]
    await turns(1)
    assert ran == ["mem", "other"]


async def test_a_failing_step_strands_nothing(caplog: pytest.LogCaptureFixture) -> None:
    deliveries = Deliveries(engine_with({"bad": 1000, "good": 0}), budget=8)
    ran: list[str] = []

    def fail(topic: str) -> None:
        raise RuntimeError("boom")

    deliveries.add(fail, "bad")
    deliveries.add(ran.append, "good")
    with caplog.at_level(logging.ERROR, logger="waymark.server.delivery"):
        await turns(1)
    assert ran == ["good"] and "boom" in caplog.text
