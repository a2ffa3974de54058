"""Topic filters are checked and remembered (docs/semantics/recovery.md §3.4): a filter
naming a topic that does not exist is refused with close matches; the filter is kept
with the receipts and a later run with another one is refused unless it says so.
Real ``waymark serve`` processes, the shipped service and CLI."""

from __future__ import annotations

import json
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
    WindowLoss,
)

WAYMARK = str(Path(sys.executable).parent / "waymark")
FAST = ("--checkpoint-interval-s", "0.05")


def service(url: str, receipts: Path, topics: list[str] | None) -> RecoveryService:
    return RecoveryService(TopicCheckpoints(url, topics), LocalReceiptStore(receipts),
                           "indexer", recent_s=0, report=False)  # fmt: skip


def close(svc: RecoveryService) -> None:
    svc.close()
    svc.store.close()


def cli(url: str, receipts: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WAYMARK, "recovery", "missed", "--url", url, "--store", str(receipts),
         "--client", "indexer", "--recent-s", "0", "--json", *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def named(url: str, key: str) -> None:
    deadline = time.monotonic() + 20
    with Client(url) as client:
        while not any(c.key == key for cp in client.checkpoints() for c in cp.changes):
            assert time.monotonic() < deadline, f"no checkpoint names {key}"
            time.sleep(0.05)


def test_a_misspelled_filter_is_refused_with_close_matches(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Repro of issue #23, item 2: one run with ``["ordres"]`` receipted every checkpoint
    on arrival, and the next run with the right filter was told of nothing."""
    server = start_waymark(*FAST)
    receipts = tmp_path / "receipts.db"
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of(1, tag="a")])
    svc = service(server.url, receipts, ["ordres"])
    try:
        with pytest.raises(RecoveryError, match=r"ordres.*does not exist.*orders"):
            svc.subscribe(lambda committed: None)
    finally:
        close(svc)
    right = service(server.url, receipts, ["orders"])
    list(right.subscribe(lambda committed: None))
    close(right)
    refused = cli(server.url, receipts, "--topics", "ordres")
    assert refused.returncode == 5 and "did you mean 'orders'" in refused.stderr


def test_a_different_filter_later_is_refused_unless_asked_for(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start_waymark(*FAST)
    receipts = tmp_path / "receipts.db"
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of(1, tag="a")])
        client.append("users", [RecordIn.of(1, tag="u")])
    named(server.url, "users/u")  # before the first start
    got: list[CommittedVersion] = []
    first = service(server.url, receipts, ["orders"])
    list(first.subscribe(got.append))
    with Client(server.url) as client:
        client.append("users", [RecordIn.of(2, tag="v")])
        client.append("orders", [RecordIn.of(2, tag="b")])
    deadline = time.monotonic() + 20
    while not any(c.key == "orders/b" for c in got):
        assert time.monotonic() < deadline, "orders/b never came"
        time.sleep(0.02)
    assert [c.key for c in got] == ["orders/b"]
    first.submit_receipt(got[0]).result(timeout=10)  # users/v: receipted implicitly
    close(first)
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of(3, tag="c")])
    named(server.url, "orders/c")

    wider = service(server.url, receipts, ["orders", "users"])
    try:
        with pytest.raises(RecoveryError, match=r"orders.*orders, users.*new_filter"):
            wider.missed()
    finally:
        close(wider)
    # The CLI reads the filter the receipts were kept for when given none.
    assert [json.loads(line)["key"] for line in cli(server.url, receipts).stdout.splitlines()] == [
        "orders/c"
    ]  # fmt: skip
    shown = cli(server.url, receipts, "--topics", "orders,users")
    assert shown.returncode == 5 and "--new-filter" in shown.stderr

    wider = service(server.url, receipts, ["orders", "users"])
    try:
        found = list(wider.subscribe(lambda committed: None, new_filter=True))
        # users' changes before now were receipted implicitly: announced, not skipped
        assert isinstance(found[0], WindowLoss) and found[0].reason == "filter_changed"
        assert [c.key for c in found[1:] if isinstance(c, CommittedVersion)] == ["orders/c"]
    finally:
        close(wider)
    again = service(server.url, receipts, ["orders", "users"])  # bound to it from now on
    try:
        assert [c.key for c in again.missed() if isinstance(c, CommittedVersion)] == ["orders/c"]
    finally:
        close(again)
