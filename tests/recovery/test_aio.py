"""The asyncio twin against a real server (docs/recovery.md, "asyncio"): the same
answers as the blocking service, over the asyncio client, with receipts as
``asyncio.Future`` objects whose store writes run off the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import ServerProcess

from waymark.client import AsyncClient, Client
from waymark.protocol import RecordIn
from waymark.recovery import (
    AsyncRecoveryService,
    AsyncTopicCheckpoints,
    CommittedVersion,
    LocalReceiptStore,
    RecoveryError,
    RecoveryService,
    TopicCheckpoints,
)

from .harness import FaultInjectingStore
from .test_server import FAST


@pytest.fixture
def server(start_waymark: Callable[..., ServerProcess]) -> ServerProcess:
    started = start_waymark(*FAST)
    with Client(started.url) as client:
        client.put_topic("orders")  # a filter names existing topics
    return started


def service(url: str, store: object) -> AsyncRecoveryService:
    return AsyncRecoveryService(AsyncTopicCheckpoints(url, topics=["orders"]), store,  # type: ignore[arg-type]
                                "indexer", recent_s=0)  # fmt: skip


async def told(seen: asyncio.Queue[CommittedVersion], key: str, version: int) -> CommittedVersion:
    """The notification of ``key`` at ``version`` or later (others are dropped)."""
    while True:
        committed = await asyncio.wait_for(seen.get(), 10)
        if committed.key == key and committed.version >= version:
            return committed


async def test_the_async_service_recovers_what_the_blocking_one_would(
    server: ServerProcess, tmp_path: Path
) -> None:
    store = LocalReceiptStore(tmp_path / "receipts.db")
    first = service(server.url, store)
    seen: asyncio.Queue[CommittedVersion] = asyncio.Queue()
    assert await first.subscribe(seen.put_nowait) == []  # a first start
    async with AsyncClient(server.url) as client:
        await client.append("orders", [RecordIn.of(1, tag="done"), RecordIn.of(2, tag="kept")])
        done = await told(seen, "orders/done", 1)
        kept = await told(seen, "orders/kept", 2)
        receipt = first.submit_receipt(done.key, done.version, done.epoch)
        assert isinstance(receipt, asyncio.Future)
        await asyncio.wait_for(first.submit_receipt(kept.key, kept.version, kept.epoch), 10)
        assert receipt.done() and receipt.exception() is None
        # Read before a deletion, receipted after its checkpoint arrived: not covered.
        await client.append("orders", [RecordIn.of(3, tag="gone")])
        read = await told(seen, "orders/gone", 3)
        deleted = await client.delete("orders", match="gone")
        removal = await told(seen, "orders/gone", deleted.head_seq)
        assert removal.version == deleted.head_seq > read.version
        await asyncio.wait_for(first.submit_receipt(read.key, read.version, read.epoch), 10)
        await client.append("orders", [RecordIn.of(4, tag="stale")])
        await told(seen, "orders/stale", 5)
        refused = first.submit_receipt("orders/stale", 99, read.epoch)
        with pytest.raises(RecoveryError, match="not known"):
            await refused
    await first.aclose()

    second = service(server.url, LocalReceiptStore(tmp_path / "receipts.db"))
    missed = await second.missed()
    assert [(c.key, c.version) for c in missed] == [("orders/gone", 4), ("orders/stale", 5)]
    blocking = RecoveryService(TopicCheckpoints(server.url, topics=["orders"]),
                               LocalReceiptStore(tmp_path / "receipts.db"), "indexer",
                               recent_s=0)  # fmt: skip
    try:
        assert blocking.missed() == missed, "the twins disagree"
    finally:
        blocking.close()
    live: list[CommittedVersion] = []
    assert await second.subscribe(live.append) == missed
    for c in missed:
        await asyncio.wait_for(second.submit_receipt(c.key, c.version, c.epoch), 10)
    assert await second.missed() == []
    await second.aclose()


async def test_a_failed_store_write_fails_the_future_and_a_retry_persists(
    server: ServerProcess, tmp_path: Path
) -> None:
    store = FaultInjectingStore(LocalReceiptStore(tmp_path / "receipts.db"))
    twin = service(server.url, store)
    seen: asyncio.Queue[CommittedVersion] = asyncio.Queue()
    await twin.subscribe(seen.put_nowait)
    async with AsyncClient(server.url) as client:
        await client.append("orders", [RecordIn.of(1, tag="a")])
    a = await told(seen, "orders/a", 1)
    store.failing = True
    with pytest.raises(RecoveryError, match="not persisted"):
        await asyncio.wait_for(twin.submit_receipt(a.key, a.version, a.epoch), 10)
    store.failing = False
    await asyncio.wait_for(twin.submit_receipt(a.key, a.version, a.epoch), 10)
    assert store.low_watermark("indexer") is not None
    assert await twin.missed() == []
    await twin.aclose()


async def test_strict_receipts_and_a_stopping_listener_in_asyncio(
    server: ServerProcess, tmp_path: Path
) -> None:
    """The asyncio twin refuses what the blocking service refuses, asks the log about a
    key it holds no checkpoint of (a receipt again after a restart is accepted), and
    stops when its listener raises (docs/semantics/recovery.md §2.1, §3.6)."""
    store = LocalReceiptStore(tmp_path / "receipts.db")
    first = service(server.url, store)
    seen: asyncio.Queue[CommittedVersion] = asyncio.Queue()
    await first.subscribe(seen.put_nowait)
    async with AsyncClient(server.url) as client:
        await client.append("orders", [RecordIn.of(1, tag="a")])
    a = await told(seen, "orders/a", 1)
    with pytest.raises(RecoveryError, match="epoch"):
        await asyncio.wait_for(first.submit_receipt(a.key, a.version, a.epoch + 1), 10)
    await asyncio.wait_for(first.submit_receipt(a), 10)
    await first.aclose()

    def listener(committed: CommittedVersion) -> None:
        raise ValueError("boom")

    again = service(server.url, LocalReceiptStore(tmp_path / "receipts.db"))
    try:
        assert await again.subscribe(listener) == []
        await asyncio.wait_for(again.submit_receipt(a), 10)  # persisted before: accepted
        with pytest.raises(RecoveryError, match="unknown key"):
            await asyncio.wait_for(again.submit_receipt("orders/zz", 1, a.epoch), 10)
        async with AsyncClient(server.url) as client:
            await client.append("orders", [RecordIn.of(2, tag="b")])
        for _ in range(1000):
            if again.failure is not None:
                break
            await asyncio.sleep(0.02)
        assert again.failure is not None and "listener raised ValueError: boom" in str(
            again.failure
        )
        with pytest.raises(RecoveryError, match="listener raised"):
            await asyncio.wait_for(again.submit_receipt(a), 10)
    finally:
        await again.aclose()
