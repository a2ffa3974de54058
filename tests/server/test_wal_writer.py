"""A WAL writer thread that fails on something other than the disk refusing (a bug)
fails closed (docs/durability.md, "A failed WAL writer"): the writes waiting on its
shard and every later one are refused 503 ``storage_unavailable`` at once instead of
hanging, the failure is logged and counted, and a restart finds every acknowledged
record and none that was refused. The app runs in process through its ASGI lifespan on
a real data directory; its file layer is a fault injector whose ``fdatasync`` raises a
RuntimeError, since no real disk makes the writer raise anything but an OSError."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import httpx
import pytest
from tests.server.test_seals import lifespan

from waymark.client import AsyncClient
from waymark.client.errors import ApiError
from waymark.log import TopicError
from waymark.log.config import StorageConfig
from waymark.log.storage.fileio import FileIO
from waymark.log.storage.restore import open_engine
from waymark.protocol import ConfigPatch, ErrorCode, RecordIn
from waymark.server import App
from waymark.server.config import ServerConfig

PROMPT_S = 10  # an answer well inside a client's 30 s timeout


class BrokenSync(FileIO):
    """Fault injector: once ``broken``, ``fdatasync`` syncs, then raises a RuntimeError,
    as a bug in the writer's round would: the bytes are on disk, the writer never
    learns it, so a frame whose writer answers 503 must not come back after a restart."""

    broken = False

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)
        if self.broken:
            raise RuntimeError("injected: the writer's round fails")


async def test_a_failed_wal_writer_refuses_its_waiting_and_later_writes_and_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = StorageConfig(tmp_path, wal_shards=1)
    disk = BrokenSync()
    engine, store, _ = open_engine(storage, fileio=disk)
    app = App(ServerConfig(storage=storage), engine=engine, store=store)
    _, stop = await lifespan(app)
    transport = httpx.ASGITransport(app=app)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://waymark") as http,
        AsyncClient("http://waymark", http=http) as client,
    ):
        await client.put_topic("t", ConfigPatch(durability="fsync"))
        acked = await client.append("t", [RecordIn.of(n) for n in range(10)])
        assert acked.seqs == list(range(1, 11))

        disk.broken = True
        with caplog.at_level(logging.ERROR, logger="waymark.log.storage.wal"):
            # waiting for its sync when the writer fails: refused, not left hanging
            with pytest.raises(ApiError) as waiting:
                await asyncio.wait_for(client.append("t", [RecordIn.of("lost")]), PROMPT_S)
            assert waiting.value.code is ErrorCode.STORAGE_UNAVAILABLE
            assert waiting.value.status == 503
            assert "RuntimeError: injected" in caplog.text  # the traceback is logged
        disk.broken = False  # the fault is gone, the shard still refuses: its writer is
        with pytest.raises(ApiError) as later:  # not trusted until a restart
            await asyncio.wait_for(client.append("t", [RecordIn.of("later")]), PROMPT_S)
        assert later.value.code is ErrorCode.STORAGE_UNAVAILABLE
        with pytest.raises(ApiError) as created:
            await asyncio.wait_for(client.put_topic("u"), PROMPT_S)
        assert created.value.code is ErrorCode.STORAGE_UNAVAILABLE
        assert "waymark_wal_writer_failures_total 1.0" in (await http.get("/metrics")).text
        page = await client.diff("t", 0)  # reads go on: the acknowledged records only
        assert [r.data for r in page.records] == list(range(10))
        with pytest.raises(TopicError) as sealed:  # it would store the refused write
            store.seal(engine)
        assert sealed.value.code is ErrorCode.STORAGE_UNAVAILABLE
    await stop()
    store.close()

    engine, store, _ = open_engine(storage)  # the restart: writes resume, nothing lost
    try:
        page = engine.diff("t", 0, limit=100, per_record=True)
        assert [r["data"] for r in page.records()] == list(range(10))
        assert page.tombstone is None
        with pytest.raises(TopicError):  # refused: never made
            engine.get_topic("u")
        engine.append("t", [RecordIn.of("after")])  # the shard writes again
        store.sync_blocking()
        page = engine.diff("t", 0, limit=100, per_record=True)
        assert [r["data"] for r in page.records()] == [*range(10), "after"]
    finally:
        store.close()
