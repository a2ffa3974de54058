"""TTL (docs/semantics/topics.md §5.2) and the mixed tombstone, in process with a manual clock.

The app runs on httpx's ASGI transport, so time moves only when the test says.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from waymark.clock import ManualClock
from waymark.log import TopicConfig
from waymark.log.config import EngineConfig
from waymark.server import App, ServerConfig


@pytest.fixture
async def http(clock: ManualClock) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=App(clock=clock))
    async with httpx.AsyncClient(transport=transport, base_url="http://waymark") as client:
        yield client


async def write(http: httpx.AsyncClient, *data: Any) -> list[int]:
    response = await http.post("/v0/topics/t/records",
                               json={"records": [{"data": d} for d in data]})  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()["seqs"]


async def diff(http: httpx.AsyncClient, from_seq: int) -> dict[str, Any]:
    response = await http.post("/v0/topics/t/diff", json={"from_seq": from_seq})
    assert response.status_code == 200, response.text
    return response.json()


async def test_expiry_is_strict_and_reported_as_a_ttl_tombstone(http, clock) -> None:
    await http.put("/v0/topics/t", json={"ttl_ms": 1000})
    await write(http, "old")
    clock.advance(500)
    await write(http, "new")
    clock.advance(500)  # now - ts == ttl_ms for "old": not yet expired
    assert [r["data"] for r in (await diff(http, 0))["records"]] == ["old", "new"]
    clock.advance(1)
    page = await diff(http, 0)
    assert page["tombstone"] == {
        "$type": "tombstone", "$seq": 2, "gap_from": 1, "gap_to": 1, "reason": "ttl",
        "missed_estimate": 1, "earliest_seq": 2, "head_seq": 2,
    }  # fmt: skip
    assert [r["data"] for r in page["records"]] == ["new"]


async def test_expired_records_leave_count_bytes_and_earliest_seq(http, clock) -> None:
    await http.put("/v0/topics/t", json={"ttl_ms": 100})
    await write(http, "a", "b")
    clock.advance(101)
    state = (await http.get("/v0/topics/t")).json()
    assert (state["count"], state["bytes"]) == (0, 0)
    assert (state["earliest_seq"], state["evict_floor"], state["head_seq"]) == (3, 3, 2)
    page = await diff(http, 0)
    assert page["records"] == [] and page["tombstone"]["reason"] == "ttl"


async def test_ttl_moves_the_floor_with_no_writes(http, clock) -> None:
    await http.put("/v0/topics/t", json={"ttl_ms": 100})
    await write(http, 1)
    clock.advance(60)
    await write(http, 2)
    clock.advance(60)
    assert (await http.get("/v0/topics/t")).json()["earliest_seq"] == 2


async def test_cap_and_ttl_together_give_a_mixed_tombstone(http, clock) -> None:
    await http.put("/v0/topics/t", json={"ttl_ms": 1000, "cap_records": 2})
    for i in range(3):  # seq 1 falls to the cap
        await write(http, i)
    clock.advance(600)
    await write(http, 3)  # seq 2 falls to the cap
    clock.advance(401)  # seqs 3 expires; seq 4 is 401 ms old and lives
    page = await diff(http, 0)
    tomb = page["tombstone"]
    assert (tomb["gap_from"], tomb["gap_to"], tomb["reason"]) == (1, 3, "mixed")
    assert [r["$seq"] for r in page["records"]] == [4]


async def test_no_tombstone_when_expiry_stays_below_the_cursor(http, clock) -> None:
    await http.put("/v0/topics/t", json={"ttl_ms": 100})
    await write(http, 1, 2)
    clock.advance(101)
    await write(http, 3)
    page = await diff(http, 2)
    assert page["tombstone"] is None
    assert [r["$seq"] for r in page["records"]] == [3]


async def test_ttl_applies_at_read_time_to_a_long_poll_too(http, clock) -> None:
    await http.put("/v0/topics/t", json={"ttl_ms": 100})
    await write(http, 1)
    clock.advance(101)
    response = await http.post("/v0/topics/t/diff", json={"from_seq": 0, "wait_ms": 10})
    assert response.json()["tombstone"]["reason"] == "ttl"


async def test_topics_default_auto_create_false_refuses_lazy_create() -> None:
    app = App(ServerConfig(engine=EngineConfig(defaults=TopicConfig(auto_create=False))))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://waymark") as http:
        body = {"records": [{"data": 1}]}
        response = await http.post("/v0/topics/t/records", json=body)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "topic_not_found"
        created = await http.post("/v0/topics/t/records", json={**body, "create": True})
        assert created.json()["seqs"] == [1]
