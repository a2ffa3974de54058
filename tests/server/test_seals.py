"""The server's background seal survives a seal that fails (docs/durability.md,
"Segments and seals"): the app runs in process, through its ASGI lifespan, on a real
data directory whose file layer is a fault injector that refuses the first segment
and catalog writes as a full disk does."""

from __future__ import annotations

import asyncio
import errno
import gc
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from waymark.log.config import StorageConfig
from waymark.log.storage.fileio import FileIO
from waymark.log.storage.restore import open_engine
from waymark.log.storage.seal import NewSegment
from waymark.server import App
from waymark.server.config import ServerConfig


class FullDiskForSeals(FileIO):
    """Fault injector: the first ``fail`` whole-file writes (segments, the catalog) raise
    ENOSPC; the WAL's appends go through, as on a disk whose last blocks they hold."""

    def __init__(self, fail: int) -> None:
        self.fail = fail

    def replace_file(self, path: Path, data: bytes | bytearray | memoryview) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        super().replace_file(path, data)


async def lifespan(app: App) -> tuple[asyncio.Task[None], Callable[[], Awaitable[None]]]:
    """Start ``app`` as an ASGI server would; returns its task and how to stop it."""
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    started = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    await messages.put({"type": "lifespan.startup"})
    task = asyncio.create_task(app({"type": "lifespan"}, messages.get, send))  # type: ignore[arg-type]
    await asyncio.wait_for(started.wait(), 10)

    async def stop() -> None:
        await messages.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 10)

    return task, stop


async def test_a_failed_seal_is_tried_again_and_loses_nothing(tmp_path: Path) -> None:
    storage = StorageConfig(tmp_path, wal_shards=1, seal_interval_s=0.01)
    disk = FullDiskForSeals(fail=0)
    engine, store, _ = open_engine(storage, fileio=disk)
    disk.fail = 2  # opened: the disk fills now
    app = App(ServerConfig(storage=storage), engine=engine, store=store)
    _, stop = await lifespan(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://waymark") as http:
        assert (await http.put("/v0/topics/t", json={})).status_code == 201
        body = {"records": [{"data": {"n": n}} for n in range(100)]}
        assert (await http.post("/v0/topics/t/records", json=body)).status_code == 200
        deadline = time.monotonic() + 30
        while app.metrics.seals < 1:  # the loop went on past both failures
            assert time.monotonic() < deadline, f"no seal after {app.metrics.seal_failures} failed"
            await asyncio.sleep(0.01)
        assert app.metrics.seal_failures == 2
        assert "waymark_seal_failures_total 2.0" in (await http.get("/metrics")).text
    await stop()
    store.sync_blocking()
    store.close()
    engine, store, _ = open_engine(storage)  # what the seal wrote reads back whole
    try:
        page = engine.diff("t", 0, limit=1000, per_record=True)
        assert page.seqs == list(range(1, 101))
        assert page.tombstone is None
    finally:
        store.close()


async def test_a_sealed_chunk_leaves_memory_when_its_seal_ends(tmp_path: Path) -> None:
    """Once a seal has swapped a chunk for its segment, nothing the server keeps holds the
    chunk (its records and their laid-out bytes) until the next seal — which on an idle
    server never comes (docs/durability.md, "Segments and seals", step 3)."""
    storage = StorageConfig(tmp_path, wal_shards=1, seal_interval_s=0.01)
    engine, store, _ = open_engine(storage)
    app = App(ServerConfig(storage=storage), engine=engine, store=store)
    _, stop = await lifespan(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://waymark") as http:
        assert (await http.put("/v0/topics/t", json={})).status_code == 201
        body = {"records": [{"data": {"n": n}} for n in range(100)]}
        assert (await http.post("/v0/topics/t/records", json=body)).status_code == 200
        topic = engine.kernel.get("t")
        assert topic is not None
        chunk = topic.chunks[0]
        deadline = time.monotonic() + 30
        while topic.chunks[0] is chunk:  # swapped for its segment: the seal's last step
            assert time.monotonic() < deadline, "the chunk was never sealed"
            await asyncio.sleep(0.01)
        gc.collect()
        holders = [o for o in gc.get_objects() if isinstance(o, NewSegment) and o.chunk is chunk]
        assert holders == []
    await stop()
    store.close()
