"""A restart names what no change checkpoint named before it
(docs/semantics/recovery.md §1.6): the engine's changes are rebuilt from the catalog
and the WAL, against a real data directory, and only those the replayed checkpoints
do not cover."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from waymark.clock import ManualClock
from waymark.log import CHANGES_TOPIC, ConfigPatch, Durability, Engine, RecordIn, TagMatch
from waymark.log.changes import Changes
from waymark.log.config import StorageConfig
from waymark.log.storage.restore import open_engine
from waymark.log.storage.store import Store
from waymark.protocol import CheckpointData

Named = dict[str, tuple[int, int, int]]  # key -> (first, last, epoch)


def start(data_dir: Path, *, track: bool = True) -> tuple[Engine, Store]:
    engine, store, _ = open_engine(
        StorageConfig(data_dir), clock=ManualClock(), track_changes=track
    )
    if track:
        engine.track_changes(60_000)
    return engine, store


def crash(engine: Engine, store: Store) -> None:
    """What a SIGKILL leaves: the WAL as written, no exact heads, no seal."""
    store.sync_blocking()
    store.close()


def checkpoint(engine: Engine, store: Store) -> Named:
    """One checkpoint of everything committed, read back (empty: none written)."""
    store.sync_blocking()
    result = engine.emit_checkpoint()
    if result is None:
        return {}
    store.sync_blocking()
    page = engine.diff(CHANGES_TOPIC, result.seqs[0] - 1, limit=1, per_record=True, touch=False)
    (run,) = page.runs
    data = msgspec.convert(msgspec.json.decode(bytes(run)[:-1])["data"], CheckpointData)
    return {c.key: (c.first, c.last, c.epoch) for c in data.changes}


def test_a_crash_before_the_checkpoint_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    engine, store = start(tmp_path)
    engine.append("orders", [RecordIn.of(1, tag="a"), RecordIn.of(2, tag="b"), RecordIn.of(3)])
    epoch = engine.get_topic("orders").epoch
    assert checkpoint(engine, store) == {
        "orders/a": (1, 1, epoch), "orders/b": (2, 2, epoch), "orders": (3, 3, epoch)
    }  # fmt: skip
    engine.append("orders", [RecordIn.of(4, tag="a")])
    engine.delete("orders", match=TagMatch(True, "b"))  # takes seq 5 for itself
    engine.append("gone", [RecordIn.of(1, tag="z")])
    gone = engine.get_topic("gone").epoch
    engine.delete_topic("gone")  # named at the seq it would have handed out next: 2
    crash(engine, store)

    engine, store = start(tmp_path)
    assert checkpoint(engine, store) == {
        "orders/a": (4, 4, epoch), "orders/b": (5, 5, epoch),
        "gone/z": (1, 2, gone), "gone": (2, 2, gone),
    }  # fmt: skip
    crash(engine, store)
    engine, store = start(tmp_path)  # that checkpoint is replayed: nothing named again
    assert checkpoint(engine, store) == {}
    crash(engine, store)


def test_a_seal_keeps_what_no_checkpoint_named(tmp_path: Path) -> None:
    """The WAL frames that noted a change go with a seal: the catalog keeps the change."""
    engine, store = start(tmp_path)
    engine.append("orders", [RecordIn.of(1, tag="a")])
    checkpoint(engine, store)
    engine.append("orders", [RecordIn.of(2, tag="b"), RecordIn.of(3, tag="c")])
    store.seal(engine)
    engine.append("orders", [RecordIn.of(4, tag="b")])  # in the WAL after the seal
    crash(engine, store)

    engine, store = start(tmp_path)
    epoch = engine.get_topic("orders").epoch
    assert checkpoint(engine, store) == {"orders/b": (2, 4, epoch), "orders/c": (3, 3, epoch)}
    crash(engine, store)


def test_a_checkpoint_after_the_seal_covers_what_the_catalog_kept(tmp_path: Path) -> None:
    engine, store = start(tmp_path)
    engine.append("orders", [RecordIn.of(1, tag="a")])
    store.seal(engine)  # the catalog keeps orders/a
    checkpoint(engine, store)  # then a checkpoint names it, in the WAL after the seal
    crash(engine, store)
    engine, store = start(tmp_path)
    assert checkpoint(engine, store) == {}
    crash(engine, store)


def test_a_dropped_memory_topic_names_the_keys_of_its_replayed_records(tmp_path: Path) -> None:
    """A memory topic's frames recover in the background; dropped while they wait, they
    still tell which keys the drop changed."""
    engine, store = start(tmp_path)
    engine.put_topic("notes", ConfigPatch(durability=Durability.MEMORY))
    engine.append("notes", [RecordIn.of(1, tag="q")])
    epoch = engine.get_topic("notes").epoch
    engine.delete_topic("notes")
    crash(engine, store)
    engine, store = start(tmp_path)
    assert checkpoint(engine, store) == {"notes/q": (1, 2, epoch), "notes": (2, 2, epoch)}
    crash(engine, store)


def test_a_server_that_keeps_no_checkpoints_rebuilds_nothing(tmp_path: Path) -> None:
    engine, store = start(tmp_path)
    engine.append("orders", [RecordIn.of(1, tag="a")])
    crash(engine, store)
    engine, store = start(tmp_path, track=False)
    assert engine.changes is None
    crash(engine, store)


def test_mutant_no_rebuild_at_start_is_caught(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Mutant: a restore notes nothing again (the first design)."""
    monkeypatch.setattr(Changes, "replayed", lambda self: Changes())
    with pytest.raises(AssertionError):
        test_a_crash_before_the_checkpoint_loses_nothing_and_repeats_nothing(tmp_path)


def test_mutant_no_coverage_names_changes_twice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Mutant: replayed checkpoints cover nothing: every change is named again."""
    monkeypatch.setattr(Changes, "cover", lambda self, covered: None)
    with pytest.raises(AssertionError):
        test_a_crash_before_the_checkpoint_loses_nothing_and_repeats_nothing(tmp_path)


def test_a_seal_right_after_a_restart_keeps_only_what_no_checkpoint_named(
    tmp_path: Path,
) -> None:
    """The restart notes every replayed change again, those a replayed checkpoint covers
    too; a seal before the first checkpoint keeps only the others (its segments take the
    covering checkpoint out of the WAL)."""
    engine, store = start(tmp_path)
    engine.append("orders", [RecordIn.of(1, tag="a")])
    checkpoint(engine, store)  # names orders/a
    engine.append("orders", [RecordIn.of(2, tag="b")])
    crash(engine, store)
    engine, store = start(tmp_path)
    store.seal(engine)  # before any checkpoint of this run
    crash(engine, store)
    engine, store = start(tmp_path)
    epoch = engine.get_topic("orders").epoch
    assert checkpoint(engine, store) == {"orders/b": (2, 2, epoch)}
    crash(engine, store)


def test_a_replayed_drop_is_named_at_the_version_the_live_drop_took(tmp_path: Path) -> None:
    """A restart after a crash moves a topic's next seq past its ceiling's lead; a drop
    then is named at that seq. Replayed after another crash, before any checkpoint
    named it, the drop must be named at the same version, not at the next seq replay
    reached (below the lead): found by the kill loop (tests/recovery/test_kills.py),
    where the rebuilt checkpoint named an earlier version than the live one."""
    engine, store = start(tmp_path)
    engine.put_topic("users", ConfigPatch(durability=Durability.FSYNC))
    for i in range(20):  # the ceiling leads the head
        engine.append("users", [RecordIn.of(i)])
    checkpoint(engine, store)
    crash(engine, store)
    engine, store = start(tmp_path)
    users = engine.get_topic("users")
    assert users.next_seq > users.head_seq > 0 and users.next_seq > 21, "no lead: not played"
    engine.delete_topic("users")  # named at users.next_seq, the seq it never handed out
    crash(engine, store)
    engine, store = start(tmp_path)
    assert checkpoint(engine, store)["users"] == (users.next_seq, users.next_seq, users.epoch)
    crash(engine, store)
