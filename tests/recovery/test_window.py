"""Changes that fall out of the recovery window are announced, like a tombstone
(docs/semantics/recovery.md §3.2): which checkpoint ids the query could not examine,
and why; the CLI exits non-zero unless told to accept it. Real ``waymark serve``
processes, the shipped service and CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from tests.conftest import ServerProcess

from waymark.client import Client
from waymark.clock import ManualClock
from waymark.log import Engine, TopicError
from waymark.protocol import RecordIn
from waymark.recovery import (
    CommittedVersion,
    LocalReceiptStore,
    RecoveryService,
    ServerView,
    TopicCheckpoints,
    WindowLoss,
)
from waymark.recovery.core import window_losses
from waymark.server.changes import ChangesApi, CheckpointFeed

WAYMARK = str(Path(sys.executable).parent / "waymark")


def service(url: str, receipts: Path, max_window_s: float = 86_400) -> RecoveryService:
    return RecoveryService(TopicCheckpoints(url), LocalReceiptStore(receipts), "indexer",
                           recent_s=0, max_window_s=max_window_s, report=False)  # fmt: skip


def first_start(url: str, receipts: Path) -> None:
    svc = service(url, receipts)
    assert list(svc.subscribe(lambda committed: None)) == []
    svc.close()
    svc.store.close()


def checkpoint_id(client: Client, key: str, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while True:
        for checkpoint in client.checkpoints():
            if any(c.key == key for c in checkpoint.changes):
                return checkpoint.id
        assert time.monotonic() < deadline, f"no checkpoint names {key}"
        time.sleep(0.05)


def missed(url: str, receipts: Path, max_window_s: float = 86_400) -> list[object]:
    svc = service(url, receipts, max_window_s)
    try:
        return list(svc.missed())
    finally:
        svc.close()
        svc.store.close()


def cli(url: str, receipts: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WAYMARK, "recovery", "missed", "--url", url, "--store", str(receipts),
         "--client", "indexer", "--recent-s", "0", "--json", *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_checkpoints_the_server_expired_are_reported_as_lost(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Repro of issue #23, item 5: a change never receipted, its checkpoint gone with
    the server's recovery window, was not reported at all."""
    server = start_waymark("--checkpoint-interval-s", "0.05", "--recovery-window-s", "2")
    receipts = tmp_path / "receipts.db"
    first_start(server.url, receipts)
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of("a", tag="a")])
        gone = checkpoint_id(client, "orders/a")
        deadline = time.monotonic() + 20
        while list(client.checkpoints()):  # the window takes it
            assert time.monotonic() < deadline, "the checkpoint outlives the window"
            time.sleep(0.1)
        client.append("orders", [RecordIn.of("b", tag="b")])
        kept = checkpoint_id(client, "orders/b")
    found = missed(server.url, receipts)
    losses = [f for f in found if isinstance(f, WindowLoss)]
    assert len(losses) == 1 and losses[0].reason == "expired"
    assert losses[0].first <= gone <= losses[0].last < kept
    assert found[0] == losses[0], "a loss comes first, like a tombstone before records"
    assert [f.key for f in found if isinstance(f, CommittedVersion)] == ["orders/b"]

    # (by now the window may have taken orders/b's checkpoint too: a longer loss)
    refused = cli(server.url, receipts)
    assert refused.returncode == 3
    assert "expired" in refused.stderr and "--accept-loss" in refused.stderr
    lost = json.loads(refused.stdout.splitlines()[0])
    assert lost["reason"] == "expired" and lost["lost"][0] == losses[0].first
    accepted = cli(server.url, receipts, "--accept-loss")
    assert accepted.returncode == 0
    assert json.loads(accepted.stdout.splitlines()[0])["reason"] == "expired"
    table = subprocess.run(
        [WAYMARK, "recovery", "missed", "--url", server.url, "--store", str(receipts),
         "--client", "indexer", "--recent-s", "0", "--accept-loss"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "lost: checkpoints" in table and "expired" in table


def test_checkpoints_older_than_the_client_window_are_reported_as_lost(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start_waymark("--checkpoint-interval-s", "0.05")
    receipts = tmp_path / "receipts.db"
    first_start(server.url, receipts)
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of("a", tag="a")])
        old = checkpoint_id(client, "orders/a")
        time.sleep(1.2)  # the checkpoint ages past the client's window (wall time)
        client.append("orders", [RecordIn.of("b", tag="b")])
        checkpoint_id(client, "orders/b")
    found = missed(server.url, receipts, max_window_s=1)
    assert found[0] == WindowLoss(old, old, "outside_window"), found
    assert [f.key for f in found[1:] if isinstance(f, CommittedVersion)] == ["orders/b"]
    # A window that holds it: no loss, both keys.
    assert {f.key for f in missed(server.url, receipts) if isinstance(f, CommittedVersion)} == {
        "orders/a", "orders/b"
    }  # fmt: skip


def test_only_ids_that_held_checkpoints_are_reported_lost() -> None:
    """Ids a crash skipped never held a checkpoint (a reader is never told of a loss that
    did not happen); those the server expired and those older than the client's window
    did, each with its reason."""
    assert window_losses(3, 6, ServerView("x", expired_to=2, older=0)) == []
    assert window_losses(3, 6, ServerView("x", expired_to=2, older=3)) == []
    assert window_losses(3, 9, ServerView("x", expired_to=5, older=8)) == [
        WindowLoss(4, 5, "expired"), WindowLoss(6, 8, "outside_window")
    ]  # fmt: skip
    assert window_losses(3, 9, ServerView("x", expired_to=12, older=0)) == [
        WindowLoss(4, 9, "expired")
    ]  # fmt: skip


def test_a_watch_cursor_behind_the_window_is_refused(
    start_waymark: Callable[..., ServerProcess],
) -> None:
    """A follower reconnecting after its next checkpoints expired would pass them
    silently: refused, so the service stops and the query reports them lost."""
    import httpx

    server = start_waymark("--checkpoint-interval-s", "0.05", "--recovery-window-s", "1")
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of("a", tag="a")])
        gone = checkpoint_id(client, "orders/a")
        deadline = time.monotonic() + 20
        while list(client.checkpoints()):
            assert time.monotonic() < deadline, "the checkpoint outlives the window"
            time.sleep(0.1)
    answer = httpx.get(f"{server.url}/v0/changes/watch", params={"after": str(gone - 1)})
    assert answer.status_code == 400
    assert answer.json()["error"]["detail"]["lost"] == [gone, gone]


def test_an_open_stream_overtaken_by_the_window_ends_with_the_lost_range() -> None:
    """A follower that stalls while its next checkpoints pass the window (a slow
    listener, a full socket) would skip them if the stream went on from the next one
    kept: the stream ends with the ids it could not send
    (docs/semantics/recovery.md §3.6). The server's own feed, time injected."""
    clock = ManualClock()
    engine = Engine(clock=clock)
    engine.track_changes(1_000)

    def checkpoint(tag: str) -> int:
        engine.append("orders", [RecordIn.of(tag, tag=tag)])
        result = engine.emit_checkpoint()
        assert result is not None
        return result.seqs[0]

    feed = CheckpointFeed(ChangesApi(engine, cast(Any, None), cast(Any, None), 1.0), 0, None)
    first = checkpoint("a")
    sent, _ = asyncio.run(feed.next())
    assert f"id: {first}\n".encode() in sent
    stalled = [checkpoint("b"), checkpoint("c")]  # the stream does not send these in time
    clock.advance(1_001)
    checkpoint("d")
    with pytest.raises(TopicError) as refused:
        asyncio.run(feed.next())
    assert refused.value.detail == {"lost": stalled, "reason": "expired"}
