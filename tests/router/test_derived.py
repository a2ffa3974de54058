"""Routers (docs/semantics/topics.md §8.1/§8.2) in-process: copies are derived (never
journaled), what a crash does to them, exactly_once keys and the recovery key check,
filters, and fsync dests."""

from __future__ import annotations

import contextlib
from pathlib import Path

import orjson
import pytest

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Engine, RecordIn
from waymark.log.config import StorageConfig
from waymark.log.journal import decode_records
from waymark.log.storage.frames import FrameKind, read_file
from waymark.log.storage.restore import open_engine
from waymark.protocol import Durability

from .test_engine import dest_data, produce


def frames_by_topic(data_dir: Path) -> dict[tuple[str, FrameKind], int]:
    """How many frames of each kind the WAL holds per topic."""
    counts: dict[tuple[str, FrameKind], int] = {}
    for path in sorted((data_dir / "wal").rglob("*.wal")):
        for frame in read_file(path)[0]:
            name = frame_topic(frame.kind, frame.payload)
            counts[(name, frame.kind)] = counts.get((name, frame.kind), 0) + 1
    return counts


def frame_topic(kind: FrameKind, payload: bytes) -> str:
    if kind is FrameKind.RECORDS:
        return decode_records(payload).name
    body = orjson.loads(payload)
    return body.get("name") or body.get("router") or "?"


def test_one_wal_write_per_source_append_whatever_the_fan_out(tmp_path: Path) -> None:
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=ManualClock())
    try:
        for i in range(8):
            engine.put_router(f"r{i}", "src", f"d{i}")
        for batch in range(10):
            produce(engine, "src", *range(batch * 100, batch * 100 + 100))
            while engine.forward().pending:
                pass
        assert all(dest_data(engine, f"d{i}") == list(range(1000)) for i in range(8))
        store.sync_blocking()
        counts = frames_by_topic(tmp_path)
    finally:
        store.close()
    assert counts[("src", FrameKind.RECORDS)] == 10
    for i in range(8):
        assert ("d" + str(i), FrameKind.RECORDS) not in counts  # copies are derived
        # A few seq reservations cover them, fewer than the appends: each one leads by
        # what the dest was handed out before it.
        assert counts[(f"d{i}", FrameKind.HEAD)] <= 8


def test_a_crash_re_derives_copies_made_since_the_seal(tmp_path: Path) -> None:
    clock = ManualClock()
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    engine.put_topic("src", ConfigPatch(durability=Durability.FSYNC))
    engine.put_topic("dst", ConfigPatch(durability=Durability.FSYNC))
    engine.put_router("r", "src", "dst")
    produce(engine, "src", 1, 2, 3)
    store.sync_blocking()  # a router forwards what fsync readers may see: synced records
    engine.forward()
    store.seal(engine)  # dest's copies 1..3 and the cursor 3, in one cut
    produce(engine, "src", 4, 5)
    store.sync_blocking()
    engine.forward()
    store.sync_blocking()  # the dest's seq ceiling for the copies, which fsync readers need
    assert dest_data(engine, "dst") == [1, 2, 3, 4, 5]
    store.sync_blocking()
    store.close()  # a kill after the last sync
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    try:
        assert engine.get_router("r").cursor == 3
        assert dest_data(engine, "dst") == [1, 2, 3]  # 4 and 5 were never journaled
        while engine.forward().pending:
            pass
        store.sync_blocking()  # the seqs the copies took, reserved anew, are durable
        assert dest_data(engine, "dst") == [1, 2, 3, 4, 5]
        # fsync dest: the seqs handed out before the crash are skipped, never reused.
        assert engine.diff("dst", 3).seqs[0] > 5
    finally:
        store.close()


def keys(engine: Engine, topic: str) -> list[list[object]]:
    pages = engine.diff(topic, 0, limit=10_000).records()
    return [orjson.loads(r["meta"]["_topics_router"]) for r in pages]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_recovery_resumes_past_the_last_key_in_dest(guarantee: str) -> None:
    engine = Engine(clock=ManualClock())
    engine.put_router("r", "src", "dst", guarantee=guarantee)
    produce(engine, "src", "a", "b", "c")
    engine.forward()
    # A cursor from an older cut than dest's records (a catalog restored from a backup
    # beside newer segments): exactly_once finds its keys in dest and skips them.
    engine.get_router("r").cursor = 1
    engine.routers.settle_replayed()
    while engine.forward().pending:
        pass
    if guarantee == "exactly_once":
        assert dest_data(engine, "dst") == ["a", "b", "c"]
        epoch = engine.get_topic("src").epoch
        assert keys(engine, "dst") == [["r", "src", epoch, s] for s in (1, 2, 3)]
    else:
        assert dest_data(engine, "dst") == ["a", "b", "c", "b", "c"]  # at-least-once


def test_exactly_once_keeps_meta_and_adds_the_key() -> None:
    engine = Engine(clock=ManualClock())
    engine.put_router("r", "src", "dst", guarantee="exactly_once", preserve_tag=False)
    engine.append("src", [RecordIn.of({"x": [1, "é"]}, tag="t", node="n", meta={"k": "v"})])
    engine.forward()
    [copy] = engine.diff("dst", 0).records()
    assert copy["data"] == {"x": [1, "é"]} and copy["$node"] == "n" and "$tag" not in copy
    epoch = engine.get_topic("src").epoch
    assert copy["meta"] == {"k": "v", "_topics_router": f'["r","src",{epoch},1]'}
    state = engine.get_topic("dst")
    assert state.bytes == len(orjson.dumps(copy["data"])) + len(orjson.dumps(copy["meta"]))


def test_filter_by_tag_and_node_advances_past_what_it_drops() -> None:
    engine = Engine(clock=ManualClock())
    engine.put_router("r", "src", "dst", record_filter={"tag": "keep", "node": ["a", "b"]})
    engine.append("src", [
        RecordIn.of(1, tag="keep", node="a"), RecordIn.of(2, tag="drop", node="a"),
        RecordIn.of(3, tag="keep", node="c"), RecordIn.of(4, tag="keep"),
        RecordIn.of(5, tag="keep", node="b"),
    ])  # fmt: skip
    engine.forward()
    assert dest_data(engine, "dst") == [1, 5]
    assert engine.get_router("r").cursor == 5
    page = engine.diff("dst", 0)
    assert page.tombstone is None  # filtering is voluntary: silent, like a node filter


class HeldCommit:
    """A commit that becomes durable only when the test says so."""

    def __init__(self) -> None:
        self.durable = False

    async def wait(self) -> None:
        raise AssertionError("not awaited in these tests")


class HeldJournal:
    """Fault injector: a journal whose syncs land only on :meth:`sync`, so a test can
    look at the moment between a write and its sync."""

    def __init__(self) -> None:
        self.commits: dict[str, HeldCommit] = {}

    def write(self, topic: str, frame: bytes) -> HeldCommit:
        commit = self.commits[topic] = HeldCommit()
        return commit

    def check_available(self, topic: str) -> None:
        return None

    def admit(self, topic: str) -> contextlib.AbstractContextManager[None]:
        self.check_available(topic)
        return contextlib.nullcontext()

    def latest(self, topic: str) -> HeldCommit:
        return self.commits.setdefault(topic, HeldCommit())

    def sync_ms(self, topic: str) -> int:
        return 0

    def file(self, topic: str) -> int:
        return 0

    def sync(self, topic: str) -> None:
        self.commits[topic].durable = True


def test_an_fsync_dest_shows_copies_once_their_source_records_are_durable() -> None:
    journal = HeldJournal()
    engine = Engine(clock=ManualClock(), journal=journal)
    engine.put_topic("dst", ConfigPatch(durability=Durability.FSYNC))
    engine.put_router("r", "src", "dst")
    journal.sync("dst")
    produce(engine, "src", 1, 2)
    engine.forward()
    journal.sync("dst")  # dest's own seq ceiling is durable; the source is not yet
    assert dest_data(engine, "dst") == []
    journal.sync("src")
    assert dest_data(engine, "dst") == [1, 2]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_copies_of_records_sealed_in_segments(tmp_path: Path, guarantee: str) -> None:
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=ManualClock())
    try:
        engine.put_topic("src", ConfigPatch())
        engine.append("src", [RecordIn.of({"i": i}, tag=f"t{i % 3}", node="n", meta={"m": "v"})
                              for i in range(50)])  # fmt: skip
        store.seal(engine)  # src's records now read through the segment's mmap
        engine.put_router("r", "src", "dst", guarantee=guarantee, record_filter={"tag": "t1"})
        engine.get_router("r").cursor = 0  # forward what was sealed before the router
        while engine.forward().pending:
            pass
        copies = engine.diff("dst", 0, limit=100).records()
        assert [c["data"]["i"] for c in copies] == [i for i in range(50) if i % 3 == 1]
        assert all(c["$tag"] == "t1" and c["$node"] == "n" for c in copies)
        assert all(c["meta"]["m"] == "v" for c in copies)
        if guarantee == "exactly_once":
            assert [orjson.loads(c["meta"]["_topics_router"])[3] for c in copies] == [
                i + 1 for i in range(50) if i % 3 == 1]  # fmt: skip
    finally:
        store.close()
