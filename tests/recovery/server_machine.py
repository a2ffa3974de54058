"""The recovery state machine with a server that does not stay put
(docs/semantics/recovery.md §1.6, §3.2, §3.5): on top of :class:`RecoveryMachine`,
the engine lives in a real data directory and is restarted (a crash or a clean stop,
after a seal or not), its data directory replaced by an empty one, and its change
checkpoints pass its recovery window, and the client restarts with another topic
filter (docs/semantics/recovery.md §3.4), against the same model.

It checks, besides the invariants of the base machine: after a restart every change
not yet in a checkpoint is in the next one and none already named is named again
(StrictlyLater); after a replacement every query refuses (RecoveryError) until the
client resyncs, and the resync reports every change of the new instance; a change
whose checkpoint passed the window is reported missed or inside a reported loss.
Another filter is refused (RecoveryError) and changes nothing persisted unless the
run says ``new_filter``; then, if it adds topics, the checkpoints the old filter could
pass (above its ``since``, and the holes of the receipts below it when the first filter
took effect) that the receipts now hold are reported as ``filter_changed`` losses,
those and no other, and every later restart reports every change of the new filter's
topics that was not receipted, outside the losses announced for the topics added.
"""

from __future__ import annotations

from itertools import combinations

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from waymark.log import Engine
from waymark.log.config import StorageConfig
from waymark.log.storage.restore import open_engine
from waymark.log.storage.store import Store
from waymark.protocol import ConfigPatch, Durability, key_topic
from waymark.recovery import (
    CommittedVersion,
    LocalReceiptStore,
    RecoveryError,
    RecoveryService,
    WindowLoss,
)
from waymark.recovery.store import Binding

from .machine import CLIENT, RECENT_S, TOPICS, Change, RecoveryMachine

WINDOW_MS = 40_000  # the server's recovery window: a few waits pass it
Filter = frozenset[str] | None  # None: every topic
FILTERS: tuple[Filter, ...] = (
    None, *(frozenset(c) for n in range(1, len(TOPICS) + 1) for c in combinations(TOPICS, n))
)  # fmt: skip


def adds(old: Filter, new: Filter) -> bool:
    """Whether ``new`` reads a topic ``old`` does not (None reads every topic, those not
    created yet too)."""
    return old is not None and (new is None or not new <= old)


def spans(ids: set[int]) -> list[tuple[int, int]]:
    """``ids`` as maximal ranges of consecutive ids."""
    found: list[tuple[int, int]] = []
    for i in sorted(ids):
        if found and found[-1][1] + 1 == i:
            found[-1] = (found[-1][0], i)
        else:
            found.append((i, i))
    return found


def persisted(store: LocalReceiptStore) -> tuple[int | None, list[tuple[int, int]], Binding | None]:
    """What the client's receipts hold: watermark, range receipts, binding."""
    return (store.low_watermark(CLIENT), list(store.range_receipts(CLIENT, 0)),
            store.binding(CLIENT))  # fmt: skip


class ServerMachine(RecoveryMachine):
    def _new_engine(self) -> Engine:
        self.generation = getattr(self, "generation", 0)
        self.replaced = getattr(self, "replaced", False)
        engine, self.wal = self._open()
        return engine

    def _open(self) -> tuple[Engine, Store]:
        data = self.dir / f"data-{self.generation}"
        engine, store, _ = open_engine(StorageConfig(data), clock=self.clock, track_changes=True)
        engine.track_changes(WINDOW_MS)
        return engine, store

    def _sync(self) -> None:
        self.wal.sync_blocking()

    def _start(self) -> None:
        if getattr(self, "replaced", False):
            self._refused()
            # The client re-processes everything, then resyncs: every change of the new
            # instance is reported (its watermark goes to 0).
            self.floor, self.processed, self.persisted = 0, {}, set()
            self.replaced, self.resync = False, True
            self.since, self.holes = 0, set()
        super()._start()
        if getattr(self, "since", None) is None:  # the first start
            self.since, self.holes = self.floor, set()

    def _refused(self) -> None:
        store = LocalReceiptStore(self.dir / "receipts.db")
        query = RecoveryService(self.source, store, CLIENT, recent_s=0, clock=self.clock,
                                report=False)  # fmt: skip
        try:
            found = query.missed()
        except RecoveryError:
            return
        finally:
            store.close()
        raise AssertionError(f"another instance's checkpoints were taken silently: {found}")

    # --- the server ----------------------------------------------------------------------
    @rule(clean=st.booleans(), seal=st.booleans())
    def server_restart(self, clean: bool, seal: bool) -> None:
        """The server stops cleanly (exact heads, a seal) or is SIGKILLed (the WAL as
        written: a SIGKILL keeps the pages written), after a seal or not."""
        if seal:
            self.wal.seal(self.engine)
        self._sync()
        if clean:
            self.engine.close()
            self.wal.seal(self.engine)
            self._sync()
        self.wal.close()
        self.engine, self.wal = self._open()
        self.source.engine = self.engine

    @rule()
    def replace_data_dir(self) -> None:
        """The server comes back with an empty data directory: another instance."""
        self.wal.close()
        self.generation += 1
        self.engine, self.wal = self._open()
        self.engine.put_topic("scratch", ConfigPatch(durability=Durability.EPHEMERAL))
        self.source.engine = self.engine
        self.live, self.heads, self.pending = {}, {}, []
        self.entries, self.changes, self.named = {}, {}, {}
        self.announced, self.lost = [], []
        self.replaced = True

    @rule()
    def expire(self) -> None:
        """Time passes the recovery window: the checkpoints so far are gone."""
        self.clock.advance(WINDOW_MS + 1_000)

    # --- the client ----------------------------------------------------------------------
    @precondition(lambda self: not self.replaced)
    @rule(topics=st.sampled_from(FILTERS), adopt=st.booleans(), caught_up=st.booleans())
    def restart_with_filter(self, topics: Filter, adopt: bool, caught_up: bool) -> None:
        """The client restarts reading ``topics``: refused unless it says ``new_filter``
        (``adopt``; otherwise it goes back to its filter), which adopts them.
        ``caught_up``: it first processed and receipted all it was told of (the
        receipts then reach past the filter's ``since``: what a new one loses)."""
        if caught_up:
            self.store.failing = False
            self.checkpoint(True)
            self.catch_up()
        old = self.source.topics
        self.store.close()
        self.store.failing = False
        if topics == old:
            self._start()
            return
        self.source.topics = topics
        store = LocalReceiptStore(self.dir / "receipts.db")
        before = persisted(store)
        try:
            service = RecoveryService(self.source, store, CLIENT, recent_s=RECENT_S,
                                      clock=self.clock, report=False)  # fmt: skip
            try:
                found = list(service.subscribe(lambda committed: None))
            except RecoveryError as refusal:
                assert "new_filter" in str(refusal), f"refused for another reason: {refusal}"
            else:
                raise AssertionError(f"another filter was taken silently: {found}")
            assert persisted(store) == before, "a refused filter changed the receipts"
            mark, ranges, _ = before
            end = max([mark or 0, *(last for _, last in ranges)])  # the receipts' end
            held = set(range(1, (mark or 0) + 1)).union(
                *(range(first, last + 1) for first, last in ranges))  # fmt: skip
        finally:
            store.close()
        if not adopt:
            self.source.topics = old
            self._start()
            return
        assert end >= max(self.persisted, default=0), f"receipts end at {end}"
        if adds(old, topics):
            # What the old filter could pass (above its since, and its holes below) and
            # the receipts now hold: it may have receipted those for the topics it left out.
            assert old is not None
            self.promised = spans({i for i in held if i > self.since or i in self.holes})
            self.announced += [(first, last, old) for first, last in self.promised]
        self.new_filter = True
        self._start()
        if topics is None or old is None:  # a filter after another keeps what that could pass
            self.since, self.holes = end, set(range((mark or 0) + 1, end + 1)) - held

    @precondition(lambda self: not self.replaced)
    @rule(pick=st.integers(0, 10_000))
    def narrow_or_widen_filter(self, pick: int) -> None:
        """A client that reads every topic is told to read some; one that reads some
        catches up, then is told to read more: the change that loses what the old
        filter passed (weights the rule above towards it)."""
        old = self.source.topics
        choices = [f for f in FILTERS if (f is not None and old is None) or adds(old, f)]
        self.restart_with_filter(choices[pick % len(choices)], True, old is not None)

    def excused(self, checkpoint: int, change: Change) -> bool:
        """A change of a topic the filter leaves out counts as receipted; one of a topic
        a filter change added, in the loss it announced, is lost and said so."""
        topic, topics = key_topic(change.key), self.source.topics
        if topics is not None and topic not in topics:
            return True
        return any(first <= checkpoint <= last and topic not in old
                   for first, last, old in self.announced)  # fmt: skip

    # --- the checks ----------------------------------------------------------------------
    def check_restart(
        self,
        newest: int,
        found: list[CommittedVersion | WindowLoss],
        live: list[CommittedVersion],
    ) -> None:
        """The ``filter_changed`` loss the docs promise and no other; a change of a
        topic the filter kept is not excused by it (see :meth:`excused`)."""
        self.announced = getattr(self, "announced", [])
        promised, self.promised = getattr(self, "promised", []), []
        lost = [(f.first, f.last) for f in found
                if isinstance(f, WindowLoss) and f.reason == "filter_changed"]  # fmt: skip
        assert lost == promised, (
            f"filter change: reported losses {lost}, the docs promise {promised}"
        )
        others = [f for f in found
                  if not isinstance(f, WindowLoss) or f.reason != "filter_changed"]  # fmt: skip
        super().check_restart(newest, others, live)

    @invariant()
    def a_crash_now_would_miss_nothing(self) -> None:
        if self.replaced:
            self._refused()  # at every step until the resync: never a silent skip
            return
        super().a_crash_now_would_miss_nothing()

    def teardown(self) -> None:
        self.wal.close()
        super().teardown()
