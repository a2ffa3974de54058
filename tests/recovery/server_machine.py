"""The recovery state machine with a server that does not stay put
(docs/semantics/recovery.md §1.6, §3.2, §3.5): on top of :class:`RecoveryMachine`,
the engine lives in a real data directory and is restarted (a crash or a clean stop,
after a seal or not), its data directory replaced by an empty one, and its change
checkpoints pass its recovery window, against the same model.

It checks, besides the invariants of the base machine: after a restart every change
not yet in a checkpoint is in the next one and none already named is named again
(StrictlyLater); after a replacement every query refuses (RecoveryError) until the
client resyncs, and the resync reports every change of the new instance; a change
whose checkpoint passed the window is reported missed or inside a reported loss.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from waymark.log import Engine
from waymark.log.storage.restore import open_engine
from waymark.log.storage.store import Store
from waymark.protocol import ConfigPatch, Durability
from waymark.recovery import LocalReceiptStore, RecoveryError, RecoveryService

from .machine import CLIENT, RecoveryMachine

WINDOW_MS = 40_000  # the server's recovery window: a few waits pass it


class ServerMachine(RecoveryMachine):
    def _new_engine(self) -> Engine:
        self.generation = getattr(self, "generation", 0)
        self.replaced = getattr(self, "replaced", False)
        engine, self.wal = self._open()
        return engine

    def _open(self) -> tuple[Engine, Store]:
        data = self.dir / f"data-{self.generation}"
        engine, store, _ = open_engine(data, clock=self.clock, track_changes=True)
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
        super()._start()

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
        self.replaced = True

    @rule()
    def expire(self) -> None:
        """Time passes the recovery window: the checkpoints so far are gone."""
        self.clock.advance(WINDOW_MS + 1_000)

    # --- the checks ----------------------------------------------------------------------
    @invariant()
    def a_crash_now_would_miss_nothing(self) -> None:
        if self.replaced:
            self._refused()  # at every step until the resync: never a silent skip
            return
        super().a_crash_now_would_miss_nothing()

    def teardown(self) -> None:
        self.wal.close()
        super().teardown()
