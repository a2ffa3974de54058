"""Change checkpoints survive the server (docs/semantics/recovery.md §1.6): a change
the log acknowledged is in some checkpoint whatever happens to the server process.
Played as a user would, with real ``waymark serve`` processes, the shipped service and
the shipped CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import ServerProcess

from waymark.client import Client
from waymark.clock import ManualClock
from waymark.log import CHANGES_TOPIC
from waymark.log.config import StorageConfig
from waymark.log.storage.restore import open_engine
from waymark.protocol import ConfigPatch, Durability, RecordIn
from waymark.recovery import LocalReceiptStore, RecoveryService, TopicCheckpoints

WAYMARK = str(Path(sys.executable).parent / "waymark")


def cli_missed(url: str, store: Path, client: str) -> dict[str, int]:
    """``waymark recovery missed --json``: key -> version."""
    out = subprocess.run(
        [WAYMARK, "recovery", "missed", "--url", url, "--store", str(store), "--client", client,
         "--topics", "orders", "--recent-s", "0", "--json"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    return {line["key"]: line["version"] for line in map(json.loads, out.splitlines())}


def wait_named(url: str, key: str, timeout: float = 20.0) -> None:
    """Until some change checkpoint names ``key``."""
    deadline = time.monotonic() + timeout
    with Client(url) as client:
        while not any(ch.key == key for cp in client.checkpoints() for ch in cp.changes):
            assert time.monotonic() < deadline, f"no checkpoint names {key}"
            time.sleep(0.05)


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_change_acked_before_a_stop_is_reported_after_it(
    stop: signal.Signals, spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The repro of issue #23, item 1: a client subscribed once, ``x`` appended and
    acknowledged, the server stopped before its checkpoint interval came round,
    restarted, ``y`` appended: ``recovery missed`` names both."""
    data, receipts = tmp_path / "data", tmp_path / "receipts.db"
    # An interval no test outlives: x's checkpoint can only come from the restart.
    server = spawn_server(data, "--checkpoint-interval-s", "3600")
    with Client(server.url) as client:
        client.put_topic("orders", ConfigPatch(durability=Durability.FSYNC))
    service = RecoveryService(TopicCheckpoints(server.url, topics=["orders"]),
                              LocalReceiptStore(receipts), "indexer", recent_s=0)  # fmt: skip
    assert list(service.subscribe(lambda committed: None)) == []  # a first start
    service.close()
    service.store.close()
    with Client(server.url) as client:
        x = client.append("orders", [RecordIn.of("x", tag="x")]).seqs[0]  # acknowledged
    assert server.stop(stop) == (-signal.SIGKILL if stop is signal.SIGKILL else 0)

    server = spawn_server(data, "--checkpoint-interval-s", "0.05")
    with Client(server.url) as client:
        y = client.append("orders", [RecordIn.of("y", tag="y")]).seqs[0]
    wait_named(server.url, "orders/y")
    assert cli_missed(server.url, receipts, "indexer") == {"orders/x": x, "orders/y": y}


def newest_id(url: str) -> int:
    with Client(url) as client:
        return max((c.id for c in client.checkpoints()), default=0)


def test_checkpoints_after_a_crash_gap_are_listed(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A crash leaves seqs of the checkpoint topic that no checkpoint holds (the lead of
    its seq ceiling, docs/durability.md), which a seal before it does not know of: the
    listing walks past them to every later checkpoint. The crash is built in process on
    a manual clock, so the lead is there whatever the machine's load."""
    data = tmp_path / "data"
    clock = ManualClock(int(time.time() * 1000))  # the server that reads it back runs on now
    engine, store, _ = open_engine(StorageConfig(data), track_changes=True, clock=clock)
    engine.track_changes(86_400_000)
    engine.put_topic("orders", ConfigPatch(durability=Durability.FSYNC))
    for i in range(60):  # a checkpoint every millisecond: the ceiling leads the head
        engine.append("orders", [RecordIn.of(i, tag="a")])
        store.sync_blocking()
        engine.emit_checkpoint()
        clock.advance(1)
        if i == 20:
            store.seal(engine)  # a seal that knows nothing of the gap to come
    store.sync_blocking()
    changes = engine.kernel.existing(CHANGES_TOPIC)
    assert changes.durable_ceiling > changes.head_seq, "no lead: the case is not played"
    before = changes.head_seq
    store.close()  # a crash: no trim of the ceiling

    server = spawn_server(data, "--checkpoint-interval-s", "0.02", "--seal-interval-s", "3600")
    assert newest_id(server.url) == before
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of("b", tag="b")])
    wait_named(server.url, "orders/b")
    assert newest_id(server.url) > before + 1, "no gap: the case is not played"
    server.stop(signal.SIGKILL)
    server = spawn_server(data, "--checkpoint-interval-s", "3600")
    wait_named(server.url, "orders/b")


def test_the_newest_checkpoint_is_found_below_a_crash_gap(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A crash whose restart has nothing to name leaves the checkpoint topic's newest
    seqs in the gap its ceiling led by (docs/durability.md): the listing walks below
    them, so a client's newest id is the last checkpoint, not 0, and its changes are
    reported. Found by the kill loop (test_kills.py): a last restart with nothing to
    name made ``missed()`` report nothing at all."""
    data = tmp_path / "data"
    engine, wal, _ = open_engine(StorageConfig(data), track_changes=True)
    engine.track_changes(86_400_000)
    engine.put_topic("orders", ConfigPatch(durability=Durability.FSYNC))
    for i in range(50):  # checkpoints in a burst: the topic's ceiling leads its head
        engine.append("orders", [RecordIn.of(i, tag="a")])
        wal.sync_blocking()
        engine.emit_checkpoint()
    wal.sync_blocking()
    changes = engine.kernel.existing(CHANGES_TOPIC)
    assert changes.durable_ceiling > changes.head_seq, "no lead: the case is not played"
    wal.close()  # a crash: no trim, no last checkpoint; every change is named already

    receipts = LocalReceiptStore(tmp_path / "receipts.db")
    receipts.store_low_watermark("indexer", 0)  # subscribed before the first append
    server = spawn_server(data, "--checkpoint-interval-s", "3600")
    service = RecoveryService(TopicCheckpoints(server.url), receipts, "indexer", recent_s=0,
                              report=False)  # fmt: skip
    try:
        assert service.source.newest_id() == changes.head_seq
        assert [(c.key, c.version) for c in service.missed()] == [("orders/a", 50)]
    finally:
        service.close()
        receipts.close()
