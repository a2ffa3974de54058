"""A recovery service that cannot go on stops visibly (docs/semantics/recovery.md §3.6):
a listener that raises, a server replaced under a following service. Never a dead
thread and a service that goes on taking receipts. Real ``waymark serve`` processes."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

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

FAST = ("--checkpoint-interval-s", "0.05")


def until(condition: Callable[[], object], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def append(url: str, tag: str) -> int:
    with Client(url) as client:
        seq = client.append("orders", [RecordIn.of(tag, tag=tag)]).seqs[0]
        until(lambda: any(c.key == f"orders/{tag}" for cp in client.checkpoints()
                          for c in cp.changes), f"no checkpoint names {tag}")  # fmt: skip
        return seq


def test_a_listener_that_raises_stops_the_service_visibly(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Repro of issue #23, item 3: one exception in a listener ended live notifications
    silently (a traceback on stderr), and receipts were still accepted."""
    server = start_waymark(*FAST)
    receipts = tmp_path / "receipts.db"

    def service(**options: object) -> RecoveryService:
        return RecoveryService(TopicCheckpoints(server.url), LocalReceiptStore(receipts),
                               "indexer", recent_s=0, **options)  # type: ignore[arg-type]  # fmt: skip

    first = service(report=False)
    list(first.subscribe(lambda committed: None))
    first.close()
    append(server.url, "a")
    append(server.url, "b")

    def listener(committed: CommittedVersion) -> None:
        raise ValueError(f"cannot index {committed.key}")

    svc = service(report_to=server.url, report_every_s=0.1)
    try:
        missed = svc.subscribe(listener)
        a = next(missed)  # the iterator is being read when the listener fails
        assert isinstance(a, CommittedVersion) and a.key == "orders/a"
        append(server.url, "c")
        until(lambda: svc.failure is not None, "the service never stopped")
        assert "listener raised ValueError: cannot index orders/c" in str(svc.failure)
        with pytest.raises(RecoveryError, match="listener raised"):
            next(missed)
        with pytest.raises(RecoveryError, match="listener raised"):
            svc.submit_receipt(a).result(timeout=10)
        status = svc.status()
        assert status.failure is not None and "listener raised" in status.failure
        with Client(server.url) as client:  # the server's view (recovery clients, console)
            until(lambda: any(c.failed for c in client.list_recovery_clients().clients),
                  "the failure never reached the server")  # fmt: skip
    finally:
        svc.close()
        svc.store.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_replaced_under_a_following_service_stops_it(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Its checkpoint ids restart below the service's cursor: waiting for them to pass
    it would skip them silently (issue #23, item 4, live)."""
    port = free_port()
    server = start_waymark(*FAST, port=port)
    for tag in ("a", "b", "c"):
        append(server.url, tag)
    svc = RecoveryService(TopicCheckpoints(server.url), LocalReceiptStore(tmp_path / "r.db"),
                          "indexer", recent_s=0, report=False)  # fmt: skip
    try:
        list(svc.subscribe(lambda committed: None))
        server.stop(signal.SIGKILL)
        start_waymark(*FAST, port=port)  # another data directory, the same address
        until(lambda: svc.failure is not None, "the service followed another instance")
        assert "instance" in str(svc.failure)
        with pytest.raises(RecoveryError):
            svc.submit_receipt("orders/a", 1, 1).result(timeout=10)
    finally:
        svc.close()
        svc.store.close()


def test_the_receipt_stores_own_topic_is_never_reported(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Repro of issue #23, item 6: an unfiltered client whose receipts live in a topic
    was told of its own receipt writes, receipted them, wrote again: forever."""
    from waymark.recovery import TopicReceiptStore

    server = start_waymark(*FAST)

    def service() -> RecoveryService:
        return RecoveryService(TopicCheckpoints(server.url),
                               TopicReceiptStore(server.url, "indexer-receipts"), "indexer",
                               recent_s=0, report=False)  # fmt: skip

    got: list[CommittedVersion] = []
    svc = service()
    try:
        list(svc.subscribe(got.append))
        append(server.url, "a")
        until(lambda: any(c.key == "orders/a" for c in got), "orders/a never came")
        svc.submit_receipt(next(c for c in got if c.key == "orders/a")).result(timeout=10)
        append(server.url, "b")  # a checkpoint after the receipt's own write
        until(lambda: any(c.key == "orders/b" for c in got), "orders/b never came")
        assert {c.key for c in got} == {"orders/a", "orders/b"}, got
    finally:
        svc.close()
        svc.store.close()
    again = service()
    try:
        assert [c.key for c in again.missed()] == ["orders/b"]  # type: ignore[union-attr]
    finally:
        again.close()
        again.store.close()


def test_a_listener_on_a_server_with_tokens_streams_with_the_token(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The token given to ``TopicCheckpoints`` goes to the listener's stream too: without
    it the stream was refused (401) and the service stopped at its first checkpoint."""
    tokens = tmp_path / "tokens.toml"
    made = subprocess.run(
        [str(Path(sys.executable).parent / "waymark"), "token", "new", "indexer", "--scope",
         "admin", "--tokens", str(tokens)], capture_output=True, text=True, check=True,
    )  # fmt: skip
    secret = made.stdout.strip().splitlines()[-1]
    server = start_waymark(*FAST, "--tokens", str(tokens))
    heard: list[CommittedVersion] = []
    svc = RecoveryService(TopicCheckpoints(server.url, token=secret),
                          LocalReceiptStore(tmp_path / "r.db"), "indexer", recent_s=0,
                          report=False)  # fmt: skip
    try:
        assert list(svc.subscribe(heard.append)) == []
        with Client(server.url, token=secret) as client:
            client.append("orders", [RecordIn.of(1, tag="a")])
        until(lambda: heard or svc.failure is not None, "the listener heard nothing")
        assert svc.failure is None, svc.failure
        assert [c.key for c in heard] == ["orders/a"]
    finally:
        svc.close()
        svc.store.close()
