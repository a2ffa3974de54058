"""A client never skips silently past a server that is not the one it receipted
(docs/semantics/recovery.md §3.5): a new or replaced data directory (another
instance id) and a restored one (checkpoint ids behind the client's) stop the service
and the CLI with a RecoveryError naming both; a resync is asked for explicitly.
Played with real ``waymark serve`` processes, the shipped service and CLI."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from tests.conftest import ServerProcess

from waymark.client import Client
from waymark.protocol import RecordIn
from waymark.recovery import (
    CommittedVersion,
    LocalReceiptStore,
    RecoveryError,
    RecoveryService,
    TopicCheckpoints,
)

WAYMARK = str(Path(sys.executable).parent / "waymark")
FAST = ("--checkpoint-interval-s", "0.05")


def service(url: str, receipts: Path) -> RecoveryService:
    return RecoveryService(TopicCheckpoints(url), LocalReceiptStore(receipts), "indexer",
                           recent_s=0, report=False)  # fmt: skip


def close(svc: RecoveryService) -> None:
    svc.close()
    svc.store.close()


def receipt_all(url: str, receipts: Path, tags: list[str]) -> None:
    """Subscribe, append ``tags``, receipt each as the listener hands it over."""
    got: list[CommittedVersion] = []
    svc = service(url, receipts)
    try:
        list(svc.subscribe(got.append))
        with Client(url) as client:
            for tag in tags:
                client.append("orders", [RecordIn.of(tag, tag=tag)])
        deadline = time.monotonic() + 20
        while len({c.key for c in got}) < len(tags):
            assert time.monotonic() < deadline, f"the listener got {got}"
            time.sleep(0.02)
        futures = [svc.submit_receipt(c.key, c.version, c.epoch) for c in got]
        for future in futures:  # (one checkpoint may name them all: its receipt waits)
            future.result(10)
    finally:
        close(svc)


def cli(url: str, receipts: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WAYMARK, "recovery", "missed", "--url", url, "--store", str(receipts),
         "--client", "indexer", "--recent-s", "0", "--json", *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_server_with_a_new_data_dir_is_refused_not_skipped(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Repro of issue #23, item 4: the server comes back with an empty data directory;
    its checkpoint ids restart below the client's watermark."""
    receipts = tmp_path / "receipts.db"
    server = spawn_server(tmp_path / "first", *FAST)
    receipt_all(server.url, receipts, ["a", "b", "c"])
    old = Client(server.url).list_checkpoints(limit=1).instance
    server.stop(signal.SIGKILL)

    server = spawn_server(tmp_path / "empty", *FAST)  # another data directory
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of("x", tag="x")])
        new = client.list_checkpoints(limit=1).instance
    assert new and old and new != old
    svc = service(server.url, receipts)
    try:
        with pytest.raises(RecoveryError) as refused:
            svc.missed()
        assert old in str(refused.value) and new in str(refused.value)
        with pytest.raises(RecoveryError):
            svc.subscribe(lambda committed: None)
    finally:
        close(svc)
    shown = cli(server.url, receipts)
    assert shown.returncode != 0 and old in shown.stderr and new in shown.stderr
    assert "--resync" in shown.stderr

    with Client(server.url) as client:  # x's checkpoint is written
        deadline = time.monotonic() + 20
        while not any(c.key == "orders/x" for cp in client.checkpoints() for c in cp.changes):
            assert time.monotonic() < deadline, "no checkpoint names orders/x"
            time.sleep(0.05)
    resync = cli(server.url, receipts, "--resync")  # every key the new server's checkpoints name
    assert resync.returncode == 0, resync.stderr
    assert {json.loads(line)["key"] for line in resync.stdout.splitlines()} == {"orders/x"}
    got: list[CommittedVersion] = []
    svc = service(server.url, receipts)
    try:
        assert [c.key for c in svc.subscribe(got.append, resync=True)] == ["orders/x"]
    finally:
        close(svc)
    svc = service(server.url, receipts)  # adopted: an ordinary query from now on
    try:
        assert [c.key for c in svc.missed()] == ["orders/x"]
    finally:
        close(svc)


def test_a_data_dir_restored_from_a_backup_is_refused(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The same instance, its checkpoint ids behind what the client receipted."""
    receipts, data, backup = tmp_path / "receipts.db", tmp_path / "data", tmp_path / "backup"
    server = spawn_server(data, *FAST)
    receipt_all(server.url, receipts, ["a"])
    server.stop(signal.SIGTERM)
    shutil.copytree(data, backup)
    server = spawn_server(data, *FAST)
    receipt_all(server.url, receipts, ["b", "c"])
    with Client(server.url) as client:
        receipted = client.list_checkpoints(limit=1).checkpoints[0].id
    server.stop(signal.SIGTERM)
    shutil.rmtree(data)
    shutil.copytree(backup, data)
    server = spawn_server(data, *FAST)
    svc = service(server.url, receipts)
    try:
        with pytest.raises(RecoveryError, match="backwards") as refused:
            svc.missed()
        assert str(receipted) in str(refused.value)
    finally:
        close(svc)


def test_a_watch_cursor_past_the_newest_checkpoint_is_refused(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A reconnect to a replaced server would wait, silently, for its ids to pass the
    cursor: refused instead."""
    server = spawn_server(tmp_path / "data", *FAST)
    with Client(server.url) as client:
        instance = client.list_checkpoints(limit=1).instance
    answer = httpx.get(f"{server.url}/v0/changes/watch", params={"after": "5"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and instance in error["message"]
