"""Queues (docs/semantics/topics.md §10) over HTTP in process, on a manual clock: the app runs on
httpx's ASGI transport, so time moves only when a test says (nack delays, the
dead-letter retry interval)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from waymark.clock import ManualClock
from waymark.log import TopicConfig
from waymark.log.config import EngineConfig
from waymark.log.queue import DEAD_LETTER_RETRY_MS
from waymark.server import App, ServerConfig


class ClockedQueue:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def put(self, topic: str, **config: Any) -> None:
        response = await self.http.put(f"/v0/topics/{topic}", json=config)
        assert response.status_code in (200, 201), response.text

    async def post(self, topic: str, action: str, **body: Any) -> dict[str, Any]:
        response = await self.http.post(f"/v0/topics/{topic}/{action}", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    async def produce(self, topic: str, *data: Any) -> list[int]:
        return (await self.post(topic, "records", records=[{"data": d} for d in data]))["seqs"]

    async def claim(self, topic: str, node: str = "w", max_jobs: int = 10) -> list[dict[str, Any]]:
        return (await self.post(topic, "claim", node=node, max=max_jobs))["jobs"]

    async def state(self, topic: str) -> dict[str, Any]:
        response = await self.http.get(f"/v0/topics/{topic}", params={"touch": "false"})
        assert response.status_code == 200, response.text
        return response.json()

    async def records(self, topic: str) -> list[dict[str, Any]]:
        return (await self.post(topic, "diff", from_seq=0))["records"]

    async def metric(self, name: str) -> float:
        text = (await self.http.get("/metrics")).text
        [line] = [line for line in text.splitlines() if line.startswith(f"{name} ")]
        return float(line.split()[1])


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def serve(
    clock: ManualClock, config: ServerConfig | None = None
) -> AsyncIterator[ClockedQueue]:
    transport = httpx.ASGITransport(app=App(config, clock=clock))
    async with httpx.AsyncClient(transport=transport, base_url="http://waymark") as http:
        yield ClockedQueue(http)


@pytest.fixture
async def api(clock: ManualClock) -> AsyncIterator[ClockedQueue]:
    async for client in serve(clock):
        yield client


# --- nack delays --------------------------------------------------------------------------


async def test_nack_releases_at_once_or_after_exactly_delay_ms(
    api: ClockedQueue, clock: ManualClock
) -> None:
    await api.put("q", type="queue")
    await api.produce("q", "a", "b")
    await api.claim("q", max_jobs=2)
    assert await api.post("q", "nack", node="w", seqs=[1]) == {"released": [1], "skipped": []}
    answer = await api.post("q", "nack", node="w", seqs=[2], delay_ms=400)
    assert answer == {"released": [2], "skipped": []}
    [now] = await api.claim("q")
    assert (now["$seq"], now["delivery"]) == (1, 2)
    clock.advance(399)
    assert await api.claim("q") == []  # seq 2 waits out its delay
    clock.advance(1)
    [later] = await api.claim("q")
    assert (later["$seq"], later["delivery"]) == (2, 2)


# --- a dead-letter topic that refuses the move ----------------------------------------------


async def dead_job(api: ClockedQueue, queue: str = "q") -> None:
    """Deliver the queue's next job once and give it back: with max_deliveries 1 the
    next claim pass dead-letters it."""
    [job] = await api.claim(queue, max_jobs=1)
    await api.post(queue, "nack", node="w", seqs=[job["$seq"]])


async def test_a_full_dead_letter_topic_parks_the_job_until_it_has_room(
    api: ClockedQueue, clock: ManualClock
) -> None:
    await api.put("dlq", cap_records=1, discard="reject")
    await api.produce("dlq", "already here")  # full
    await api.put("q", type="queue", max_deliveries=1, dead_letter="dlq")
    await api.produce("q", "poison")
    await dead_job(api)
    assert await api.claim("q") == []  # dead, and the dead-letter topic refuses it
    queue = (await api.state("q"))["queue"]
    assert queue["dead_letter_error"] == {
        "code": "topic_full", "message": queue["dead_letter_error"]["message"],
        "topic": "dlq", "ts": clock.now_ms()}  # fmt: skip
    assert {k: v for k, v in queue.items() if k != "dead_letter_error"} == {
        "ready": 0, "in_flight": 0, "dead_lettered": 0, "dead_letter_parked": 1,
        "earliest_lease_deadline": None}  # fmt: skip
    assert await api.metric("waymark_queue_jobs_parked") == 1
    assert await api.metric("waymark_queue_dead_letter_refused_total") == 1

    # Parked: never delivered again, and claims do not retry the move one by one.
    await api.produce("q", "fine")
    [other] = await api.claim("q")
    assert other["data"] == "fine"
    for _ in range(50):
        clock.advance(DEAD_LETTER_RETRY_MS // 50 - 1)
        assert await api.claim("q") == []
    assert await api.metric("waymark_queue_dead_letter_refused_total") == 1

    # Room appears; the next claim pass once the retry is due moves it, exactly once.
    await api.post("dlq", "delete", before_seq=2)
    assert await api.claim("q") == []
    assert (await api.state("q"))["queue"]["dead_letter_parked"] == 1  # not due yet
    clock.advance(DEAD_LETTER_RETRY_MS)
    assert await api.claim("q") == []
    for _ in range(3):
        clock.advance(DEAD_LETTER_RETRY_MS)
        assert await api.claim("q") == []
    [letter] = await api.records("dlq")
    assert letter["data"] == "poison" and letter["meta"]["$dead_letter_seq"] == "1"
    assert (await api.state("q"))["queue"] == {
        "ready": 0, "in_flight": 1, "dead_lettered": 1, "dead_letter_parked": 0,
        "dead_letter_error": None, "earliest_lease_deadline": other["deadline"]}  # fmt: skip
    assert [r["data"] for r in await api.records("q")] == ["fine"]  # moved, then deleted
    assert await api.metric("waymark_queue_jobs_parked") == 0
    assert await api.metric("waymark_queue_dead_letter_refused_total") == 1


async def test_parked_jobs_fill_a_raised_cap_in_order_and_wait_for_the_rest(
    api: ClockedQueue, clock: ManualClock
) -> None:
    await api.put("dlq", cap_records=1, discard="reject")
    await api.produce("dlq", "already here")
    await api.put("q", type="queue", max_deliveries=1, dead_letter="dlq")
    await api.produce("q", "a", "b", "c")
    for _ in range(3):
        await dead_job(api)
    assert await api.claim("q") == []
    assert (await api.state("q"))["queue"]["dead_letter_parked"] == 3
    await api.put("dlq", cap_records=3)  # room for two
    clock.advance(DEAD_LETTER_RETRY_MS)
    assert await api.claim("q") == []
    assert [r["data"] for r in await api.records("dlq")] == ["already here", "a", "b"]
    queue = (await api.state("q"))["queue"]
    assert queue["dead_letter_parked"] == 1 and queue["dead_lettered"] == 2
    assert queue["dead_letter_error"]["code"] == "topic_full"
    await api.put("dlq", cap_records=10)
    clock.advance(DEAD_LETTER_RETRY_MS)
    assert await api.claim("q") == []
    assert [r["data"] for r in await api.records("dlq")] == ["already here", "a", "b", "c"]
    queue = (await api.state("q"))["queue"]
    assert queue["dead_letter_parked"] == 0 and queue["dead_letter_error"] is None
    assert (await api.state("q"))["count"] == 0


async def test_a_missing_dead_letter_topic_with_create_disabled_parks_until_created(
    clock: ManualClock,
) -> None:
    async for api in serve(
        clock, ServerConfig(engine=EngineConfig(defaults=TopicConfig(auto_create=False)))
    ):
        await api.put("q", type="queue", max_deliveries=1, dead_letter="dlq")
        await api.produce("q", "poison")
        await dead_job(api)
        assert await api.claim("q") == []
        queue = (await api.state("q"))["queue"]
        assert queue["dead_letter_parked"] == 1
        assert queue["dead_letter_error"]["code"] == "topic_not_found"
        await api.put("dlq")
        clock.advance(DEAD_LETTER_RETRY_MS)
        assert await api.claim("q") == []
        assert [r["data"] for r in await api.records("dlq")] == ["poison"]
        assert (await api.state("q"))["queue"]["dead_letter_parked"] == 0


async def test_a_queue_that_stops_dead_lettering_releases_its_parked_jobs(
    api: ClockedQueue, clock: ManualClock
) -> None:
    await api.put("dlq", cap_records=1, discard="reject")
    await api.produce("dlq", "already here")
    await api.put("q", type="queue", max_deliveries=1, dead_letter="dlq")
    await api.produce("q", "poison")
    await dead_job(api)
    assert await api.claim("q") == []
    await api.put("q", max_deliveries=0)  # reclaimed forever from now on
    clock.advance(DEAD_LETTER_RETRY_MS)
    assert await api.claim("q") == []  # released by this pass: claimable from the next
    [job] = await api.claim("q")
    assert (job["data"], job["delivery"]) == ("poison", 2)
    assert (await api.state("q"))["queue"]["dead_letter_parked"] == 0
