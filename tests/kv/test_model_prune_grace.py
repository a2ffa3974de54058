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

``PruneKeep`` prunes with ``keep=KEEP`` (``--keep N``, docs/semantics/kv.md §11.4):
the newest ``KEEP`` published artifacts, the pointer's included, can be restored by id
at any time, however long ago they were retired from the pointer; a pruner that keeps only the
target must be caught.
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
from waymark.kv import transport as transport_module
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
        self.published: list[str] = []  # artifact ids, oldest first
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
        uploaded = self.transport.upload_payload(KEY, art)
        self.transport.swap_pointer(uploaded)
        self.published.append(uploaded.payload_key.rsplit("/", 1)[1].removesuffix(".tar"))
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

    keep = 1

    @rule()
    def prune(self) -> None:
        self.transport.prune(KEY, GRACE_MS, self.keep)

    @rule(ms=st.sampled_from([1, 300, 999, 1000, 1500, 3000]))
    def time_passes(self, ms: int) -> None:
        self.clock.advance(ms)


KEEP = 3


class PruneKeep(PruneGrace):
    keep = KEEP

    @precondition(lambda self: bool(self.published))
    @rule(data=st.data())
    def restore_kept(self, data: st.DataObject) -> None:
        """Any of the newest KEEP artifacts restores, whenever it is asked for."""
        kept = self.published[-KEEP:]
        artifact = kept[data.draw(st.integers(0, len(kept) - 1))]
        dest = self.dir / "restored" / "fold.log"
        try:
            _, store = self.transport.restore_open(KEY, artifact, f"append-log:{dest}",
                                                   generation=None)  # fmt: skip
        except ArtifactUnavailable as e:
            raise AssertionError(f"lost a kept artifact ({artifact}): {e}") from e
        store.close()
        shutil.rmtree(dest.parent)


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


def test_the_newest_keep_artifacts_restore_at_any_time(fixed_constants: None) -> None:
    run_state_machine_as_test(PruneKeep, settings=SETTINGS)


def test_a_pruner_that_keeps_only_the_target_is_caught(
    monkeypatch: pytest.MonkeyPatch, fixed_constants: None
) -> None:
    monkeypatch.setattr(
        transport_module, "kept_payloads", lambda ranks, rank, target, keep: frozenset([target])
    )
    with pytest.raises(AssertionError, match="lost a kept artifact"):
        run_state_machine_as_test(PruneKeep, settings=settings(SETTINGS, max_examples=300))
