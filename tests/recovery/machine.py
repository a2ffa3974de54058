"""The recovery state machine (docs/semantics/recovery.md §5): appends, deletes, drops
and recreations on a real engine, checkpoints, their delivery, state reads and
receipts in any order (a receipt may come long after its read, with deletions and
drops in between), store write failures (a fault injector), compression, and client
crashes with restarts, checked against a model of what the client processed.

The model knows each change by when it happened (a tick), not by its version: a
client that read a key's state at tick R processed every change of the key up to R,
whatever versions the service compares. After every restart: every change the
client never processed is reported (no miss), a missed key is reported at most once,
and nothing is reported for a key whose checkpoints are all receipted and persisted.
At every checkpoint: each key is named at a version later than every version named
for it before, never one its topic instance did not commit, never an ephemeral one.
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from waymark.clock import ManualClock
from waymark.log import Engine, RecordIn, TagMatch
from waymark.protocol import ConfigPatch, Durability
from waymark.recovery import (
    CommittedVersion,
    LocalReceiptStore,
    RecoveryError,
    RecoveryService,
    WindowLoss,
)

from .harness import EngineCheckpoints, FaultInjectingStore

TOPICS = ("orders", "users", "scratch")  # scratch is ephemeral: never in a checkpoint
TAGS = (None, "a", "b", "c")
RECENT_S = 5
CLIENT = "indexer"

Version = tuple[int, int]  # (epoch, seq)


def key_of(topic: str, tag: str | None) -> str:
    return topic if tag is None else f"{topic}/{tag}"


@dataclass
class Change:
    """A change of a key, as the model knows it: when it happened."""

    tick: int
    key: str


@dataclass
class Read:
    """The client read ``offered.key``'s state at ``tick``, to receipt ``offered`` later."""

    offered: CommittedVersion
    tick: int


class RecoveryMachine(RuleBasedStateMachine):
    check_versions = True  # the per-checkpoint version checks (off: only the end-to-end ones)

    def __init__(self) -> None:
        super().__init__()
        # tmpfs when there is one: the machine is about the logic, and SQLite's syncs on
        # a disk would make it slow (a real disk and a real SIGKILL: test_server.py).
        shm = Path("/dev/shm")
        self.dir = Path(tempfile.mkdtemp(prefix="waymark-recovery-",
                                         dir=shm if shm.is_dir() else None))  # fmt: skip
        self.clock = ManualClock()
        self.engine = self._new_engine()
        self.engine.put_topic("scratch", ConfigPatch(durability=Durability.EPHEMERAL))
        self.source = EngineCheckpoints(self.engine)
        # the model of the server: live records per topic (seq, tag), each instance's
        # last seq, and the changes not yet in a checkpoint
        self.tick = 0
        self.live: dict[str, list[tuple[int, str | None]]] = {}
        self.heads: dict[int, int] = {}  # epoch -> the highest seq it handed out or named
        self.pending: list[Change] = []
        # what the checkpoints said, and the model's changes in each
        self.entries: dict[int, dict[str, Version]] = {}
        self.changes: dict[int, list[Change]] = {}
        self.named: dict[str, Version] = {}  # the newest version named for each key
        # the client: what it processed (any run) and what is persisted
        self.processed: dict[str, int] = {}  # key -> the latest tick of a receipted read
        self.persisted: set[int] = set()
        self.floor: int | None = None  # the first start's watermark
        self.resync = False  # the next start resyncs (docs/semantics/recovery.md §3.5)
        # the window losses a subscribe reported: once only, the watermark then passes
        # them (docs/semantics/recovery.md §3.2), so later queries need not again
        self.lost: list[WindowLoss] = []
        # the next start adopts another filter (docs/semantics/recovery.md §3.4)
        self.new_filter = False
        self._start()

    def _new_engine(self) -> Engine:
        engine = Engine(clock=self.clock)
        engine.track_changes(86_400_000)
        return engine

    def _sync(self) -> None:
        """Make every journal frame durable (an engine with a WAL)."""

    # --- a run of the client ------------------------------------------------------------
    def _start(self) -> None:
        self.store = FaultInjectingStore(LocalReceiptStore(self.dir / "receipts.db"))
        self.service = RecoveryService(
            self.source, self.store, CLIENT, recent_s=RECENT_S, clock=self.clock,
            compress_interval_s=3_600,
        )  # fmt: skip
        self.notified: list[CommittedVersion] = []
        self.reads: list[Read] = []
        self.futures: list[tuple[Future[None], str, Version, int]] = []
        newest = self.source.newest_id()
        found = list(self.service.subscribe(self.notified.append, resync=self.resync,
                                            new_filter=self.new_filter))  # fmt: skip
        self.resync = self.new_filter = False
        self.check_restart(newest, found, list(self.notified))
        # (a filter change loses only the topics it adds: server_machine.py)
        self.lost += [f for f in found
                      if isinstance(f, WindowLoss) and f.reason != "filter_changed"]  # fmt: skip
        self.notified += [f for f in found if isinstance(f, CommittedVersion)]
        self.known = newest
        if self.floor is None:
            self.floor = newest

    def check_restart(
        self,
        newest: int,
        found: list[CommittedVersion | WindowLoss],
        live: list[CommittedVersion],
    ) -> None:
        """NoMiss, OncePerQuery, ReceiptedNeverReported over a query's answer; the
        checkpoints a reported loss covers are announced, not missed."""
        losses = [f for f in found if isinstance(f, WindowLoss)] + self.lost
        missed = [f for f in found if isinstance(f, CommittedVersion)]
        keys = [m.key for m in missed]
        assert len(keys) == len(set(keys)), f"a key reported twice in one query: {missed}"
        if self.floor is None:
            assert not missed, "a first start reports nothing"
            return
        reported: dict[str, Version] = {}
        for c in missed + live:
            reported[c.key] = max(reported.get(c.key, (-1, -1)), (c.epoch, c.version))
        for checkpoint, changes in self.changes.items():
            if not self.floor < checkpoint <= newest:
                continue
            if any(loss.first <= checkpoint <= loss.last for loss in losses):
                continue
            for change in changes:
                if self.excused(checkpoint, change):
                    continue
                if self.processed.get(change.key, -1) < change.tick:
                    named = self.entries[checkpoint][change.key]
                    assert reported.get(change.key, (-1, -1)) >= named, (
                        f"never reported: {change.key}@{named} of checkpoint {checkpoint} "
                        f"(a change at tick {change.tick}, processed up to "
                        f"{self.processed.get(change.key)}), reported {reported}"
                    )
        for c in missed:
            assert any(
                entries.get(c.key) == (c.epoch, c.version) and checkpoint not in self.persisted
                for checkpoint, entries in self.entries.items()
            ), f"reported although receipted and persisted: {c}"

    def excused(self, checkpoint: int, change: Change) -> bool:
        """Whether a restart need not report ``change`` of ``checkpoint`` (a filter)."""
        return False

    # --- the server -----------------------------------------------------------------------
    def _changed(self, key: str) -> None:
        self.pending.append(Change(self.tick, key))

    @rule(topic=st.sampled_from(TOPICS), tags=st.lists(st.sampled_from(TAGS), min_size=1,
                                                       max_size=3))  # fmt: skip
    def append(self, topic: str, tags: list[str | None]) -> None:
        """An append; to a dropped topic it creates a new instance (a recreation)."""
        self.tick += 1
        result = self.engine.append(topic, [RecordIn.of(i, tag=t) for i, t in enumerate(tags)])
        epoch = self.engine.get_topic(topic, touch=False).epoch
        self.heads[epoch] = result.head_seq
        if topic == "scratch":
            return
        self.live.setdefault(topic, []).extend(zip(result.seqs, tags, strict=True))
        for tag in set(tags):
            self._changed(key_of(topic, tag))

    @rule(topic=st.sampled_from(TOPICS[:2]), tag=st.sampled_from(TAGS), back=st.integers(0, 3))
    def delete(self, topic: str, tag: str | None, back: int) -> None:
        """A tag deletion, or one of every record below a seq."""
        if topic not in self.live:
            return
        self.tick += 1
        state = self.engine.get_topic(topic, touch=False)
        records = self.live[topic]
        if tag is None:
            before = max(1, state.head_seq + 1 - back)
            result = self.engine.delete(topic, before_seq=before).response
            gone = [r for r in records if r[0] < before]
        else:
            result = self.engine.delete(topic, match=TagMatch.parse(tag)).response
            gone = [r for r in records if r[1] == tag]
        assert result.deleted == len(gone)
        self.live[topic] = [r for r in records if r not in gone]
        self.heads[state.epoch] = result.head_seq
        for key in {key_of(topic, t) for _, t in gone}:
            self._changed(key)

    @rule(topic=st.sampled_from(TOPICS[:2]))
    def drop(self, topic: str) -> None:
        records = self.live.pop(topic, None)
        if records is None:
            return
        self.tick += 1
        state = self.engine.get_topic(topic, touch=False)
        self.engine.delete_topic(topic)
        self.heads[state.epoch] = state.head_seq + 1  # the drop names the next seq
        for key in {key_of(topic, t) for _, t in records}:
            self._changed(key)

    @rule(deliver=st.booleans())
    def checkpoint(self, deliver: bool) -> None:
        """The interval ends; ``deliver``: its checkpoint reaches the client at once."""
        self.clock.advance(1_000)
        self._sync()
        result = self.engine.emit_checkpoint()
        self._sync()
        if result is None:
            assert not self.pending, f"changes left out of every checkpoint: {self.pending}"
            return
        (checkpoint,) = [c for c in self.source.all(filtered=False) if c.id == result.seqs[0]]
        entries = {c.key: (c.epoch, c.last) for c in checkpoint.changes}
        assert not any(k.startswith("scratch") for k in entries), "ephemeral in a checkpoint"
        for change in self.pending:
            assert change.key in entries, f"a change of {change.key} in no checkpoint"
        if self.check_versions:
            for c in checkpoint.changes:
                assert 1 <= c.first <= c.last <= self.heads[c.epoch], (
                    f"{c.key}@{c.last} of epoch {c.epoch}: never committed"
                )
                assert entries[c.key] > self.named.get(c.key, (-1, -1)), (
                    f"{c.key} named at {entries[c.key]}, not after {self.named[c.key]}: "
                    "a receipt of the earlier version would cover this change"
                )
        self.named.update(entries)
        self.entries[checkpoint.id] = entries
        self.changes[checkpoint.id], self.pending = self.pending, []
        if deliver:
            self.deliver()

    @rule()
    def deliver(self) -> None:
        self.source.deliver()
        self.known = self.source.cursor

    @rule(seconds=st.integers(1, 3 * RECENT_S))
    def wait(self, seconds: int) -> None:
        self.clock.advance(seconds * 1000)

    # --- the client -----------------------------------------------------------------------
    @precondition(lambda self: self.notified)
    @rule(pick=st.integers(0, 10_000), later=st.booleans(), now=st.booleans())
    def read(self, pick: int, later: bool, now: bool) -> None:
        """The client reads the state of a key it was told of, now; it receipts it at
        once (``now``) or later."""
        offered = self.notified[pick % len(self.notified)]
        if later:  # the newest version of the key it was told of
            offered = max((v for v in self.notified if v.key == offered.key),
                          key=lambda v: (v.epoch, v.version))  # fmt: skip
        self.reads.append(Read(offered, self.tick))
        if now:
            self.receipt(len(self.reads) - 1)

    @precondition(lambda self: self.notified or self.reads)
    @rule()
    def catch_up(self) -> None:
        """The client receipts what it read, then reads and receipts every key it was
        told of at its newest version."""
        while self.reads:
            self.receipt(0)
        for offered in self.notified:
            self.reads.append(Read(offered, self.tick))
            self.receipt(len(self.reads) - 1)

    @precondition(lambda self: self.notified)
    @rule(pick=st.integers(0, 10_000), drop=st.booleans())
    def removed_while_reading(self, pick: int, drop: bool) -> None:
        """The client reads a key; meanwhile the key is deleted (or its topic dropped);
        the removal's checkpoint reaches the client, which then receipts what it read
        (docs/semantics/recovery.md §1.3)."""
        offered = self.notified[pick % len(self.notified)]
        topic, _, tag = offered.key.partition("/")
        if topic not in self.live:
            return
        read = Read(offered, self.tick)
        if drop:
            self.drop(topic)
        else:
            self.delete(topic, tag or None, 0)
        self.checkpoint(True)
        self.reads.append(read)
        self.receipt(len(self.reads) - 1)

    @precondition(lambda self: self.reads)
    @rule(pick=st.integers(0, 10_000))
    def receipt(self, pick: int) -> None:
        """Receipt one of the reads: any of them, so receipts come in any order."""
        read = self.reads.pop(pick % len(self.reads))
        offered = read.offered
        future = self.service.submit_receipt(offered.key, offered.version, offered.epoch)
        if (
            future.done()
            and isinstance(future.exception(), RecoveryError)
            and ("not known" in str(future.exception()))
        ):
            raise AssertionError(f"an offered version was refused: {offered}")
        self.processed[offered.key] = max(self.processed.get(offered.key, -1), read.tick)
        self.futures.append((future, offered.key, (offered.epoch, offered.version), self.known))

    @rule(key=st.sampled_from(["orders/a", "nowhere", "users"]))
    def receipt_unknown(self, key: str) -> None:
        future = self.service.submit_receipt(key, 10**9, 10**9)
        assert isinstance(future.exception(timeout=0), RecoveryError)

    @rule(failing=st.booleans())
    def store_fails(self, failing: bool) -> None:
        self.store.failing = failing

    @rule()
    def compress(self) -> None:
        self.service.compress()

    @rule()
    def crash(self) -> None:
        """The client process dies: everything in memory is gone, its reads not yet
        receipted too; the store's file stays (a real SIGKILL: test_server.py)."""
        self.store.close()
        self.store.failing = False
        self._start()

    @invariant()
    def a_crash_now_would_miss_nothing(self) -> None:
        """The recovery query over what is persisted right now, as a restart would run
        it (nothing in flight: ``recent_s`` 0): the checks of a restart at every step."""
        if self.floor is None:
            return
        query = RecoveryService(self.source, self.store.store, CLIENT, recent_s=0,
                                clock=self.clock)  # fmt: skip
        self.check_restart(self.source.newest_id(), query.missed(), [])

    @invariant()
    def futures_resolved_mean_persisted(self) -> None:
        still = []
        for future, key, version, known in self.futures:
            if not future.done():
                still.append((future, key, version, known))
            elif future.exception() is None:
                for checkpoint, entries in self.entries.items():
                    if checkpoint <= known and entries.get(key, (2**63, 0)) <= version:
                        self.persisted.add(checkpoint)
        self.futures = still

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)
