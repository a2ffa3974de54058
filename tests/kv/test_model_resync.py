"""The cursor-expired resync ordering as a hypothesis state machine.

After ``CursorExpired`` the watch task lists live keys and hands the listing to
the loop; the loop diffs the fold and runs synthetic deletes through apply and
the store, then acknowledges; only then may the state-sync re-list start. The
listing now travels on the data channel behind every chunk, but the machine
still lets the loop serve listing and chunks in either order (the stricter
case), so the acknowledgement is the only thing ordering a synthetic delete
before the re-list put of the same key. The machine runs the production
``AppliedCursor.resync`` / ``stale_keys`` / ``fallback_may_start`` against a
real store, with a model bucket whose clients keep writing during the resync;
dropping the barrier must be caught (a key recreated during the gap is lost).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from waymark.kv import KvUpdate, WatchCursor, WatchScope
from waymark.kv.applied import AppliedCursor, ResyncRequest
from waymark.kv.guards import fallback_may_start
from waymark.kv.stores.append_log import AppendLogStore

KEYS = ("a", "b")
# tmpfs when there is one: the fold's fsyncs are then free, and the search runs thousands of folds.
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None
SCOPE = WatchScope.all()


class ResyncOrdering(RuleBasedStateMachine):
    may_start: Callable[[bool], bool] = staticmethod(fallback_may_start)

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="model-resync-", dir=FAST_TMP))
        self.store = AppendLogStore(self.dir / "fold.log")
        self.bucket: dict[str, bytes] = {}
        self.markers: dict[str, int] = {}  # retained delete markers (those after the gap)
        self.expired = False
        self.rev = 0
        self.phase = "expired"  # -> awaiting_ack -> live
        self.request: ResyncRequest | None = None
        self.control: deque[ResyncRequest] = deque()
        self.data: deque[KvUpdate] = deque()

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _write(self, key: str, value: bytes | None) -> None:
        self.rev += 1
        if value is None:
            self.bucket.pop(key, None)
            if self.expired:
                self.markers[key] = self.rev
        else:
            self.bucket[key] = value
            self.markers.pop(key, None)
        if self.phase == "live":  # only a running watch sees it as a live update
            self.data.append(
                KvUpdate.put(key, value, self.rev) if value else KvUpdate.delete(key, self.rev)
            )

    @initialize(
        before=st.lists(
            st.tuples(st.sampled_from(KEYS), st.binary(min_size=1, max_size=2)), max_size=6
        ),
        gap=st.lists(
            st.tuples(
                st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=2))
            ),
            max_size=6,
        ),
    )
    def fold_then_expire(
        self, before: list[tuple[str, bytes]], gap: list[tuple[str, bytes | None]]
    ) -> None:
        """The fold caught up, then writes happened whose markers were all evicted."""
        for key, value in before:
            self._write(key, value)
        self.store.apply(
            [KvUpdate.put(k, v, self.rev) for k, v in self.bucket.items()],
            WatchCursor.from_u64(self.rev),
        )
        self.core: AppliedCursor[KvUpdate] = AppliedCursor(
            self.store.cursor, None, keep_parsed=False
        )
        for key, value in gap:
            self._write(key, value)
        self.expired = True  # from here on, delete markers are retained

    @rule(key=st.sampled_from(KEYS), value=st.one_of(st.none(), st.binary(min_size=1, max_size=2)))
    def client_writes(self, key: str, value: bytes | None) -> None:
        self._write(key, value)

    @rule()
    def watch_task_steps(self) -> None:
        """The watch task: list live keys and hand them over; then, once allowed, re-list."""
        if self.phase == "expired":
            self.request = ResyncRequest(frozenset(self.bucket))
            self.control.append(self.request)
            self.phase = "awaiting_ack"
        elif self.phase == "awaiting_ack":
            assert self.request is not None
            if not self.may_start(self.request.acknowledged):
                return  # still blocked on the barrier
            # The state-sync re-list: the last retained message of every key (a
            # delete marker if it was deleted after the gap), then live updates.
            relist = [KvUpdate.put(k, v, self.rev) for k, v in self.bucket.items()]
            relist += [KvUpdate.delete(k, rev) for k, rev in self.markers.items()]
            self.data.extend(relist)
            self.phase = "live"

    @precondition(lambda self: bool(self.data or self.control))
    @rule(
        prefer_control=st.booleans(), n=st.integers(min_value=1, max_value=3), flush=st.booleans()
    )
    def loop_steps(self, prefer_control: bool, n: int, flush: bool) -> None:
        """The loop serves whichever channel is ready; with both ready, either may go first."""
        if self.control and (prefer_control or not self.data):
            request = self.control.popleft()
            self._flush()
            self.core.resync(self.store, request.live, SCOPE)
            self._flush()
            request.acknowledge()
            return
        chunk = [self.data.popleft() for _ in range(min(n, len(self.data)))]
        self.core.receive(chunk)
        if flush:
            self._flush()

    def _flush(self) -> None:
        if self.core.has_work:
            f = self.core.begin_flush()
            cursor = self.core.applied(f)
            self.store.apply(f.raw, cursor)
            self.core.stored(f)

    @invariant()
    def converges_once_quiet(self) -> None:
        if self.phase != "live" or self.data or self.control:
            return
        self._flush()
        assert {e.key: e.value for e in self.store.range()} == self.bucket


TestResyncOrdering = ResyncOrdering.TestCase
TestResyncOrdering.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)


def test_resync_without_ack_barrier_is_caught() -> None:
    class NoAckBarrier(ResyncOrdering):
        may_start = staticmethod(lambda acknowledged: True)

    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            NoAckBarrier,
            settings=settings(
                max_examples=3000,
                stateful_step_count=12,
                deadline=None,
                database=None,
                derandomize=True,  # a fixed search: the mutant is caught every run, not usually
                phases=[Phase.generate],
            ),
        )
