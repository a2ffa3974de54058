"""RecoveryService behaviours with injected time (docs/semantics/recovery.md §2-§4):
a real engine, a real SQLite store, a ManualClock; nothing sleeps."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from waymark.clock import ManualClock
from waymark.log import Engine, RecordIn, TagMatch
from waymark.recovery import (
    CommittedVersion,
    LocalReceiptStore,
    RecoveryError,
    RecoveryService,
    WindowLoss,
)

from .harness import EngineCheckpoints, FaultInjectingStore

Started = tuple[
    RecoveryService, EngineCheckpoints, list[CommittedVersion | WindowLoss], list[CommittedVersion]
]


class World:
    def __init__(self, tmp_path: Path, topics: list[str] | None = None) -> None:
        self.clock = ManualClock()
        self.engine = Engine(clock=self.clock)
        self.engine.track_changes(86_400_000)
        self.path = tmp_path / "receipts.db"
        self.topics = topics
        self.services: list[RecoveryService] = []

    def write(self, *keys: str) -> None:
        """One checkpoint a second later naming ``keys`` ("topic/tag")."""
        for key in keys:
            topic, _, tag = key.partition("/")
            self.engine.append(topic, [RecordIn.of(key, tag=tag or None)])
        self.clock.advance(1_000)
        assert self.engine.emit_checkpoint() is not None

    def at(self, key: str, version: int) -> CommittedVersion:
        """``key`` at ``version`` of its topic's current instance."""
        epoch = self.engine.get_topic(key.split("/", 1)[0], touch=False).epoch
        return CommittedVersion(key, version, epoch)

    def receipt(self, service: RecoveryService, key: str, version: int) -> Future[None]:
        return service.submit_receipt(key, version, self.at(key, version).epoch)

    def start(self, **options: float) -> Started:
        source = EngineCheckpoints(self.engine, self.topics)
        store = FaultInjectingStore(LocalReceiptStore(self.path))
        service = RecoveryService(source, store, "c", clock=self.clock, **options)  # type: ignore[arg-type]
        live: list[CommittedVersion] = []
        missed = list(service.subscribe(live.append))
        self.services.append(service)
        return service, source, missed, live


def test_first_start_reports_nothing_then_misses_are_reported(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.write("orders/a")
    service, source, missed, live = world.start(recent_s=5)
    assert missed == [] and live == []  # a first start
    world.write("orders/a")
    world.write("orders/b")
    source.deliver()
    assert live == [world.at("orders/a", 2), world.at("orders/b", 3)]
    world.receipt(service, "orders/b", 3).result(timeout=1)
    world.clock.advance(10_000)
    _, _, missed, _ = world.start(recent_s=5)  # a crash: a new service on the same file
    assert missed == [world.at("orders/a", 2)]  # b was receipted, a was not


def test_receipts_persist_per_checkpoint_and_futures_wait_for_it(tmp_path: Path) -> None:
    world = World(tmp_path)
    service, source, _, _ = world.start()
    world.write("orders/a", "orders/b")
    source.deliver()
    first = world.receipt(service, "orders/a", 1)
    assert not first.done(), "resolved before every key of its checkpoint was receipted"
    assert service.status().ranges == []
    again = world.receipt(service, "orders/a", 1)  # idempotent
    world.receipt(service, "orders/b", 2).result(timeout=1)
    assert first.done() and again.done() and first.exception() is None
    refused = world.receipt(service, "orders/a", 99)
    assert isinstance(refused.exception(timeout=0), RecoveryError)
    assert isinstance(service.submit_receipt("nowhere", 1, 1).exception(timeout=0), RecoveryError)


def test_a_later_version_receipts_earlier_ones(tmp_path: Path) -> None:
    world = World(tmp_path)
    service, source, _, _ = world.start(recent_s=0)
    world.write("orders/a")
    world.write("orders/a")
    source.deliver()
    world.receipt(service, "orders/a", 2).result(timeout=1)
    world.clock.advance(1_000)
    _, _, missed, _ = world.start(recent_s=0)
    assert missed == []


def test_recent_checkpoints_go_to_the_listener_not_the_missed(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.start(recent_s=5)
    world.write("orders/a")
    _, _, missed, live = world.start(recent_s=5)  # 1 s later: in flight
    assert missed == [] and live == [world.at("orders/a", 1)]
    world.clock.advance(5_000)
    _, _, missed, live = world.start(recent_s=5)
    assert missed == [world.at("orders/a", 1)] and live == []


def test_a_watermark_older_than_the_window_moves_into_it(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.start(recent_s=0)
    world.write("orders/old")
    world.clock.advance(3_600_000)
    world.write("orders/new")
    store = LocalReceiptStore(world.path)
    assert store.low_watermark("c") == 0
    service, _, missed, _ = world.start(recent_s=0, max_window_s=60)
    # the old one is outside the window: announced, not reported
    assert missed == [WindowLoss(1, 1, "outside_window"), world.at("orders/new", 2)]
    assert store.low_watermark("c") == 1  # moved behind the window's first checkpoint
    world.receipt(service, "orders/new", 2).result(timeout=1)
    assert store.low_watermark("c") == 2 and list(store.range_receipts("c", 0)) == []


def test_compression_merges_contiguous_ranges(tmp_path: Path) -> None:
    world = World(tmp_path)
    service, source, _, _ = world.start(recent_s=0, compress_interval_s=60)
    for key in ("t/a", "t/b", "t/c", "t/d"):
        world.write(key)
    source.deliver()
    for key, version in (("t/b", 2), ("t/d", 4), ("t/c", 3)):  # a stays: no watermark move
        world.receipt(service, key, version).result(timeout=1)
    store = LocalReceiptStore(world.path)
    assert sorted(store.range_receipts("c", 0)) == [(2, 2), (3, 3), (4, 4)]
    world.clock.advance(60_000)  # the interval is due: the next flush compresses
    world.receipt(service, "t/c", 3).result(timeout=1)  # (idempotent: nothing new)
    assert sorted(store.range_receipts("c", 0)) == [(2, 2), (3, 3), (4, 4)]
    assert service.compress() == 2
    assert list(store.range_receipts("c", 0)) == [(2, 4)]
    _, _, missed, _ = world.start(recent_s=0)
    assert missed == [world.at("t/a", 1)]
    world.receipt(service, "t/a", 1)  # (the old run's ledger: no effect on the store)


def test_a_filtered_consumer_receipts_other_topics_implicitly(tmp_path: Path) -> None:
    world = World(tmp_path, topics=["orders"])
    service, source, _, live = world.start(recent_s=0)
    world.write("users/u")
    world.write("orders/a", "users/v")
    source.deliver()
    assert live == [world.at("orders/a", 1)]
    world.receipt(service, "orders/a", 1).result(timeout=1)
    assert LocalReceiptStore(world.path).low_watermark("c") == 2  # past users-only ones too


def test_a_failed_store_write_fails_the_future_and_a_retry_persists(tmp_path: Path) -> None:
    world = World(tmp_path)
    service, source, _, _ = world.start(recent_s=0)
    world.write("orders/a")
    source.deliver()
    store = service.store
    assert isinstance(store, FaultInjectingStore)
    store.failing = True
    failed = world.receipt(service, "orders/a", 1)
    with pytest.raises(RecoveryError, match="not persisted"):
        failed.result(timeout=1)
    store.failing = False
    world.receipt(service, "orders/a", 1).result(timeout=1)
    assert LocalReceiptStore(world.path).low_watermark("c") == 1


def test_a_deletion_is_a_later_version_than_the_state_read_before_it(tmp_path: Path) -> None:
    """docs/semantics/recovery.md §1.3: a client that read ``orders/a`` at version 1,
    then receipts it after the deletion's checkpoint arrived, has not processed the
    deletion: it is reported at the seq the deletion took."""
    world = World(tmp_path)
    service, source, _, live = world.start(recent_s=0)
    world.write("orders/a", "orders/b")
    source.deliver()
    read = live[0]  # the client reads orders/a's state now ...
    assert read == world.at("orders/a", 1)
    world.engine.delete("orders", match=TagMatch.parse("a"))  # ... then it is deleted
    world.clock.advance(1_000)
    assert world.engine.emit_checkpoint() is not None
    source.deliver()
    assert live[-1] == world.at("orders/a", 3), "the deletion's own seq"
    service.submit_receipt(read.key, read.version, read.epoch)  # ... and receipted late
    world.receipt(service, "orders/b", 2).result(timeout=1)
    world.clock.advance(1_000)
    _, _, missed, _ = world.start(recent_s=0)
    assert missed == [world.at("orders/a", 3)]


def test_a_receipt_of_a_dropped_instance_covers_nothing_of_the_new_one(tmp_path: Path) -> None:
    """A recreated topic starts its seqs again: ``orders/x`` at version 3 of the old
    instance must not receipt version 1 of the new one (docs/semantics/recovery.md §1.1)."""
    world = World(tmp_path)
    service, source, _, live = world.start(recent_s=0)
    world.write("orders/x", "orders/x", "orders/x")
    source.deliver()
    old = live[-1]
    world.engine.delete_topic("orders")
    world.write("orders/x")  # the new instance's version 1
    source.deliver()
    new = world.at("orders/x", 1)
    assert new.epoch > old.epoch and live[-1] == new
    service.submit_receipt(old.key, old.version, old.epoch).result(timeout=1)
    world.clock.advance(1_000)
    _, _, missed, _ = world.start(recent_s=0)
    # the drop names the topic key too, at the seq the old instance would have given next
    assert missed == [CommittedVersion("orders", 4, old.epoch), new]
    refused = service.submit_receipt(new.key, 2, new.epoch)
    assert isinstance(refused.exception(timeout=0), RecoveryError)
