"""The asyncio client against the real server: the same calls, awaited."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from waymark.client import (
    ApiError,
    AsyncClient,
    ConfigPatch,
    RecordIn,
    StagedPart,
    TombstoneEvent,
)


async def test_every_call_awaits_to_the_same_types(waymark_server: Any, topic: str) -> None:
    async with AsyncClient(waymark_server.url) as client:
        assert (await client.health()).status == "ok"
        state, created = await client.put_topic(topic, ConfigPatch(cap_records=2))
        assert created and state.config.cap_records == 2
        for i in range(3):
            await client.append(topic, [RecordIn.of(i, tag=f"t{i}")])
        page = await client.diff(topic, 0)
        assert page.tombstone is not None and page.tombstone.reason == "cap"
        assert [r.data for r in page.records] == [1, 2]
        assert (await client.delete(topic, match=("tag", "Glob", "t*"))).deleted == 2
        assert (await client.get_topic(topic)).count == 0
        assert topic in [t.name for t in await client.list_topics()]
        assert (await client.openapi())["openapi"] == "3.1.0"
        assert "waymark_topics" in await client.metrics()
        await client.delete_topic(topic)
        with pytest.raises(ApiError) as caught:
            await client.diff(topic, 0)
        assert caught.value.code == "topic_not_found"


async def test_async_watch_streams_live_and_reconnects(
    waymark_server: Any, proxy, topic: str
) -> None:
    async with AsyncClient(waymark_server.url) as direct, AsyncClient(proxy.url) as client:
        await direct.append(topic, [RecordIn.of(0)], config=ConfigPatch(cap_records=1))
        await direct.append(topic, [RecordIn.of(1)])
        events = client.watch(topic, read_timeout=5)
        first = await anext(events)
        assert isinstance(first, TombstoneEvent)
        assert (await anext(events)).record.data == 1
        proxy.cut()
        await direct.append(topic, [RecordIn.of(2)])
        assert (await anext(events)).record.data == 2
        await events.aclose()
    assert proxy.connections == 2


async def test_raw_diff_and_exactly_once_writer_calls(waymark_server: Any, topic: str) -> None:
    async with AsyncClient(waymark_server.url) as client:
        await client.append(topic, [RecordIn(msgspec.Raw(b'{"a": [1, 2]}'), tag="t")])
        raw = await client.diff_raw(topic, 0)
        # Stored canonical (docs/semantics/topics.md §1.2): the spaces between tokens go.
        assert bytes(raw.records[0].data) == b'{"a":[1,2]}' and raw.records[0].tag == "t"
        # records already encoded, joined by commas: the same append, byte for byte
        joined = await client.append(topic, b'{"data":4,"id":"x"},{"data":5,"meta":{"k":"v"}}')
        assert joined.seqs == [2, 3]
        assert (await client.append(topic, b'{"data":6,"id":"x"}')).seqs == [2]  # absorbed
        tail = (await client.diff(topic, 1)).records
        assert [(r.data, r.meta) for r in tail] == [(4, None), (5, {"k": "v"})]
        out = f"{topic}-out"
        epoch = (await client.open_writer(topic)).epoch
        head = {"writer": topic, "epoch": epoch, "batch_id": 0, "partition": 0, "attempt": 0}
        staged = await client.stage(out, [RecordIn.of(1)], **head)
        assert (staged.staged, staged.accepted) == (1, True)
        encoded = await client.stage(out, b'{"data":2},{"data":3,"tag":"x"}', chunk=1, **head)
        assert (encoded.staged, encoded.accepted) == (2, True)
        parts = [StagedPart(0, 0, 2)]
        published = await client.publish(out, writer=topic, epoch=epoch, batch_id=0, parts=parts)
        assert (published.count, published.replayed) == (3, False)
        again = await client.publish(out, writer=topic, epoch=epoch, batch_id=0, parts=parts)
        assert again.replayed and again.first_seq == published.first_seq
        assert [r.data for r in (await client.diff(out, 0)).records] == [1, 2, 3]
