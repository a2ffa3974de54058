"""The Folds and Recovery pages in a real headless Chromium (docs/console.md): a real
fold process against a real nats-server and a real RecoveryService report to a real
``waymark serve``, and the pages show what they reported."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import pytest
from playwright.sync_api import Browser, Page, expect
from tests.conftest import ServerProcess

from waymark.client import Client
from waymark.protocol import FoldReport, FoldRestore, RecordIn
from waymark.recovery import CommittedVersion, RecoveryService, TopicCheckpoints, TopicReceiptStore

from .test_browser import WAYMARK, fresh, new_token, open_page

Shot = Callable[[Page, str], Path]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from waymark.kv.server import EmbeddedNats

    with EmbeddedNats(tmp_path_factory.mktemp("nats")) as server:
        yield server.url


async def fill_bucket(url: str, bucket: str, n: int) -> int:
    """Put ``n`` keys into ``bucket``; returns the stream's last seq."""
    from waymark.kv import Connection, NatsConnectionConfig, StoreConfig

    async with Connection(NatsConnectionConfig(url=url, timeout=5.0)) as conn:
        kv = await conn.store(bucket, StoreConfig(max_bytes=None))
        for i in range(n):
            await kv.js.publish_async(f"{kv.subject_prefix}k.{i:04}", b"v%d" % i)
        await kv.js.publish_async_completed()
        return (await kv.stream_bounds())[1]


def fill(url: str, bucket: str, n: int) -> int:
    """:func:`fill_bucket` on a thread of its own (Playwright's loop runs on this one)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, fill_bucket(url, bucket, n)).result(timeout=30)


def test_a_reporting_fold_shows_its_cursor_and_lag(
    page: Page, server: ServerProcess, client: Client, nats: str, tmp_path: Path, shot: Shot
) -> None:
    bucket = fresh("orders").replace("-", "_")
    last = fill(nats, bucket, 250)
    fold = subprocess.Popen([WAYMARK, "fold", "--nats", nats, "--bucket", bucket,
                             "--store", f"lmdb:{tmp_path / 'fold'}", "--node-id", "fold-a",
                             "--export-to", f"file://{tmp_path / 'exports'}",
                             "--export-every-s", "0.3",
                             "--report-to", server.url, "--report-every-s", "0.3"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        # A node that reported once, 4 updates behind, and then stopped.
        client.report_fold(FoldReport(bucket, "fold-b", "rocksdb", bucket, last - 4, last,
                                      interval_ms=100))  # fmt: skip
        open_page(page, server, "folds")
        row = page.locator(f"tr[data-fold='{bucket}/fold-a']")
        expect(row.get_by_test_id("fold-cursor")).to_have_text(f"{last:,}", timeout=15_000)
        expect(row.get_by_test_id("fold-lag")).to_have_text("0")
        expect(row).to_contain_text("lmdb")
        expect(row.get_by_test_id("fold-stale")).to_have_count(0)
        # Its export, published through the pointer, with the payload's address.
        expect(row.get_by_test_id("fold-export")).to_contain_text(f"{bucket}.payloads/",
                                                                  timeout=15_000)  # fmt: skip
        expect(row.get_by_test_id("fold-role")).to_have_text("exporter")  # it holds the lease
        expect(row.get_by_test_id("fold-restore")).to_have_text("—")  # it did not bootstrap
        # A node mid-bootstrap (a real one of a small artifact is over in milliseconds):
        # its progress, then where it started from.
        booting = FoldReport(bucket, "fold-c", "lmdb", bucket, 0, last, interval_ms=60_000,
                             role="standby", lease_holder="fold-a",
                             restore=FoldRestore("0123456789abcdef", last - 10, "download",
                                                 512 * 1024, 2048 * 1024))  # fmt: skip
        client.report_fold(booting)
        boot = page.locator(f"tr[data-fold='{bucket}/fold-c']")
        cell = boot.get_by_test_id("fold-restore")
        expect(cell).to_have_text("downloading 0123456789abcdef 512 KiB of 2.0 MiB (25%)",
                                  timeout=15_000)  # fmt: skip
        expect(cell.locator("progress")).to_have_attribute("value", str(512 * 1024))
        expect(boot.get_by_test_id("fold-role")).to_have_text("standby (fold-a holds the lease)")
        client.report_fold(msgspec.structs.replace(booting, restore=FoldRestore(
            "0123456789abcdef", last - 10, "done", 4096, 4096)))  # fmt: skip
        expect(cell).to_have_text(f"from 0123456789abcdef at cursor {last - 10:,}",
                                  timeout=15_000)  # fmt: skip
        stopped = page.locator(f"tr[data-fold='{bucket}/fold-b']")
        expect(stopped.get_by_test_id("fold-lag")).to_have_text("4")
        expect(stopped.get_by_test_id("fold-stale")).to_be_visible()  # not silently healthy
        # The fold moves on and its next report shows it.
        newer = fill(nats, bucket, 40)
        expect(row.get_by_test_id("fold-cursor")).to_have_text(f"{newer:,}", timeout=15_000)
        expect(page.get_by_test_id(f"fold-chart-{bucket}-fold-a")).to_be_visible()
        shot(page, "folds")
        # Stopped, it sends a final report: the page says it ended, not that it went
        # missing, with what it did while it ran.
        fold.send_signal(signal.SIGTERM)
        assert fold.wait(20) == 0
        final = page.locator(f"tr[data-final='{bucket}/fold-a']")
        expect(final.get_by_test_id("fold-ended")).to_have_text("stopped", timeout=15_000)
        expect(final.get_by_test_id("final-cursor")).to_have_text(f"{newer:,}")
        expect(final.get_by_test_id("final-applied")).to_have_text(f"{newer:,}")
        assert int(final.get_by_test_id("final-exports").inner_text().replace(",", "")) >= 1
        expect(final.get_by_test_id("final-error")).to_have_text("")
        expect(row.get_by_test_id("fold-ended")).to_have_text("stopped")
        expect(row.get_by_test_id("fold-stale")).to_have_count(0)
    finally:
        fold.send_signal(signal.SIGTERM)
        try:
            fold.wait(20)
        finally:
            fold.kill()
            fold.wait()


def test_a_recovery_client_s_watermark_shows_and_moves_after_receipts(
    page: Page, server: ServerProcess, client: Client, shot: Shot
) -> None:
    name, topic = fresh("indexer"), fresh("docs")
    client.put_topic(topic)  # a filter names existing topics
    service = RecoveryService(TopicCheckpoints(server.url, [topic]),
                              TopicReceiptStore(server.url, fresh("receipts")), name,
                              report_every_s=60)  # fmt: skip
    live: list[CommittedVersion] = []
    try:
        assert list(service.subscribe(live.append)) == []
        client.append(topic, [RecordIn.of({"doc": 1}, tag="d1")])
        deadline = time.monotonic() + 15
        while not live:
            assert time.monotonic() < deadline, "no change checkpoint came"
            time.sleep(0.05)
        [mine] = [c.id for c in client.list_checkpoints(topics=[topic]).checkpoints if c.changes]
        open_page(page, server, "recovery")
        row = page.locator(f"tr[data-client='{name}']")
        watermark = row.get_by_test_id("client-watermark")
        expect(watermark).not_to_have_text("none", timeout=10_000)
        before = int(watermark.inner_text().replace(",", ""))
        assert before < mine  # held below the checkpoint it has not receipted
        expect(row.get_by_test_id("client-behind")).not_to_have_text("0")
        service.submit_receipt(live[0].key, live[0].version, live[0].epoch).result(timeout=10)
        # Reported when the watermark moved; the page's next poll shows it.
        expect(watermark).not_to_have_text(f"{before:,}", timeout=10_000)
        assert int(watermark.inner_text().replace(",", "")) >= mine
        shot(page, "recovery")
    finally:
        service.close()


def test_a_stopped_recovery_client_is_marked_failed(
    page: Page, server: ServerProcess, client: Client, shot: Shot
) -> None:
    """A listener that raised stopped the service (docs/semantics/recovery.md §3.6): its
    report says so and the page marks it."""
    name, topic = fresh("indexer"), fresh("docs")
    client.put_topic(topic)

    def listener(committed: CommittedVersion) -> None:
        raise ValueError("the index is gone")

    service = RecoveryService(TopicCheckpoints(server.url, [topic]),
                              TopicReceiptStore(server.url, fresh("receipts")), name,
                              report_every_s=60)  # fmt: skip
    try:
        list(service.subscribe(listener))
        client.append(topic, [RecordIn.of({"doc": 1}, tag="d1")])
        deadline = time.monotonic() + 15
        while service.failure is None:
            assert time.monotonic() < deadline, "the listener's failure did not stop it"
            time.sleep(0.05)
        open_page(page, server, "recovery")
        failed = page.locator(f"tr[data-client='{name}']").get_by_test_id("client-failed")
        expect(failed).to_have_text("failed", timeout=10_000)
        assert "the index is gone" in (failed.get_attribute("title") or "")
        shot(page, "recovery-failed")
    finally:
        service.close()


def test_a_fold_that_fails_sends_a_final_report_saying_why(
    page: Page, server: ServerProcess, nats: str, tmp_path: Path
) -> None:
    bucket = fresh("unpublished").replace("-", "_")
    # Nothing was ever published where it bootstraps from (and no --if-exists): exit 4.
    failed = subprocess.run([WAYMARK, "fold", "--nats", nats, "--bucket", bucket,
                             "--store", f"lmdb:{tmp_path / 'fold'}", "--node-id", "fold-x",
                             "--bootstrap-from", f"file://{tmp_path / 'nothing'}",
                             "--report-to", server.url],
                            capture_output=True, timeout=60, check=False)  # fmt: skip
    assert failed.returncode == 4, failed.stderr
    open_page(page, server, "folds")
    final = page.locator(f"tr[data-final='{bucket}/fold-x']")
    expect(final.get_by_test_id("fold-ended")).to_have_text("failed", timeout=15_000)
    expect(final.get_by_test_id("final-error")).to_have_text("exit 4 (not found)")


def test_a_read_only_token_sees_folds_and_recovery(
    browser: Browser, tmp_path: Path, start_waymark: Callable[..., ServerProcess]
) -> None:
    tokens = tmp_path / "tokens"
    writer = new_token(tokens, "fold-node", "write:*")
    reader = new_token(tokens, "viewer", "read:*")
    server = start_waymark("--tokens", str(tokens))
    with httpx.Client(base_url=server.url) as http:
        report = {"fold": "f", "node": "n", "backend": "lmdb", "bucket": "b", "cursor": 3,
                  "bucket_seq": 5}  # fmt: skip
        # A read-only token cannot forge a report; a token that writes can.
        refused = http.post("/v0/folds", json=report, headers={"Authorization": f"Bearer {reader}"})
        assert refused.status_code == 403
        http.post("/v0/folds", json=report,
                  headers={"Authorization": f"Bearer {writer}"}).raise_for_status()  # fmt: skip
    page = browser.new_context().new_page()
    page.goto(f"{server.url}/ui/")
    page.get_by_label("token").fill(reader)
    page.get_by_role("button", name="Use token").click()
    page.get_by_role("link", name="Folds").click()
    expect(page.locator("tr[data-fold='f/n']").get_by_test_id("fold-lag")).to_have_text("2")
    page.get_by_role("link", name="Recovery").click()
    expect(page.get_by_text("No recovery client has reported")).to_be_visible()
