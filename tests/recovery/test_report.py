"""A recovery client reports its receipts to a real server (docs/reports.md): the
watermark shows, the server counts the checkpoints it is behind, and both move after
receipts; read back through the shipped client and ``waymark recovery clients``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import ServerProcess
from typer.testing import CliRunner

from waymark.cli import app
from waymark.client import Client
from waymark.protocol import RecordIn, RecoveryClient
from waymark.recovery import CommittedVersion, RecoveryService, TopicCheckpoints, TopicReceiptStore

pytestmark = pytest.mark.timeout(60)


def wait_for(check: Callable[[], RecoveryClient | None], what: str) -> RecoveryClient:
    """Poll a real server process (its checkpoint loop runs on its own clock)."""
    deadline = time.monotonic() + 10
    while (found := check()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def test_a_topic_store_client_reports_and_its_watermark_moves_after_receipts(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = spawn_server(tmp_path, "--checkpoint-interval-s", "0.2")
    http = Client(server.url)
    http.put_topic("orders")  # a filter names existing topics
    service = RecoveryService(TopicCheckpoints(server.url, ["orders"]),
                              TopicReceiptStore(server.url, "receipts"), "indexer",
                              report_every_s=60)  # fmt: skip
    live: list[CommittedVersion] = []
    try:
        assert list(service.subscribe(live.append)) == []  # a first start

        def client(where: Callable[[RecoveryClient], bool]) -> RecoveryClient | None:
            for c in http.list_recovery_clients().clients:
                if c.client == "indexer" and where(c):
                    return c
            return None

        wait_for(lambda: client(lambda c: True), "the first report")
        http.append("orders", [RecordIn.of(1, tag="o1")])
        deadline = time.monotonic() + 10
        while not live:
            assert time.monotonic() < deadline, "no checkpoint came"
            time.sleep(0.05)
        [orders] = [c.id for c in http.list_checkpoints(topics=["orders"]).checkpoints
                    if c.changes]  # fmt: skip
        # Until it is receipted, the watermark stays below the orders checkpoint and
        # the server counts the client behind (checkpoints of its own receipt topic,
        # which it does not read, pass by: the watermark may move up to it).
        http.append("other", [RecordIn.of(2)])
        stuck = wait_for(lambda: client(lambda c: c.behind >= 2), "behind >= 2")
        assert stuck.watermark is not None and stuck.watermark < orders
        # A report now (the interval is 60 s) names the checkpoint waiting for a receipt.
        assert service.reporter is not None
        sent = service.reporter.send()
        assert sent is not None and sent.pending == 1
        assert client(lambda c: c.pending == 1) is not None
        service.submit_receipt(live[0].key, live[0].version, live[0].epoch).result(timeout=10)
        # The watermark moved: reported at once, not after the 60 s interval.
        moved = wait_for(lambda: client(lambda c: (c.watermark or 0) >= orders),
                         "the watermark to pass the receipted checkpoint")  # fmt: skip
        assert moved.stale is False
        assert wait_for(lambda: client(lambda c: c.pending == 0), "pending 0").behind >= 0
        result = CliRunner().invoke(app, ["recovery", "clients", "--url", server.url, "--json"])
        assert result.exit_code == 0, result.output
        shown = json.loads(result.output)
        [row] = [c for c in shown["clients"] if c["client"] == "indexer"]
        assert row["watermark"] >= moved.watermark
        table = CliRunner().invoke(app, ["recovery", "clients", "--url", server.url])
        assert "indexer" in table.output and "behind" in table.output
    finally:
        service.close()
        http.close()


def test_reporting_is_opt_in_for_a_local_store_and_can_be_turned_off(tmp_path: Path) -> None:
    from waymark.recovery import LocalReceiptStore

    local = RecoveryService(TopicCheckpoints("http://127.0.0.1:9"),
                            LocalReceiptStore(tmp_path / "r.db"), "c")  # fmt: skip
    assert local.reporter is None
    off = RecoveryService(TopicCheckpoints("http://127.0.0.1:9"),
                          LocalReceiptStore(tmp_path / "r2.db"), "c",
                          report_to="http://127.0.0.1:9", report=False)  # fmt: skip
    assert off.reporter is None


async def test_the_asyncio_service_reports_too(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    import asyncio

    from waymark.client import AsyncClient
    from waymark.recovery import AsyncRecoveryService, AsyncTopicCheckpoints, LocalReceiptStore

    server = spawn_server(tmp_path, "--checkpoint-interval-s", "0.2")
    with Client(server.url) as http:
        http.put_topic("orders")  # a filter names existing topics
    service = AsyncRecoveryService(
        AsyncTopicCheckpoints(server.url, ["orders"]), LocalReceiptStore(tmp_path / "r.db"),
        "async-indexer", recent_s=0, report_to=server.url, report_every_s=60,
    )  # fmt: skip
    seen: asyncio.Queue[CommittedVersion] = asyncio.Queue()
    async with AsyncClient(server.url) as http:

        async def reported(where: Callable[[RecoveryClient], bool]) -> RecoveryClient:
            for _ in range(200):
                for c in (await http.list_recovery_clients()).clients:
                    if c.client == "async-indexer" and where(c):
                        return c
                await asyncio.sleep(0.05)
            raise AssertionError("the report did not come")

        try:
            assert await service.subscribe(seen.put_nowait) == []
            await reported(lambda c: True)  # the first report, at start
            await http.append("orders", [RecordIn.of(1, tag="o1")])
            committed = await asyncio.wait_for(seen.get(), 10)
            await service.submit_receipt(committed.key, committed.version, committed.epoch)
            # The interval is 60 s: the watermark's move is what sends this report.
            moved = await reported(lambda c: (c.watermark or 0) > 0 and c.pending == 0)
            assert moved.stale is False
        finally:
            await asyncio.wait_for(service.aclose(), 15)  # the reporter's thread ends too
    assert not [t for t in threading.enumerate() if t.name == "waymark-recovery-report"]
