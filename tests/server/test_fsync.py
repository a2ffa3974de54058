"""fsync topics over HTTP (docs/semantics/topics.md §2.2, §2.3): while concurrent writers
wait for their group commit, the state reports what readers can read, and a reader
starting from it is neither rewound nor told the topic was recreated; fsync_ms reports
real sync times.

The app runs in process on a real WAL whose file layer is a fault injector: its
``fdatasync`` returns only when the test lets it, so the window in which appends are
written but not yet synced is as long as the test needs, and deterministic; and each
sync takes as long as the test says on the injected clock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from waymark.clock import ManualClock
from waymark.log import Engine
from waymark.log.config import StorageConfig
from waymark.log.storage.fileio import FileIO
from waymark.log.storage.restore import open_engine
from waymark.server import App


class HeldSyncs(FileIO):
    """Fault injector: between :meth:`hold` and :meth:`release` a WAL shard's
    ``fdatasync`` blocks, so nothing written meanwhile becomes durable; and every
    ``fdatasync`` takes ``takes_ms`` of ``clock``."""

    def __init__(self, clock: ManualClock | None = None, takes_ms: int = 0) -> None:
        self._open = threading.Event()
        self._open.set()
        self.clock, self.takes_ms = clock, takes_ms

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def fdatasync(self, fd: int) -> None:
        self._open.wait()  # on the shard's writer thread
        if self.clock is not None:
            self.clock.advance(self.takes_ms)
        super().fdatasync(fd)


@pytest.fixture
def syncs(clock: ManualClock) -> HeldSyncs:
    return HeldSyncs(clock, takes_ms=7)


@pytest.fixture
def engine(tmp_path: Path, syncs: HeldSyncs, clock: ManualClock) -> Iterator[Engine]:
    engine, store, _ = open_engine(StorageConfig(tmp_path, wal_shards=1), fileio=syncs, clock=clock)
    yield engine
    syncs.release()  # a failed test must not leave the writer thread blocked
    store.sync_blocking()
    store.close()


@pytest.fixture
async def http(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=App(engine=engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://waymark") as client:
        yield client


async def call(response: Any) -> dict[str, Any]:
    answer = await response
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


def appended_upto(engine: Engine, topic: str, seq: int) -> asyncio.Event:
    """Set once ``topic`` has handed out ``seq`` (the commit listener runs at append)."""
    event = asyncio.Event()

    def listener(name: str) -> None:
        if name == topic and engine.get_topic(topic, touch=False).assigned_head_seq >= seq:
            event.set()

    engine.add_listener(listener)
    return event


async def test_state_and_reads_agree_while_concurrent_writers_wait_for_their_sync(
    http: httpx.AsyncClient, engine: Engine, syncs: HeldSyncs
) -> None:
    await call(http.put("/v0/topics/t", json={"durability": "fsync"}))
    records = lambda *data: {"records": [{"data": d} for d in data]}  # noqa: E731
    assert (await call(http.post("/v0/topics/t/records", json=records("a", "b", "c"))))[
        "seqs"] == [1, 2, 3]  # fmt: skip

    syncs.hold()
    both = appended_upto(engine, "t", 9)
    writers = [
        asyncio.ensure_future(call(http.post("/v0/topics/t/records", json=records(*data))))
        for data in (("d", "e"), ("f", "g", "h", "i"))
    ]
    await both.wait()
    assert not any(w.done() for w in writers)  # both acks wait for the sync

    state = await call(http.get("/v0/topics/t"))
    # What readers can read: the three synced records. The six handed out are reported
    # apart, and next_seq still says where the next append goes.
    assert (state["head_seq"], state["assigned_head_seq"], state["next_seq"]) == (3, 9, 10)
    assert (state["earliest_seq"], state["count"], state["bytes"]) == (1, 3, 3 * len(b'"a"'))
    page = await call(http.post("/v0/topics/t/diff", json={"from_seq": 0}))
    assert [r["data"] for r in page["records"]] == ["a", "b", "c"]
    assert (page["head_seq"], page["earliest_seq"]) == (state["head_seq"], state["earliest_seq"])

    # Diffing from the reported head, or from any seq handed out: current, not recreated.
    for start in (state["head_seq"], state["assigned_head_seq"]):
        page = await call(http.post("/v0/topics/t/diff", json={"from_seq": start}))
        assert page["tombstone"] is None and page["records"] == []
        assert page["next_from_seq"] == start and page["caught_up"]

    # A long-poll from the reported head is woken by the sync and misses nothing.
    poll = asyncio.ensure_future(
        call(http.post("/v0/topics/t/diff", json={"from_seq": 3, "wait_ms": 10_000}))
    )
    syncs.release()
    assert [w["seqs"] for w in await asyncio.gather(*writers)] == [[4, 5], [6, 7, 8, 9]]
    seen, page = [], await poll
    while True:
        assert page["tombstone"] is None
        seen += [(r["$seq"], r["data"]) for r in page["records"]]
        if page["next_from_seq"] >= 9:
            break
        page = await call(http.post("/v0/topics/t/diff", json={"from_seq": page["next_from_seq"]}))
    assert seen == list(zip(range(4, 10), "defghi", strict=True))
    state = await call(http.get("/v0/topics/t"))
    assert (state["head_seq"], state["assigned_head_seq"], state["count"]) == (9, 9, 9)


async def test_fsync_ms_is_the_measured_sync_time_for_fsync_topics_and_0_otherwise(
    http: httpx.AsyncClient, engine: Engine, syncs: HeldSyncs
) -> None:
    async def append(topic: str) -> dict[str, Any]:
        body = {"records": [{"data": topic}]}
        return await call(http.post(f"/v0/topics/{topic}/records", json=body))

    # Every sync of the (single) WAL shard takes 7 ms on the injected clock.
    created = await call(http.put("/v0/topics/f", json={"durability": "fsync"}))
    assert created["fsync_ms"] == 7  # as of its own sync
    await append("f")  # its first write also reserves a seq ceiling: two syncs, maybe
    for other in ("ephemeral", "memory", "disk"):
        # Never fsync-gated: 0, though a disk topic's first write waits for its ceiling.
        assert (await call(http.put(f"/v0/topics/{other}", json={"durability": other})))[
            "fsync_ms"] == 0  # fmt: skip
        assert (await append(other))["fsync_ms"] == 0
        assert (await call(http.get(f"/v0/topics/{other}")))["fsync_ms"] == 0
    await call(http.put("/v0/topics/f", json={}))  # acked once everything before is synced

    # The disk slows down: this write's ack waits one 23 ms sync, and the state's figure
    # (a moving average of the shard's syncs, weight 1/8) moves towards it.
    syncs.takes_ms = 23
    syncs.hold()
    written = appended_upto(engine, "f", 2)
    ack = asyncio.ensure_future(append("f"))
    await written.wait()
    syncs.release()
    assert (await ack)["fsync_ms"] == 23
    state = await call(http.get("/v0/topics/f"))
    assert state["fsync_ms"] == round(7 + (23 - 7) / 8)
    listed = (await call(http.get("/v0/topics")))["topics"]
    assert {t["name"]: t["fsync_ms"] for t in listed} == {
        "f": state["fsync_ms"], "ephemeral": 0, "memory": 0, "disk": 0}  # fmt: skip
