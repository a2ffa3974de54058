"""The recovery state machine (docs/semantics/recovery.md §5): appends, deletes and
drops on a real engine, checkpoints, their delivery, receipts in any order, store
write failures (a fault injector), compression, and client crashes with restarts,
checked against a model of what the client receipted.

After every restart: every committed change the client never receipted is reported
(no miss), a missed key is reported at most once, and nothing is reported for a key
whose checkpoints are all receipted and persisted.
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import Future
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from waymark.clock import ManualClock
from waymark.log import Engine, RecordIn, TagMatch
from waymark.protocol import ConfigPatch, Durability
from waymark.recovery import CommittedVersion, LocalReceiptStore, RecoveryError, RecoveryService

from .harness import EngineCheckpoints, FaultInjectingStore

TOPICS = ("orders", "users", "scratch")  # scratch is ephemeral: never in a checkpoint
TAGS = (None, "a", "b", "c")
RECENT_S = 5
CLIENT = "indexer"


class RecoveryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # tmpfs when there is one: the machine is about the logic, and SQLite's syncs on
        # a disk would make it slow (a real disk and a real SIGKILL: test_crash.py).
        shm = Path("/dev/shm")
        self.dir = Path(tempfile.mkdtemp(prefix="waymark-recovery-",
                                         dir=shm if shm.is_dir() else None))  # fmt: skip
        self.clock = ManualClock()
        self.engine = Engine(clock=self.clock)
        self.engine.track_changes(86_400_000)
        self.engine.put_topic("scratch", ConfigPatch(durability=Durability.EPHEMERAL))
        self.source = EngineCheckpoints(self.engine)
        # the model: what the source said, what the client receipted (any run)
        self.entries: dict[int, dict[str, int]] = {}
        self.receipted: set[tuple[int, str]] = set()
        self.persisted: set[int] = set()
        self.floor: int | None = None  # the first start's watermark
        self.heads: dict[str, int] = {}
        self._start()

    # --- a run of the client ------------------------------------------------------------
    def _start(self) -> None:
        self.store = FaultInjectingStore(LocalReceiptStore(self.dir / "receipts.db"))
        self.service = RecoveryService(
            self.source, self.store, CLIENT, recent_s=RECENT_S, clock=self.clock,
            compress_interval_s=3_600,
        )  # fmt: skip
        self.notified: list[CommittedVersion] = []
        self.futures: list[tuple[Future[None], str, int, int]] = []
        newest = self.source.newest_id()
        missed = list(self.service.subscribe(self.notified.append))
        self.check_restart(newest, missed, list(self.notified))
        self.notified += missed
        self.known = newest
        if self.floor is None:
            self.floor = newest

    def check_restart(
        self, newest: int, missed: list[CommittedVersion], live: list[CommittedVersion]
    ) -> None:
        keys = [m.key for m in missed]
        assert len(keys) == len(set(keys)), f"a key reported twice in one query: {missed}"
        if self.floor is None:
            assert not missed, "a first start reports nothing"
            return
        reported: dict[str, int] = {}
        for committed in missed + live:
            reported[committed.key] = max(reported.get(committed.key, -1), committed.version)
        for checkpoint, entries in self.entries.items():
            if not self.floor < checkpoint <= newest:
                continue
            for key, last in entries.items():
                if (checkpoint, key) not in self.receipted:
                    assert reported.get(key, -1) >= last, (
                        f"never reported: {key}@{last} of checkpoint {checkpoint}, "
                        f"reported {reported}"
                    )
        for committed in missed:
            assert any(
                entries.get(committed.key) == committed.version and c not in self.persisted
                for c, entries in self.entries.items()
            ), f"reported although receipted and persisted: {committed}"

    # --- the server -----------------------------------------------------------------------
    @rule(topic=st.sampled_from(TOPICS), tags=st.lists(st.sampled_from(TAGS), min_size=1,
                                                       max_size=3))  # fmt: skip
    def append(self, topic: str, tags: list[str | None]) -> None:
        result = self.engine.append(topic, [RecordIn.of(i, tag=t) for i, t in enumerate(tags)])
        self.heads[topic] = result.head_seq

    @rule(topic=st.sampled_from(TOPICS[:2]), tag=st.sampled_from(TAGS))
    def delete(self, topic: str, tag: str | None) -> None:
        if topic not in self.heads:
            return
        if tag is None:
            self.engine.delete(topic, before_seq=self.heads[topic])
        else:
            self.engine.delete(topic, match=TagMatch.parse(tag))

    @rule(topic=st.sampled_from(TOPICS[:2]))
    def drop(self, topic: str) -> None:
        if self.heads.pop(topic, None) is not None:
            self.engine.delete_topic(topic)

    @rule()
    def checkpoint(self) -> None:
        self.clock.advance(1_000)
        result = self.engine.emit_checkpoint()
        if result is not None:
            (checkpoint,) = [c for c in self.source.all() if c.id == result.seqs[0]]
            entries = {c.key: c.last for c in checkpoint.changes}
            assert not any(k.startswith("scratch") for k in entries), "ephemeral in a checkpoint"
            for key, last in entries.items():
                topic = key.split("/", 1)[0]
                assert last >= 1, f"{key}@{last} was never committed"
                assert last <= max(self.heads.get(topic, 0), last), "a version past the head"
            self.entries[checkpoint.id] = entries

    @rule()
    def deliver(self) -> None:
        self.source.deliver()
        self.known = self.source.cursor

    @rule(seconds=st.integers(1, 3 * RECENT_S))
    def wait(self, seconds: int) -> None:
        self.clock.advance(seconds * 1000)

    # --- the client -----------------------------------------------------------------------
    @precondition(lambda self: self.notified)
    @rule(pick=st.integers(0, 10_000), later=st.booleans())
    def receipt(self, pick: int, later: bool) -> None:
        offered = self.notified[pick % len(self.notified)]
        key, version = offered.key, offered.version
        if later:  # a later version of the key, if one is known
            version = max(v.version for v in self.notified if v.key == key)
        self.receipt_at(key, version)

    def receipt_at(self, key: str, version: int) -> None:
        future = self.service.submit_receipt(key, version)
        if (
            future.done()
            and isinstance(future.exception(), RecoveryError)
            and ("not known" in str(future.exception()))
        ):
            raise AssertionError(f"an offered version was refused: {key}@{version}")
        for checkpoint, entries in self.entries.items():
            if checkpoint <= self.known and entries.get(key, version + 1) <= version:
                self.receipted.add((checkpoint, key))
        self.futures.append((future, key, version, self.known))

    @precondition(lambda self: self.notified)
    @rule()
    def receipt_newest_first(self) -> None:
        """Receipts out of order: the newest offered version of each key first."""
        newest: dict[str, int] = {}
        for offered in self.notified:
            newest[offered.key] = max(newest.get(offered.key, -1), offered.version)
        key = max(newest, key=lambda k: newest[k])
        self.receipt_at(key, newest[key])

    @rule(key=st.sampled_from(["orders/a", "nowhere", "users"]))
    def receipt_unknown(self, key: str) -> None:
        future = self.service.submit_receipt(key, 10**9)
        assert isinstance(future.exception(timeout=0), RecoveryError)

    @rule(failing=st.booleans())
    def store_fails(self, failing: bool) -> None:
        self.store.failing = failing

    @rule()
    def compress(self) -> None:
        self.service.compress()

    @rule()
    def crash(self) -> None:
        """The client process dies: everything in memory is gone; the store's file stays
        (a real SIGKILL is tests/recovery/test_crash.py)."""
        self.store.close()
        self.store.failing = False
        self._start()

    @invariant()
    def futures_resolved_mean_persisted(self) -> None:
        still = []
        for future, key, version, known in self.futures:
            if not future.done():
                still.append((future, key, version, known))
            elif future.exception() is None:
                for checkpoint, entries in self.entries.items():
                    if checkpoint <= known and entries.get(key, version + 1) <= version:
                        self.persisted.add(checkpoint)
        self.futures = still

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)
