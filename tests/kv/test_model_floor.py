"""The live retention floor guard as a hypothesis state machine.

A model KV stream (history 1, so an overwrite removes the older message)
whose head retention may evict messages a live All-scope consumer has not seen
yet; like NATS, the consumer silently skips them. The guard, in-band on every
gapped delivery plus a periodic backstop, uses the production
``delivery_is_gap`` / ``resume_window_ok``; a trip fails the watch, and the
restart path (resume-window check, resync, re-list) repairs the fold. Claim:
once quiet, the fold holds no stale key or value. With the guard removed, or reduced to
the periodic probe alone, a skipped delete marker diverges the fold forever.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from waymark.kv.guards import delivery_is_gap, resume_window_ok

KEYS = ("a", "b")


class FloorGuard(RuleBasedStateMachine):
    in_band = True
    backstop = True

    def __init__(self) -> None:
        super().__init__()
        self.stream: dict[int, tuple[str, bytes | None]] = {}  # retained seq -> (key, value|delete)
        self.last_seq = 0
        self.fold: dict[str, bytes] = {}
        self.frontier = 0  # last delivered sequence == the fold's cursor
        self.failed = False
        self.logical: dict[str, bytes] = {}  # the last write per key, evicted or not

    @property
    def first_seq(self) -> int:
        return min(self.stream, default=self.last_seq + 1)

    def bucket(self) -> dict[str, bytes]:
        return {k: v for k, v in self.stream.values() if v is not None}

    @rule(key=st.sampled_from(KEYS), value=st.one_of(st.none(), st.binary(min_size=1, max_size=2)))
    def write(self, key: str, value: bytes | None) -> None:
        self.last_seq += 1
        for seq in [s for s, (k, _) in self.stream.items() if k == key]:
            del self.stream[seq]  # history 1: an interior, benign gap
        self.stream[self.last_seq] = (key, value)
        if value is None:
            self.logical.pop(key, None)
        else:
            self.logical[key] = value

    @rule()
    def evict_head(self) -> None:
        if self.stream:
            del self.stream[min(self.stream)]  # retention (max_bytes / max_age)

    @rule()
    def deliver(self) -> None:
        if self.failed:
            return
        later = [s for s in self.stream if s > self.frontier]
        if not later:
            return
        seq = min(later)  # NATS skips whatever is gone, silently
        gapped = self.in_band and delivery_is_gap(self.frontier, seq)
        if gapped and not resume_window_ok(self.frontier, self.first_seq):
            self.failed = True  # checked before the entry is processed
            return
        key, value = self.stream[seq]
        if value is None:
            self.fold.pop(key, None)
        else:
            self.fold[key] = value
        self.frontier = seq

    @rule()
    def backstop_probe(self) -> None:
        if (
            self.backstop
            and not self.failed
            and not resume_window_ok(self.frontier, self.first_seq)
        ):
            self.failed = True

    @rule()
    def restart(self) -> None:
        """The caller restarts the watch: resume if the window allows, else resync + re-list."""
        self.failed = False
        if resume_window_ok(self.frontier, self.first_seq):
            return
        live = self.bucket()
        for key in [k for k in self.fold if k not in live]:
            del self.fold[key]  # synthetic deletes
        self.fold.update(live)  # the state-sync re-list
        self.frontier = self.last_seq

    @invariant()
    def quiet_fold_holds_nothing_stale(self) -> None:
        """Every key the fold holds has its current value; a key is missing only if
        retention took its current value from NATS too (no one can recover that)."""
        caught_up = not any(s > self.frontier for s in self.stream)
        if caught_up and not self.failed and resume_window_ok(self.frontier, self.first_seq):
            for key, value in self.fold.items():
                assert self.logical.get(key) == value, key
            retained = self.bucket()
            for key in self.logical.keys() - self.fold.keys():
                assert key not in retained, key


TestFloorGuard = FloorGuard.TestCase
TestFloorGuard.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)


@pytest.mark.usefixtures("fixed_constants")
@pytest.mark.parametrize(("in_band", "backstop"), [(False, False), (False, True)])
def test_unguarded_and_periodic_only_variants_diverge(in_band: bool, backstop: bool) -> None:
    variant = type("Variant", (FloorGuard,), {"in_band": in_band, "backstop": backstop})
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            variant,
            settings=settings(
                max_examples=3000,
                stateful_step_count=20,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.generate],
            ),
        )
