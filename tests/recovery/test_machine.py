"""The recovery state machine against the production code, and the mutants it must
catch (docs/semantics/recovery.md §5)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from waymark.recovery.ledger import Ledger

from .machine import RecoveryMachine

SETTINGS = settings(max_examples=100, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


def test_no_miss_no_false_report() -> None:
    run_state_machine_as_test(RecoveryMachine, settings=SETTINGS)


def _hunt() -> None:
    run_state_machine_as_test(
        RecoveryMachine,
        # Detection only: generated deterministically, not shrunk (seconds, not minutes).
        settings=settings(
            SETTINGS,
            max_examples=400,
            database=None,
            derandomize=True,
            phases=(Phase.generate,),
            print_blob=False,
        ),
    )


def test_mutant_receipt_persisted_before_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: a checkpoint's receipt is persisted once any of its keys is receipted."""
    monkeypatch.setattr(
        Ledger, "complete",
        lambda self, c: len(self._waiting[c]) < max(len(self._entries[c]), 1),
    )  # fmt: skip
    with pytest.raises(AssertionError, match="never reported"):
        _hunt()


def test_mutant_watermark_past_unreceipted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the watermark advances to the newest persisted checkpoint, past
    unreceipted ones."""
    monkeypatch.setattr(
        Ledger, "watermark",
        lambda self: max([self.low_watermark, *self._persisted]),
    )  # fmt: skip
    with pytest.raises(AssertionError, match="never reported"):
        _hunt()
