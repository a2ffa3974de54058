"""The engine's change collection (docs/semantics/recovery.md §1.2): a checkpoint
names a change only once its WAL frame is synced, and a refused checkpoint write
loses nothing."""

from __future__ import annotations

import msgspec
import pytest
from tests.log.test_fsync_state import OrderedJournal

from waymark.clock import ManualClock
from waymark.log import CHANGES_TOPIC, Engine, ErrorCode, RecordIn, TopicError
from waymark.log.changes import Changes
from waymark.protocol import CheckpointData


class RefusingJournal(OrderedJournal):
    """Fault injector: an OrderedJournal whose shard refuses writes while ``failing``."""

    failing = False

    def check_available(self, topic: str) -> None:
        if self.failing:
            raise TopicError(ErrorCode.STORAGE_UNAVAILABLE, "injected: the disk is full")


def keys_of(engine: Engine, seq: int) -> dict[str, tuple[int, int]]:
    """The changes of checkpoint ``seq``, read back from the checkpoint topic."""
    page = engine.diff(CHANGES_TOPIC, seq - 1, limit=1, per_record=True, touch=False)
    (run,) = page.runs
    stored = msgspec.json.decode(bytes(run)[:-1])["data"]
    return {c.key: (c.first, c.last) for c in msgspec.convert(stored, CheckpointData).changes}


def test_only_synced_changes_are_in_a_checkpoint() -> None:
    journal = RefusingJournal()
    engine = Engine(clock=ManualClock(), journal=journal)
    engine.track_changes(60_000)
    engine.append("orders", [RecordIn.of(1, tag="a")])
    assert engine.emit_checkpoint() is None, "a checkpoint named an unsynced change"
    journal.sync(journal.submitted)
    engine.append("orders", [RecordIn.of(2, tag="b")])  # not synced yet
    result = engine.emit_checkpoint()
    assert result is not None
    journal.sync(journal.submitted)
    assert keys_of(engine, result.seqs[0]) == {"orders/a": (1, 1)}
    later = engine.emit_checkpoint()
    assert later is not None
    journal.sync(journal.submitted)
    assert keys_of(engine, later.seqs[0]) == {"orders/b": (2, 2)}


def test_mutant_taking_unsynced_changes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Changes.take

    def take_all(self: Changes) -> object:
        self._commits = [None] * len(self._commits)
        self._removals = [(None, *rest) for _, *rest in self._removals]
        return original(self)

    monkeypatch.setattr(Changes, "take", take_all)
    with pytest.raises(AssertionError, match="unsynced"):
        test_only_synced_changes_are_in_a_checkpoint()


def test_a_refused_checkpoint_write_keeps_the_changes() -> None:
    journal = RefusingJournal()
    engine = Engine(clock=ManualClock(), journal=journal)
    engine.track_changes(60_000)
    engine.append("orders", [RecordIn.of(1, tag="a")])
    journal.sync(journal.submitted)
    journal.failing = True
    with pytest.raises(TopicError) as refused:
        engine.emit_checkpoint()
    assert refused.value.code is ErrorCode.STORAGE_UNAVAILABLE
    journal.failing = False
    result = engine.emit_checkpoint()
    assert result is not None
    journal.sync(journal.submitted)
    assert keys_of(engine, result.seqs[0]) == {"orders/a": (1, 1)}
