"""A hypothesis state machine that drives the production tracker and durable store.

Random interleavings of create / send / ack / reject / fail / abandon / drop /
save / stop / crash+restart over several sources, checked after every step
against a plain model of what each batch has become. The teardown is a fair
schedule that resolves every batch, for NoBatchLeftBehind.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from waymark.checkpoint import (
    CheckpointStore,
    Committed,
    DrainIncomplete,
    DroppedTicketWarning,
    QueuedTicket,
    SendingTicket,
    Tracker,
    TrackerStopped,
)

SOURCES = ("alpha", "beta", "gamma")
TERMINAL = ("acked", "rejected")
PICK = st.integers(min_value=0, max_value=1_000)


class CheckpointMachine(RuleBasedStateMachine):
    tracker_class: type[Tracker[int]] = Tracker

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="waymark-ckpt-"))
        self.store = CheckpointStore(self.dir / "checkpoints.json")
        # What the store holds, as far as the model knows; survives crashes.
        self.durable: dict[str, Committed[int]] = {}
        self._start(self.tracker_class())

    def _start(self, tracker: Tracker[int]) -> None:
        """Begin a run (first start or restart): the model forgets everything volatile."""
        self.tracker = tracker
        self.queued: list[QueuedTicket[int]] = []
        self.sending: list[SendingTicket[int]] = []
        self.stopping = False
        # Per source: what each batch of this run has become, and its checkpoint.
        self.fate: dict[str, dict[int, str]] = {s: {} for s in SOURCES}
        self.cp: dict[str, dict[int, int]] = {s: {} for s in SOURCES}
        self.base = {s: self.durable.get(s, Committed(0, 0)) for s in SOURCES}
        self.last_cp = {s: self.base[s].checkpoint for s in SOURCES}
        self.high = dict(self.base)

    # -- model helpers -----------------------------------------------------------

    def _terminal_prefix(self, source: str) -> Committed[int]:
        """The highest batch below which (inclusive) every batch of the run is terminal."""
        top = self.base[source]
        batch = top.batch_id + 1
        while self.fate[source].get(batch) in TERMINAL:
            top = Committed(batch, self.cp[source][batch])
            batch += 1
        return top

    def _unresolved(self) -> int:
        return len(self.queued) + len(self.sending)

    def _resolve(self, ticket: SendingTicket[int] | QueuedTicket[int], fate: str) -> None:
        self.fate[ticket.source][ticket.batch_id] = fate

    # -- rules -------------------------------------------------------------------

    @rule(source=st.sampled_from(SOURCES), step=st.integers(min_value=1, max_value=5))
    def create(self, source: str, step: int) -> None:
        checkpoint = self.last_cp[source] + step
        if self.stopping:
            with pytest.raises(TrackerStopped):
                self.tracker.create_batch(source, checkpoint)
            return
        ticket = self.tracker.create_batch(source, checkpoint)
        expected_id = self.base[source].batch_id + len(self.fate[source]) + 1
        assert ticket.batch_id == expected_id, "batch ids are dense and increasing per source"
        self.last_cp[source] = checkpoint
        self.fate[source][ticket.batch_id] = "queued"
        self.cp[source][ticket.batch_id] = checkpoint
        self.queued.append(ticket)

    @precondition(lambda self: self.queued)
    @rule(i=PICK)
    def begin_send(self, i: int) -> None:
        ticket = self.queued.pop(i % len(self.queued)).begin_send()
        self._resolve(ticket, "sending")
        self.sending.append(ticket)

    @precondition(lambda self: self.sending)
    @rule(i=PICK)
    def ack(self, i: int) -> None:
        ticket = self.sending.pop(i % len(self.sending))
        ticket.ack()
        self._resolve(ticket, "acked")

    @precondition(lambda self: self.sending)
    @rule(i=PICK)
    def reject(self, i: int) -> None:
        ticket = self.sending.pop(i % len(self.sending))
        ticket.reject()
        self._resolve(ticket, "rejected")

    @precondition(lambda self: self.sending)
    @rule(i=PICK)
    def fail(self, i: int) -> None:
        ticket = self.sending.pop(i % len(self.sending)).fail()
        self._resolve(ticket, "queued")
        self.queued.append(ticket)

    @precondition(lambda self: self.queued)
    @rule(i=PICK)
    def abandon(self, i: int) -> None:
        ticket = self.queued.pop(i % len(self.queued))
        ticket.abandon()
        self._resolve(ticket, "abandoned")

    @precondition(lambda self: self.sending)
    @rule(i=PICK)
    def drop(self, i: int) -> None:
        ticket = self.sending.pop(i % len(self.sending))
        self._resolve(ticket, "abandoned")
        before = self.tracker.dropped_tickets
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DroppedTicketWarning)
            del ticket
        assert self.tracker.dropped_tickets == before + 1, "a dropped ticket is counted"

    @rule()
    def save(self) -> None:
        snapshot = self.tracker.snapshot()
        self.store.save(snapshot)
        for source, point in snapshot.items():
            assert point.batch_id >= self.durable.get(source, Committed(0, 0)).batch_id, (
                "CommittedMonotonic: the durable checkpoint never goes back"
            )
        self.durable = snapshot

    @rule()
    def stop(self) -> None:
        if self._unresolved():
            with pytest.raises(DrainIncomplete):
                self.tracker.stop()
            assert not self.tracker.stopped, "DrainCompleteness: stop with batches unresolved"
            self.stopping = True
            return
        final = self.tracker.stop()
        assert self.tracker.stopped
        self.store.save(final)
        self.durable = final
        self._start(self.tracker_class(self.store.load()))

    @rule(torn=st.booleans())
    def crash_and_restart(self, torn: bool) -> None:
        if torn:
            # A save that died between creating its temp file and the rename.
            (self.dir / "checkpoints.json.tmp").write_bytes(b"waymark-checkpoints 1 dead")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DroppedTicketWarning)
            self.queued.clear()
            self.sending.clear()
        restored = self.store.load()
        assert restored == self.durable, "a restart resumes from the last durable save"
        self._start(self.tracker_class(restored))

    # -- the five properties -----------------------------------------------------

    @invariant()
    def checkpoint_never_ahead_of_terminalized_prefix(self) -> None:
        for source in SOURCES:
            got = self.tracker.committed(source) or Committed(0, 0)
            prefix = self._terminal_prefix(source)
            assert got.batch_id <= prefix.batch_id, (
                f"CheckpointNeverAheadOfTerminalizedPrefix: {source} committed {got} "
                f"past the terminalized prefix {prefix}"
            )
            # And the tracker does not lag: it commits the whole prefix, right away.
            assert got == prefix, f"{source}: committed {got}, terminalized prefix {prefix}"

    @invariant()
    def checkpoint_ordering_invariant(self) -> None:
        for source in SOURCES:
            committed = (self.tracker.committed(source) or Committed(0, 0)).batch_id
            for batch, fate in self.fate[source].items():
                if batch <= committed:
                    assert fate in TERMINAL, (
                        f"CheckpointOrderingInvariant: {source} batch {batch} is {fate} "
                        f"below the committed batch {committed}"
                    )

    @invariant()
    def committed_monotonic(self) -> None:
        for source in SOURCES:
            got = self.tracker.committed(source) or Committed(0, 0)
            high = self.high[source]
            assert got.batch_id >= high.batch_id and got.checkpoint >= high.checkpoint, (
                f"CommittedMonotonic: {source} went from {high} back to {got}"
            )
            self.high[source] = got

    @invariant()
    def drain_completeness(self) -> None:
        assert self.tracker.drained == (self._unresolved() == 0), (
            "DrainCompleteness: drained must mean every batch is resolved"
        )
        assert self.tracker.unresolved == self._unresolved()

    @invariant()
    def state_matches_spec_structures(self) -> None:
        for source in SOURCES:
            view = self.tracker.view(source)
            fates = self.fate[source]
            committed = view.committed.batch_id if view.committed else 0
            assert set(view.in_flight) == {b for b, f in fates.items() if f == "sending"}
            assert set(view.queued) == {b for b, f in fates.items() if f == "queued"}
            assert set(view.pending_acks) == {
                b for b, f in fates.items() if f in TERMINAL and b > committed
            }

    def teardown(self) -> None:
        try:
            # Hypothesis runs teardown after a failed step too, and an error here would
            # mask that step's: re-check the properties first so they are the ones named.
            self.checkpoint_never_ahead_of_terminalized_prefix()
            self.checkpoint_ordering_invariant()
            self.committed_monotonic()
            self.drain_completeness()
            self._fair_drain()
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DroppedTicketWarning)
                self.queued.clear()
                self.sending.clear()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _fair_drain(self) -> None:
        """NoBatchLeftBehind: under a fair schedule every batch resolves."""
        for round_ in range(3):
            while self.queued:
                self.sending.append(self.queued.pop().begin_send())
            retry, self.sending = self.sending, []
            for n, ticket in enumerate(retry):
                # A transient failure in the first round, then every retry succeeds.
                if round_ == 0 and n % 3 == 0:
                    self.queued.append(ticket.fail())
                    self._resolve(ticket, "queued")
                    continue
                if n % 4 == 1:
                    ticket.reject()
                    self._resolve(ticket, "rejected")
                else:
                    ticket.ack()
                    self._resolve(ticket, "acked")
                self.checkpoint_never_ahead_of_terminalized_prefix()
                self.checkpoint_ordering_invariant()
                self.committed_monotonic()
        assert not self.queued and not self.sending
        assert self.tracker.drained, "NoBatchLeftBehind: a batch is still unresolved"
        for source in SOURCES:
            view = self.tracker.view(source)
            assert not view.in_flight and not view.queued
            holes = sorted(b for b, f in self.fate[source].items() if f == "abandoned")
            top = self.base[source].batch_id + len(self.fate[source])
            reach = holes[0] - 1 if holes else top
            committed = view.committed.batch_id if view.committed else 0
            assert committed == reach, (
                f"NoBatchLeftBehind: {source} committed {committed}, expected batch {reach}"
            )
        self.tracker.stop()
