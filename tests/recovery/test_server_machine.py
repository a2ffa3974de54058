"""The recovery state machine with server restarts, data-directory replacement and
window expiry against the production code, and the mutants it must catch
(docs/semantics/recovery.md §5)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

import waymark.recovery.core
from waymark.log.changes import Changes
from waymark.recovery.core import ServiceCore

from .server_machine import ServerMachine

SETTINGS = settings(max_examples=40, stateful_step_count=30, deadline=None, database=None,
                    derandomize=True, suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


def test_no_miss_across_restarts_replacements_and_expiry() -> None:
    run_state_machine_as_test(ServerMachine, settings=SETTINGS)


def _hunt(examples: int = 120) -> None:
    run_state_machine_as_test(
        ServerMachine,
        settings=settings(
            SETTINGS, max_examples=examples, phases=(Phase.generate,), print_blob=False
        ),
    )


def test_mutant_no_rebuild_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: a restart notes nothing again (the changes waiting for a checkpoint are
    only in memory, as in the first design)."""
    monkeypatch.setattr(Changes, "replayed", lambda self: Changes())
    monkeypatch.setattr(Changes, "restored", lambda self, changes: None)
    with pytest.raises(AssertionError, match=r"in no checkpoint|left out of every"):
        _hunt()


def test_mutant_no_instance_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: receipts of another instance (or ids gone backwards) are taken as they are."""
    monkeypatch.setattr(ServiceCore, "_other_server", lambda self, *args: None)
    with pytest.raises(AssertionError, match="silently"):
        _hunt()


def test_mutant_window_loss_not_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: checkpoints that passed the window vanish without a WindowLoss."""
    monkeypatch.setattr(waymark.recovery.core, "window_losses", lambda *args: [])
    with pytest.raises(AssertionError, match="never reported"):
        _hunt()
