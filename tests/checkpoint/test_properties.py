"""The five properties of docs/semantics/checkpoint.md §5, checked by hypothesis.

The production tracker and store run under random interleavings; then the
ordering guard is replaced by a naive one and hypothesis must find a
counterexample, which shows the properties really constrain the guard.
"""

from __future__ import annotations

import gc
import traceback

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from waymark.checkpoint import Tracker
from waymark.checkpoint.tracker import _Source

from .machine import CheckpointMachine

TestCheckpointProperties = CheckpointMachine.TestCase
TestCheckpointProperties.settings = settings(
    max_examples=200,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class NaiveTracker(Tracker[int]):
    """The advance loop (docs/semantics/checkpoint.md §2) without its guard.

    It consumes pending acks lowest first but never asks whether an in-flight
    (or queued) batch lies below the lowest pending ack.
    """

    def _advance(self, src: _Source[int]) -> bool:
        advanced = False
        while src.pending_acks:
            lowest = min(src.pending_acks)
            src.committed = src.pending_acks.pop(lowest)
            src.committed_batch = lowest
            self.version += 1
            advanced = True
        return advanced


class InFlightOnlyTracker(Tracker[int]):
    """The guard read literally as "no lower batch in in_flight", blind to queued ones.

    A batch back from fail() (or never sent) is not in flight, so this guard lets
    the checkpoint pass it: the frozen checkpoint of a transient failure thaws.
    """

    def _advance(self, src: _Source[int]) -> bool:
        advanced = False
        while src.pending_acks:
            lowest = min(src.pending_acks)
            if src.in_flight and min(src.in_flight) < lowest:
                break
            src.committed = src.pending_acks.pop(lowest)
            src.committed_batch = lowest
            self.version += 1
            advanced = True
        return advanced


class NaiveMachine(CheckpointMachine):
    tracker_class = NaiveTracker


class InFlightOnlyMachine(CheckpointMachine):
    tracker_class = InFlightOnlyTracker


# The failing runs leave tickets in tracebacks; their drop warnings are expected noise.
@pytest.mark.filterwarnings("ignore::waymark.checkpoint.DroppedTicketWarning")
@pytest.mark.parametrize("machine", [NaiveMachine, InFlightOnlyMachine])
def test_weakened_guard_is_caught(machine: type[CheckpointMachine]) -> None:
    with pytest.raises(AssertionError) as caught:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=300,
                stateful_step_count=30,
                deadline=None,
                database=None,
                derandomize=True,
                report_multiple_bugs=False,
                # Finding a counterexample is the point; shrinking it only costs time.
                phases=[Phase.generate],
            ),
        )
    message = str(caught.value)
    # Release the tickets the failing runs' frames still hold while warnings are ignored.
    traceback.clear_frames(caught.value.__traceback__)
    del caught
    gc.collect()
    assert message.startswith(
        (
            "CheckpointNeverAheadOfTerminalizedPrefix",
            "CheckpointOrderingInvariant",
            "CommittedMonotonic",
        )
    ), message
