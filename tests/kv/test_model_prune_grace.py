"""Prune grace against bootstrapping readers, as a hypothesis state machine.

Exporters publish ever newer artifacts on a ``file://`` object store whose
clock is a ManualClock (it stamps every object), readers read the pointer and
fetch what it named some time later, and a pruner prunes with a grace of
``GRACE_MS``; time moves in steps. The rule (docs/semantics/kv.md §11.4): a
reader that starts fetching within the grace of its pointer read always gets
its artifact; one that waits longer may get ``ArtifactUnavailable``, never a
wrong artifact nor ``ArtifactInvalid``. Counting the grace from the payload's
upload instead of its retirement (the old rule) must be caught: an artifact
uploaded long ago and replaced a moment ago is pruned under a reader who read
the pointer that moment.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from waymark.clock import ManualClock
from waymark.kv import ArtifactUnavailable, KvUpdate, WatchCursor
from waymark.kv.artifact import ExportInfo
from waymark.kv.stores.append_log import AppendLogStore
from waymark.kv.transport import (
    PAYLOADS_SUFFIX,
    RETIRED_SUFFIX,
    ObjectStoreTransport,
    PointerObservation,
)
from waymark.objstore import ObjectMeta
from waymark.objstore.local import LocalObjectStore

KEY = "fold"
GRACE_MS = 1000
FAST_TMP = "/dev/shm" if Path("/dev/shm").is_dir() else None


class PruneGrace(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="model-grace-", dir=FAST_TMP))
        self.clock = ManualClock(1_700_000_000_000)
        store = LocalObjectStore(self.dir / "objects", clock=self.clock, fsync=False)
        self.transport = ObjectStoreTransport(store, clock=self.clock)
        self.rank = 0
        self.reads: list[
            tuple[int, PointerObservation, int]
        ] = []  # (read at ms, observation, rank)

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(step=st.integers(min_value=1, max_value=3))
    def publish(self, step: int) -> None:
        self.rank += step
        path = self.dir / f"store-{self.rank}" / "fold.log"
        store = AppendLogStore(path)
        store.apply([KvUpdate.put("k", b"%d" % self.rank, self.rank)],
                    WatchCursor.from_u64(self.rank))  # fmt: skip
        art = self.dir / f"art-{self.rank}"
        store.export_to(art, ExportInfo(exporter="x"))
        store.close()
        self.transport.upload(KEY, art)
        shutil.rmtree(art)

    @precondition(lambda self: self.rank > 0)
    @rule()
    def read_pointer(self) -> None:
        observed = self.transport.read_pointer(KEY)
        assert observed.manifest is not None
        self.reads.append((self.clock.now_ms(), observed, observed.manifest.rank))

    @precondition(lambda self: bool(self.reads))
    @rule(data=st.data())
    def fetch(self, data: st.DataObject) -> None:
        read_at, observed, rank = self.reads.pop(data.draw(st.integers(0, len(self.reads) - 1)))
        waited = self.clock.now_ms() - read_at
        into = self.dir / "fetch"
        try:
            manifest, _ = self.transport.download(KEY, into, pointer=observed)
        except ArtifactUnavailable:
            assert waited >= GRACE_MS, (
                f"a reader that read the pointer {waited} ms ago (grace {GRACE_MS}) "
                "lost its artifact to the pruner"
            )
        else:
            assert manifest.rank == rank
        shutil.rmtree(into, ignore_errors=True)

    @rule()
    def prune(self) -> None:
        self.transport.prune(KEY, GRACE_MS)

    @rule(ms=st.sampled_from([1, 300, 999, 1000, 1500, 3000]))
    def time_passes(self, ms: int) -> None:
        self.clock.advance(ms)


SETTINGS = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.generate],
)


def test_a_reader_within_the_grace_of_its_pointer_read_gets_its_artifact(
    fixed_constants: None,
) -> None:
    run_state_machine_as_test(PruneGrace, settings=SETTINGS)


def _stamped_at_upload(self: ObjectStoreTransport, stamp_key: str) -> ObjectMeta:
    """The old rule: the grace counted from the payload's upload."""
    return self.store.head(stamp_key.replace(RETIRED_SUFFIX, PAYLOADS_SUFFIX))


def test_grace_from_upload_time_is_caught(
    monkeypatch: pytest.MonkeyPatch, fixed_constants: None
) -> None:
    monkeypatch.setattr(ObjectStoreTransport, "_stamp_retired", _stamped_at_upload)
    with pytest.raises(AssertionError, match="lost its artifact to the pruner"):
        run_state_machine_as_test(PruneGrace, settings=settings(SETTINGS, max_examples=300))
