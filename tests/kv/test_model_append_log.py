"""``AppendLogStore.apply`` is all-or-nothing, as a hypothesis state machine.

The machine drives the real append-log store with a tiny compaction threshold
through batches, torn writes, failing compactions and restarts. Both faults
are real, not mocks: a write fault is ``RLIMIT_FSIZE`` (the write stops where
the limit falls, then fails with EFBIG) and a compaction fault is a directory
squatting on the compaction temp file's name. Invariants: an apply that
returned is in memory and on disk with its cursor; one that raised left
nothing behind. A mutant that lets a compaction failure escape ``apply`` (the
pre-fix behaviour) must be caught.
"""

from __future__ import annotations

import contextlib
import resource
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from waymark.kv import KvUpdate, SnapshotIoError, WatchCursor
from waymark.kv.stores.append_log import AppendLogStore, replay_log

KEYS = ("a", "b", "c", "d")
THRESHOLD = 256  # compaction comes due every few batches


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """A real write fault: past ``limit`` bytes a file write fails with EFBIG
    (SIGXFSZ ignored so the process lives), after writing what fits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


updates = st.lists(
    st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=60))),
    min_size=1,
    max_size=6,
)


class AtomicApply(RuleBasedStateMachine):
    store_cls: type[AppendLogStore] = AppendLogStore

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="model-append-log-"))
        self.path = self.dir / "fold.log"
        self.blocker = self.path.with_name(self.path.name + ".compact.tmp")
        self.store = self.store_cls(self.path, compact_threshold=THRESHOLD)
        self.rev = 0
        self.committed: dict[str, bytes] = {}  # the fold of every apply that returned
        self.cursor = WatchCursor()

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(batch=updates, fits=st.one_of(st.none(), st.integers(min_value=0, max_value=400)))
    def apply(self, batch: list[tuple[str, bytes | None]], fits: int | None) -> None:
        """Apply a batch; with ``fits``, only that many more bytes fit in any file."""
        out = []
        for key, value in batch:
            self.rev += 1
            out.append(
                KvUpdate.put(key, value, self.rev) if value else KvUpdate.delete(key, self.rev)
            )
        cursor = WatchCursor.from_u64(self.rev)
        if fits is None:
            self.store.apply(out, cursor)  # no write fault: must not raise
        else:
            try:
                with file_size_limit(self.path.stat().st_size + fits):
                    self.store.apply(out, cursor)
            except SnapshotIoError:
                return  # not committed: the invariants check nothing of it remains
        for u in out:
            if u.value:
                self.committed[u.key] = u.value
            else:
                self.committed.pop(u.key, None)
        self.cursor = cursor

    @rule()
    def toggle_compaction_fault(self) -> None:
        if self.blocker.exists():
            self.blocker.rmdir()
        else:
            self.blocker.mkdir()

    @rule()
    def restart(self) -> None:
        """Reopen from disk, the fault lifted (open rewrites a log with a torn tail or
        more than a threshold of superseded records)."""
        self.store.close()
        if self.blocker.exists():
            self.blocker.rmdir()
        self.store = self.store_cls(self.path, compact_threshold=THRESHOLD)

    @invariant()
    def store_holds_exactly_the_committed_applies(self) -> None:
        assert not self.store.poisoned
        assert self.store.cursor == self.cursor
        assert {e.key: e.value for e in self.store.range()} == self.committed

    @invariant()
    def disk_holds_exactly_the_committed_applies(self) -> None:
        on_disk = replay_log(self.path.read_bytes())  # what a restart would load
        assert WatchCursor(on_disk.cursor) == self.cursor
        assert {k: e.value for k, e in on_disk.entries().items()} == self.committed


TestAtomicApply = AtomicApply.TestCase
TestAtomicApply.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


class CompactionFailsTheApply(AppendLogStore):
    """The pre-fix behaviour: a compaction failure escapes the apply that committed."""

    def _compact_after_commit(self) -> None:
        self.compact()


def test_compaction_failure_escaping_apply_is_caught() -> None:
    machine = type(
        "MutantCompactionFailsTheApply", (AtomicApply,), {"store_cls": CompactionFailsTheApply}
    )
    with pytest.raises((AssertionError, SnapshotIoError)):
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=300,
                stateful_step_count=40,
                deadline=None,
                database=None,
                derandomize=True,  # a fixed search: the mutant is caught every run
                phases=[Phase.generate],
            ),
        )
