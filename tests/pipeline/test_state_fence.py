"""Stage-state saves are fenced (docs/semantics/pipeline.md §4.4): a hypothesis state
machine starts instances of one stage (each claims the state) and lets old and new
ones save over a real ``file://`` store. Only the newest claimant's saves land; a
superseded instance gets :class:`StageFenced` and changes nothing. Writing without
the conditional put (a mutant) lets a zombie overwrite its successor, and the machine
catches it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import waymark.pipeline.state as state_module
from waymark.objstore import OVERWRITE, open_store
from waymark.pipeline.state import (
    CheckpointedStageState,
    Position,
    StageFenced,
    StageStateStore,
)


class StageFenceMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.url = Path(self.dir.name).as_uri()
        # one store object per instance, as each would be a process of its own
        self.instances: list[tuple[StageStateStore, CheckpointedStageState]] = []
        self.saved: CheckpointedStageState | None = None  # the newest instance's last save

    def teardown(self) -> None:
        if hasattr(self, "dir"):
            self.dir.cleanup()

    @rule()
    def an_instance_starts(self) -> None:
        states = StageStateStore(open_store(self.url))
        claimed = states.claim(CheckpointedStageState(stage="t", input_edge="e"),
                               f"i{len(self.instances)}")  # fmt: skip
        if self.saved is not None:  # a claim keeps the progress it finds
            assert claimed.input == self.saved.input
        self.instances.append((states, claimed))

    @precondition(lambda self: self.instances)
    @rule(data=st.data(), seq=st.integers(0, 1000))
    def an_instance_saves(self, data: st.DataObject, seq: int) -> None:
        i = data.draw(st.integers(0, len(self.instances) - 1))
        states, mine = self.instances[i]
        mine.input = Position(1, seq)
        newest = i == len(self.instances) - 1
        if newest:
            states.save(mine)
            self.saved = msgspec.structs.replace(mine)
            return
        before = StageStateStore(open_store(self.url)).load("t")
        try:
            states.save(mine)
        except StageFenced as fenced:
            assert fenced.current.owner == f"i{len(self.instances) - 1}"
        else:
            raise AssertionError(f"a superseded instance saved (i{i})")
        assert StageStateStore(open_store(self.url)).load("t") == before

    @invariant()
    def the_newest_claimant_owns_the_state(self) -> None:
        if not self.instances:
            return
        stored = StageStateStore(open_store(self.url)).load("t")
        assert stored is not None
        assert stored.owner == f"i{len(self.instances) - 1}", "a superseded instance saved"
        assert stored.incarnation == len(self.instances)
        if self.saved is not None:
            assert stored.input == self.saved.input


SETTINGS = settings(
    max_examples=30, stateful_step_count=15, deadline=None, derandomize=True, database=None,
    suppress_health_check=list(HealthCheck),
)  # fmt: skip


def test_only_the_newest_instance_of_a_stage_saves_its_state() -> None:
    run_state_machine_as_test(StageFenceMachine, settings=SETTINGS)


def test_a_save_without_the_conditional_write_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "put_mode", lambda version: OVERWRITE)
    with pytest.raises(AssertionError, match="a superseded instance saved"):
        run_state_machine_as_test(
            StageFenceMachine, settings=settings(SETTINGS, phases=[Phase.generate])
        )
