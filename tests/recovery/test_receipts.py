"""Strict receipts (docs/semantics/recovery.md §2.1): a receipt that cannot be right is
refused with a RecoveryError saying why, never taken as a success that receipts
nothing; a receipt already persisted is accepted again after a restart; the
CommittedVersion a listener got is a receipt as it is."""

from __future__ import annotations

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

from .test_service import World


def refusal(future: object) -> str:
    exc = future.exception(timeout=1)  # type: ignore[attr-defined]
    assert isinstance(exc, RecoveryError), exc
    return str(exc)


def test_a_receipt_that_cannot_be_right_is_refused_with_why(tmp_path: Path) -> None:
    """Repro of issue #23, item 7: an older epoch or a negative version 'succeeded' and
    receipted nothing; a non-integer version raised a bare TypeError."""
    world = World(tmp_path)
    service, source, _, live = world.start(recent_s=0)
    world.write("orders/a")
    source.deliver()
    (a,) = live
    assert "epoch" in refusal(service.submit_receipt(a.key, a.version, a.epoch - 1))
    assert "epoch" in refusal(service.submit_receipt(a.key, a.version, a.epoch + 1))
    assert "1 or more" in refusal(service.submit_receipt(a.key, -1, a.epoch))
    assert "integer" in refusal(service.submit_receipt(a.key, "1", a.epoch))  # type: ignore[arg-type]
    assert "integer" in refusal(service.submit_receipt(a.key, 1.0, a.epoch))  # type: ignore[arg-type]
    assert "integer" in refusal(service.submit_receipt(a.key, True, a.epoch))
    assert "not known to be committed" in refusal(service.submit_receipt(a.key, 2, a.epoch))
    assert "unknown key" in refusal(service.submit_receipt("orders/zz", 1, a.epoch))
    assert "unknown key" in refusal(service.submit_receipt("nowhere/x", 1, 1))
    service.submit_receipt(a).result(timeout=1)  # the CommittedVersion as it came


def test_a_filtered_client_refuses_a_key_of_a_topic_it_does_not_read(tmp_path: Path) -> None:
    world = World(tmp_path, topics=["orders"])
    service, source, _, _ = world.start(recent_s=0)
    world.write("users/u")
    source.deliver()
    assert "does not read" in refusal(
        service.submit_receipt("users/u", 1, world.at("users/u", 1).epoch)
    )


def test_a_key_is_reported_once_per_subscribe(tmp_path: Path) -> None:
    """A key missed in an old checkpoint and in flight in a recent one goes to the
    listener alone, at the newer version."""
    world = World(tmp_path)
    world.start(recent_s=0)
    world.write("orders/a")
    world.clock.advance(10_000)
    world.write("orders/a")
    _, _, missed, live = world.start(recent_s=5)
    assert missed == [] and live == [world.at("orders/a", 2)]


def test_a_persisted_receipt_is_accepted_again_after_a_restart(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start_waymark("--checkpoint-interval-s", "0.05")
    receipts = tmp_path / "receipts.db"

    def service() -> RecoveryService:
        return RecoveryService(TopicCheckpoints(server.url), LocalReceiptStore(receipts),
                               "indexer", recent_s=0, report=False)  # fmt: skip

    got: list[CommittedVersion] = []
    first = service()
    list(first.subscribe(got.append))
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of(1, tag="a")])
    deadline = time.monotonic() + 20
    while not got:
        assert time.monotonic() < deadline, "the listener got nothing"
        time.sleep(0.02)
    first.submit_receipt(got[0]).result(timeout=10)  # persisted: the watermark passes it
    first.close()
    first.store.close()
    again = service()
    try:
        assert list(again.subscribe(lambda committed: None)) == []
        again.submit_receipt(got[0]).result(timeout=10)  # idempotent, also after a restart
        with pytest.raises(RecoveryError, match="not committed"):
            again.submit_receipt(got[0].key, got[0].version + 50, got[0].epoch).result(10)
    finally:
        again.close()
        again.store.close()
