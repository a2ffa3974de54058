"""The pointer swap as a hypothesis state machine: concurrent exporters, crashes,
zero-grace pruning, a corrupted pointer, bootstrapping readers, an evicting log.

Everything the steps touch is production code on real files: the fold stores
(append-log), ``export_to`` / ``import_artifact``, and ``ObjectStoreTransport``
over the ``file://`` store with its real compare-and-swap. Concurrency is the
interleaving of one publish split into its production steps (upload the
payload; read the pointer; one ``try_swap``), exactly as two processes could
interleave them. The NATS log is a model: a list of revisions whose head can be
evicted (superseded puts and delete markers only, so the bucket's state stays
the fold of the whole log), and a resume runs the same ``resume_window_ok``
guard as the watcher, with NATS's silent clamp when it is skipped.

Theorems, checked after every step or in the step that observes them:

* the published cursor never regresses (between corruptions of the pointer,
  which may be replaced by anything by design);
* the pointer never names a missing payload, under zero-grace pruning;
* bootstrap never silently diverges: an imported fold equals the log's fold at
  its cursor, and after the resume equals the whole log's fold; a fetch may
  fail loudly (a zero-grace prune raced it), never quietly;
* rounds eventually publish: a caught-up node publishing alone always publishes.

Each guard has a broken variant the machine must catch.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from waymark.clock import ManualClock
from waymark.kv import (
    ArtifactInvalid,
    ArtifactUnavailable,
    KvUpdate,
    WatchCursor,
    WatchScope,
    guards,
)
from waymark.kv import transport as transport_module
from waymark.kv.artifact import ExportInfo, content_address
from waymark.kv.artifact_import import import_artifact
from waymark.kv.stores.append_log import AppendLogStore
from waymark.kv.stores.protocol import stale_keys
from waymark.kv.transport import (
    MAX_SWAP_RETRIES,
    ObjectStoreTransport,
    PointerObservation,
    PublishOutcome,
    UploadedPayload,
)
from waymark.objstore import LocalObjectStore, ObjectNotFound

KEY = "fold"
KEYS = ("a", "b", "c")
NODES = 3
SHM = Path("/dev/shm")


@dataclass
class Round:
    """A node's publish in flight, between production steps."""

    artifact: Path
    uploaded: UploadedPayload | None = None
    observed: PointerObservation | None = None
    attempts: int = 0


def fold_of(log: list[tuple[int, str, bytes | None]], upto: int) -> dict[str, bytes]:
    state: dict[str, bytes] = {}
    for rev, key, value in log:
        if rev > upto:
            break
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def update_of(rev: int, key: str, value: bytes | None) -> KvUpdate:
    return KvUpdate.delete(key, rev) if value is None else KvUpdate.put(key, value, rev)


WRITES = st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=1, max_size=3)
"""(key, put?) pairs; a put's value is unique (its revision), so a stale value is never
mistaken for a later one."""


class PointerSwap(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(
            tempfile.mkdtemp(prefix="model-pointer-", dir=SHM if SHM.is_dir() else None)
        )
        self.clock = ManualClock()
        self.transport = ObjectStoreTransport(
            LocalObjectStore(self.dir / "objects", clock=self.clock), clock=self.clock
        )
        self.log: list[tuple[int, str, bytes | None]] = []  # (revision, key, value or delete)
        self.first_seq = 1
        self.stores = [AppendLogStore(self.dir / f"node{i}" / "fold.log") for i in range(NODES)]
        self.rounds: list[Round | None] = [None] * NODES
        self.exports = 0
        self.floor = 0  # the highest rank published since the pointer was last corrupted
        self.reader: PointerObservation | None = None
        # Since the reader's observation: the highest rank the pointer had, and
        # whether it was corrupted. Either lets a zero-grace prune delete the
        # observed payload before the reader fetches it.
        self.seen_since_observe = 0
        self.corrupted_since_observe = False
        self.corruptions = 0
        self.solo_rounds = 0

    def teardown(self) -> None:
        for s in self.stores:
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the bucket --------------------------------------------------------------

    @property
    def head(self) -> int:
        return len(self.log)

    @initialize(
        writes=st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=3, max_size=8),
        caught_up=st.lists(st.integers(0, 8), min_size=NODES, max_size=NODES),
    )
    def seed(self, writes: list[tuple[str, bool]], caught_up: list[int]) -> None:
        """A bucket with some history, and nodes that have folded some of it."""
        self.write(writes)
        for node, n in enumerate(caught_up):
            self.catch_up(node, n)

    @rule(writes=WRITES)
    def write(self, writes: list[tuple[str, bool]]) -> None:
        for key, put in writes:
            rev = self.head + 1
            self.log.append((rev, key, b"v%d" % rev if put else None))

    @rule(n=st.integers(1, 4))
    def evict(self, n: int) -> None:
        """Retention drops the oldest messages, as long as each is not the live value of its key."""
        for _ in range(n):
            if self.first_seq > self.head:
                return
            _, key, value = self.log[self.first_seq - 1]
            later = any(k == key for _, k, _ in self.log[self.first_seq :])
            if value is not None and not later:
                return
            self.first_seq += 1

    def resume(self, store: AppendLogStore) -> None:
        """What ``watch_applied`` does after a restart: resume, or resync on expiry.

        The cursor moves to the highest revision delivered; synthetic deletes
        carry none, so an empty re-list leaves it where it was.
        """
        c = store.cursor.as_u64()
        if guards.resume_window_ok(c, self.first_seq):
            # NATS clamps a start below its head silently: sequences before it are skipped.
            start = max(c + 1, self.first_seq)
            batch = [update_of(*m) for m in self.log[start - 1 :]]
        else:  # CursorExpired: synthetic deletes for vanished keys, then the re-list
            event("resume: cursor expired")
            retained = self.log[self.first_seq - 1 :]
            last = {k: (rev, v) for rev, k, v in retained}  # the last message per key
            live = [k for k, (_, v) in last.items() if v is not None]
            stale = stale_keys(store, live, WatchScope.all())
            batch = [KvUpdate.delete(k, None) for k in stale]
            batch += [
                update_of(rev, k, v) for k, (rev, v) in sorted(last.items(), key=lambda x: x[1][0])
            ]
        high = max((u.revision or 0 for u in batch), default=0)
        if batch:
            store.apply(batch, WatchCursor.from_u64(high) if high else store.cursor)

    @rule(node=st.integers(0, NODES - 1), n=st.integers(1, 8))
    def catch_up(self, node: int, n: int) -> None:
        store = self.stores[node]
        c = store.cursor.as_u64()
        if c + 1 < self.first_seq:
            self.resume(store)  # restarted behind the retention window
            return
        batch = [update_of(*m) for m in self.log[c : c + n]]
        if batch:
            store.apply(batch, WatchCursor.from_u64(c + len(batch)))

    # -- exporters, one production step at a time --------------------------------

    @rule(node=st.integers(0, NODES - 1), steps=st.integers(1, 6))
    def advance(self, node: int, steps: int) -> None:
        """The node's round takes its next ``steps`` production steps: export, upload
        the payload, read the pointer, try one swap (re-reading after a lost race)."""
        for _ in range(steps):
            if not self._step(node):
                return

    def _step(self, node: int) -> bool:
        r = self.rounds[node]
        if r is None:
            store = self.stores[node]
            if store.cursor.is_none:
                self.catch_up(node, 1)  # a node exports once it has folded something
                return not store.cursor.is_none
            self.exports += 1
            art = self.dir / "artifacts" / str(self.exports)
            store.export_to(art, ExportInfo(exporter=f"node{node}"))
            self.rounds[node] = Round(art)
        elif r.uploaded is None:
            r.uploaded = self.transport.upload_payload(KEY, r.artifact)
        elif r.observed is None:
            r.observed = self.transport.read_pointer(KEY)
        else:
            outcome = self.transport.try_swap(r.observed, r.uploaded)
            event(f"swap: {outcome.value if outcome else 'lost the race'}")
            r.observed = None
            r.attempts += 1
            if outcome is PublishOutcome.Published:
                self.floor = max(self.floor, r.uploaded.manifest.rank)
            if outcome is not None or r.attempts > MAX_SWAP_RETRIES:
                self.rounds[node] = None
                return False
        return True

    @precondition(lambda self: any(self.rounds))
    @rule(node=st.integers(0, NODES - 1))
    def crash(self, node: int) -> None:
        """The process dies mid-round: whatever it uploaded stays, the swap never comes."""
        self.rounds[node] = None

    @rule()
    def prune(self) -> None:
        if self.transport.prune(KEY, grace_ms=0).deleted:
            event("prune: deleted")

    @precondition(lambda self: self.corruptions < 2)  # rare: most runs are about the order
    @rule()
    def corrupt_pointer(self) -> None:
        """Fault injector: the pointer object is overwritten with bytes that do not parse."""
        self.corruptions += 1
        self.transport.store.put(f"{KEY}.manifest.json", b"\x00torn")
        self.floor = 0  # a corrupt pointer is replaceable by design: the order restarts
        self.corrupted_since_observe = True

    # -- readers -------------------------------------------------------------------

    @rule()
    def reader_step(self) -> None:
        """A bootstrapping reader: read the pointer, then (at a later step) fetch it."""
        if self.reader is None:
            self.reader_observe()
        else:
            self.reader_fetch()

    def reader_observe(self) -> None:
        observed = self.transport.read_pointer(KEY)
        if observed.body is None:
            return  # nothing published yet: a reader would retry later
        self.reader = observed
        self.seen_since_observe = self.reader.state.rank or 0
        self.corrupted_since_observe = False

    def reader_fetch(self) -> None:
        assert self.reader is not None
        observed, self.reader = self.reader, None
        work = Path(tempfile.mkdtemp(dir=self.dir))
        try:
            try:
                manifest, art = self.transport.download(KEY, work, pointer=observed)
                import_artifact(art, f"append-log:{work / 'fold.log'}", consume=True)
            except ArtifactInvalid:
                event("fetch: refused")
                assert observed.manifest is None, "the artifact of a valid pointer was refused"
                return
            except ArtifactUnavailable:
                event("fetch: unavailable")
                # Loud, and only where a zero-grace prune could race the fetch (what
                # the grace of 4 x TTL is for): never for the pointer's current target.
                assert (
                    observed.manifest is None
                    or self.seen_since_observe > observed.manifest.rank
                    or self.corrupted_since_observe
                ), "the pointer's payload was gone"
                return
            store = AppendLogStore(work / "fold.log")
            try:
                self.assert_consistent_at(store, manifest.rank)
                self.resume(store)
                event("fetch: bootstrapped")
                got = {e.key: e.value for e in store.range()}
                assert got == fold_of(self.log, self.head), "bootstrap diverged after resume"
            finally:
                store.close()
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def assert_consistent_at(self, store: AppendLogStore, cursor: int) -> None:
        """Each key holds its value as of ``cursor`` or a later one, never an older one.

        Data ahead of the cursor is allowed (a resync's synthetic deletes carry
        no revision); a hole behind it is not.
        """
        got = {e.key: e.value for e in store.range()}
        for key in KEYS:
            history = [(rev, v) for rev, k, v in self.log if k == key]
            at = [v for rev, v in history if rev <= cursor]
            allowed = [at[-1] if at else None] + [v for rev, v in history if rev > cursor]
            assert got.get(key) in allowed, f"fold has {key}={got.get(key)!r} at cursor {cursor}"

    # -- liveness --------------------------------------------------------------------

    @precondition(lambda self: self.solo_rounds < 3)  # else it crowds out interleavings
    @rule(node=st.integers(0, NODES - 1))
    def solo_round(self, node: int) -> None:
        """A caught-up node publishing with nobody interleaved always publishes."""
        if self.rounds[node] is not None:
            return
        self.solo_rounds += 1
        store = self.stores[node]
        self.resume(store)
        if store.cursor.is_none:
            return  # nothing was ever delivered to it: nothing to export
        self.exports += 1
        art = self.dir / "artifacts" / str(self.exports)
        store.export_to(art, ExportInfo(exporter=f"node{node}"))
        _, outcome = self.transport.upload(KEY, art)
        rank = store.cursor.as_u64()
        if rank >= self.floor:  # at or past everything published: nothing may refuse it
            assert outcome is PublishOutcome.Published, "a caught-up solo round did not publish"
            assert self.transport.read_pointer(KEY).state.rank == rank
            self.floor = rank

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def folds_hold_nothing_older_than_their_cursor(self) -> None:
        """Every resume, on exporters too, keeps its fold consistent with its cursor."""
        for store in self.stores:
            self.assert_consistent_at(store, store.cursor.as_u64())

    @invariant()
    def pointer_never_regresses(self) -> None:
        rank = self.transport.read_pointer(KEY).state.rank
        if rank is not None:
            assert rank >= self.floor, f"pointer at {rank}, {self.floor} was published"
            self.floor = rank
            self.seen_since_observe = max(self.seen_since_observe, rank)

    @invariant()
    def pointer_names_an_existing_payload(self) -> None:
        observed = self.transport.read_pointer(KEY)
        if observed.manifest is not None and observed.body is not None:
            target = self.transport.payload_key(KEY, content_address(observed.body))
            try:
                self.transport.store.head(target)
            except ObjectNotFound:
                raise AssertionError(f"the pointer names {target}, which is gone") from None


TestPointerSwap = PointerSwap.TestCase
TestPointerSwap.settings = settings(max_examples=150, stateful_step_count=80, deadline=None)


# -- broken variants of each guard: the machine must catch every one ---------------


def publish_allowed_without_order(current: guards.PointerState, candidate_rank: int) -> bool:
    """No monotonic check: last writer wins, a slow exporter regresses the pointer."""
    return True


def publish_refused_over_corrupt(current: guards.PointerState, candidate_rank: int) -> bool:
    """A corrupt pointer treated as a wedge: nothing replaces it."""
    if current.present and current.rank is None:
        return False
    return guards.pointer_publish_allowed(current, candidate_rank)


def prunable_by_age_only(
    payload_rank: int | None, pointer_rank: int, is_pointer_target: bool, aged_out: bool
) -> bool:
    """The earlier age-only rule: an in-flight newer payload can be deleted."""
    return not is_pointer_target and aged_out


def prunable_at_or_below(
    payload_rank: int | None, pointer_rank: int, is_pointer_target: bool, aged_out: bool
) -> bool:
    """``<=`` instead of ``<``: another payload at the pointer's rank can still be published."""
    return (
        not is_pointer_target
        and aged_out
        and payload_rank is not None
        and payload_rank <= pointer_rank
    )


def resume_window_always_ok(revision: int, first_sequence: int) -> bool:
    """No resume-window check: NATS's silent clamp skips evicted delete markers."""
    return True


MUTANTS: list[tuple[str, Any, Callable[..., Any]]] = [
    ("pointer_publish_allowed", transport_module, publish_allowed_without_order),
    ("pointer_publish_allowed", transport_module, publish_refused_over_corrupt),
    ("payload_prunable", transport_module, prunable_by_age_only),
    ("payload_prunable", transport_module, prunable_at_or_below),
    ("resume_window_ok", guards, resume_window_always_ok),
]


def _catch(machine: type[RuleBasedStateMachine], max_examples: int) -> None:
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            machine,
            # No shrinking: finding a counterexample is the point, not minimising it.
            settings=settings(
                max_examples=max_examples,
                stateful_step_count=80,
                deadline=None,
                database=None,
                derandomize=True,  # a fixed search: the mutant is caught every run, not usually
                phases=[Phase.generate],
            ),
        )


@pytest.mark.parametrize(
    ("name", "module", "broken"), MUTANTS, ids=[m[2].__name__ for m in MUTANTS]
)
def test_a_broken_guard_is_caught(
    name: str, module: Any, broken: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(module, name, broken)
    _catch(PointerSwap, max_examples=300)
