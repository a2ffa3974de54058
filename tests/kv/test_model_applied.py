"""Cursor authority of ``watch_applied`` as a hypothesis state machine.

The machine drives the production :class:`AppliedCursor` and a real
append-log store through delivery, flush, transient store failure, crash and
restart, against a model NATS log. Invariants: the store's cursor never names a
revision whose update is missing from the store, and the in-memory cursor never
names a revision that was not handed to ``apply``. Mutations of the production
class (drop the failed batch; move the cursor on receipt) must be caught.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from waymark.kv import UNKNOWN_VERSION, KvUpdate, Op, SnapshotIoError, WatchCursor, WatchError
from waymark.kv.applied import AppliedCursor
from waymark.kv.stores.append_log import AppendLogStore

KEYS = ("a", "b", "c", "x.ignored")


class FaultInjectingStore:
    """Fault injector: a real append-log store whose next ``apply`` calls can be made to fail.

    A transient store failure (disk full, EIO) cannot be produced on demand
    otherwise; the data path underneath is the real store.
    """

    backend = "append-log"

    def __init__(self, inner: AppendLogStore) -> None:
        self.inner = inner
        self.fail_next = 0

    @property
    def cursor(self) -> WatchCursor:
        return self.inner.cursor

    def apply(self, batch: Sequence[KvUpdate], cursor: WatchCursor) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise SnapshotIoError("injected transient failure")
        self.inner.apply(batch, cursor)


def parse(u: KvUpdate) -> KvUpdate | None:
    # Irrelevant keys are rejected by parse, yet their revisions are covered.
    return None if u.key.startswith("x.") else u


class CursorAuthority(RuleBasedStateMachine):
    core_cls: type[AppliedCursor] = AppliedCursor

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="model-applied-"))
        self.log: list[tuple[int, str, bytes | None]] = []  # (revision, key, value or delete)
        self.store = FaultInjectingStore(AppendLogStore(self.dir / "fold.log"))
        self._start()

    def _start(self) -> None:
        """A (re)started process: resume from what the store holds, nothing else."""
        self.core = self.core_cls(self.store.cursor, parse)
        self.next_delivery = self.store.cursor.as_u64()  # index into log: resume at cursor + 1
        self.applied: set[int] = set()  # revisions handed to apply in this process
        self.resumed_at = self.store.cursor.as_u64()
        self.true_rev: dict[int, int] = {}  # id(update) -> its log revision, even if unknown

    def teardown(self) -> None:
        self.store.inner.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(key=st.sampled_from(KEYS), value=st.one_of(st.none(), st.binary(min_size=1, max_size=3)))
    def write(self, key: str, value: bytes | None) -> None:
        self.log.append((len(self.log) + 1, key, value))

    @rule(n=st.integers(min_value=1, max_value=3), unknown_last=st.booleans())
    def deliver(self, n: int, unknown_last: bool) -> None:
        chunk = []
        for rev, key, value in self.log[self.next_delivery : self.next_delivery + n]:
            chunk.append(KvUpdate.put(key, value, rev) if value else KvUpdate.delete(key, rev))
        if not chunk:
            return
        if unknown_last:  # an unparseable ACK subject: applied, but no cursor position
            last = chunk[-1]
            chunk[-1] = KvUpdate(last.op, last.key, last.value, UNKNOWN_VERSION)
        for u, (rev, _, _) in zip(chunk, self.log[self.next_delivery :], strict=False):
            self.true_rev[id(u)] = rev
        self.next_delivery += len(chunk)
        self.core.receive(chunk)

    @rule(fail=st.booleans())
    def flush(self, fail: bool) -> None:
        if not self.core.has_work:
            return
        self.store.fail_next = int(fail)
        f = self.core.begin_flush()
        self.applied.update(self.true_rev[id(u)] for u in f.parsed)  # apply(batch) returns
        cursor = self.core.applied(f)
        try:
            self.store.apply(f.raw, cursor)
        except SnapshotIoError as e:
            try:
                self.core.store_failed(f, e)
            except WatchError:
                self.crash()
            return
        self.core.stored(f)

    @rule()
    def crash(self) -> None:
        """SIGKILL and restart: in-memory state is gone, the store is reopened from disk."""
        self.store.inner.close()
        self.store = FaultInjectingStore(AppendLogStore(self.dir / "fold.log"))
        self._start()

    @invariant()
    def store_cursor_never_names_a_missing_update(self) -> None:
        c = self.store.cursor.as_u64()
        fold = {e.key: e.value for e in self.store.inner.range()}
        for key in KEYS:
            history = [(rev, v) for rev, k, v in self.log if k == key]
            at_cursor = [v for rev, v in history if rev <= c]
            # The store holds the key's state as of the cursor, or a later one
            # (data ahead of the cursor is allowed; a hole behind it is not).
            allowed = [at_cursor[-1] if at_cursor else None] + [v for rev, v in history if rev > c]
            assert fold.get(key) in allowed, (key, c, fold.get(key), history)

    @invariant()
    def cursor_names_only_applied_revisions(self) -> None:
        c = self.core.cursor.as_u64()
        for rev, key, _ in self.log:
            if self.resumed_at < rev <= c and not key.startswith("x."):
                assert rev in self.applied, (rev, c)


TestCursorAuthority = CursorAuthority.TestCase
TestCursorAuthority.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class DropFailedBatch(AppliedCursor):
    """The pre-fix bug: a failed store batch is dropped, not re-queued."""

    def _requeue(self, raw: list[KvUpdate]) -> None:
        return None


class CursorOnReceipt(AppliedCursor):
    """The hand-rolled-loop bug: the cursor moves when an update arrives."""

    def receive(self, updates: list[KvUpdate]) -> None:
        super().receive(updates)
        for u in updates:
            if u.version.as_u64() is not None and u.op in (Op.PUT, Op.DELETE):
                self.cursor = WatchCursor.from_u64(u.version.as_u64() or 0)


@pytest.mark.parametrize("mutant", [DropFailedBatch, CursorOnReceipt])
def test_mutated_cursor_authority_is_caught(mutant: type[AppliedCursor]) -> None:
    machine = type(f"Mutant{mutant.__name__}", (CursorAuthority,), {"core_cls": mutant})
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            machine,
            # No shrinking: finding a counterexample is the point, not minimising it.
            settings=settings(
                max_examples=500,
                stateful_step_count=40,
                deadline=None,
                database=None,
                derandomize=True,  # a fixed search: the mutant is caught every run, not usually
                phases=[Phase.generate],
            ),
        )
