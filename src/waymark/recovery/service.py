"""``RecoveryService``: receipts in, "what did I miss?" out
(docs/semantics/recovery.md §2, §3).

The service holds the checkpoints its client has not finished in a
:class:`~waymark.recovery.ledger.Ledger`, persists a checkpoint's receipt through the
:class:`~waymark.recovery.store.ReceiptStore` once every key in it is receipted, and
moves the low watermark behind them. A receipt's future resolves once every
checkpoint it completes or contributes to is persisted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

from ..clock import Clock, SystemClock
from ..protocol import Checkpoint
from .ledger import Ledger, Recovery, Version, recover
from .store import ReceiptStore
from .types import CheckpointSource, CommittedVersion, CommittedVersionListener, RecoveryError


@dataclass(frozen=True)
class Status:
    """What ``waymark recovery status`` shows."""

    low_watermark: int | None
    ranges: list[tuple[int, int]]
    pending: list[tuple[int, list[str]]]  # unreceipted checkpoints and their keys
    missed: list[CommittedVersion]


class _Waiter:
    """A receipt's future and how many checkpoints it still waits for."""

    __slots__ = ("future", "remaining")

    def __init__(self, future: Future[None], remaining: int) -> None:
        self.future, self.remaining = future, remaining


def _failed(error: RecoveryError) -> Future[None]:
    future: Future[None] = Future()
    future.set_exception(error)
    return future


def _versions(missed: dict[str, Version]) -> list[CommittedVersion]:
    return [CommittedVersion(key, seq, epoch) for key, (epoch, seq) in sorted(missed.items())]


_DONE: Future[None] = Future()  # every receipt with nothing left to persist
_DONE.set_result(None)


@dataclass
class _Query:
    ledger: Ledger
    found: Recovery
    newest: int
    first_start: bool
    moved: int | None  # the watermark moved into the window, if it was older


class RecoveryService:
    """Receipts and recovery for one client (``client_id``) over one checkpoint source
    and one receipt store; thread-safe."""

    def __init__(
        self,
        source: CheckpointSource,
        store: ReceiptStore,
        client_id: str,
        *,
        recent_s: float = 30.0,
        max_window_s: float = 86_400.0,
        compress_interval_s: float = 60.0,
        clock: Clock | None = None,
    ) -> None:
        self.source, self.store, self.client_id = source, store, client_id
        self.recent_ms = int(recent_s * 1000)
        self.max_window_ms = int(max_window_s * 1000)
        self.compress_interval_ms = int(compress_interval_s * 1000)
        self.clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._ledger: Ledger | None = None
        self._listener: CommittedVersionListener | None = None
        # Per unpersisted checkpoint, the future of every receipt waiting for it alone
        # (shared: one object per checkpoint, not per receipt), and the receipts that
        # wait for it among others.
        self._futures: dict[int, Future[None]] = {}
        self._waiters: dict[int, list[_Waiter]] = {}
        self._next_compress = self.clock.now_ms() + self.compress_interval_ms

    # --- the recovery query (docs/semantics/recovery.md §3.3) ----------------------------------
    def _query(self) -> _Query:
        client, store = self.client_id, self.store
        newest = self.source.newest_id()
        now = self.clock.now_ms()
        mark = store.low_watermark(client)
        ranges = list(store.range_receipts(client, mark or 0))
        if mark is None and not ranges:
            # No receipts ever persisted: a first start reports nothing
            # (docs/semantics/recovery.md §3.1).
            return _Query(Ledger(newest), Recovery(), newest, True, None)
        ledger = Ledger(mark or 0)
        earliest = now - self.max_window_ms
        found = recover(ledger, self.source.request_checkpoints(earliest), ranges, newest,
                        now - self.recent_ms)  # fmt: skip
        moved = None
        if not found.reached:
            # What lies between the watermark and the walk's end is older than the
            # window: the watermark moves into it (docs/semantics/recovery.md §3.2).
            moved = newest if found.oldest is None else found.oldest - 1
            if moved <= ledger.low_watermark:
                moved = None
        return _Query(ledger, found, newest, False, moved)

    def missed(self) -> list[CommittedVersion]:
        """The recovery query alone: keys never receipted with their newest version,
        each once; nothing is written and nothing subscribed."""
        query = self._query()
        return _versions(query.found.missed)

    def subscribe(self, listener: CommittedVersionListener) -> Iterator[CommittedVersion]:
        """The committed versions this client never receipted (each key once, at its
        newest version), then every later one through ``listener``
        (docs/semantics/recovery.md §3.3)."""
        with self._lock:
            query = self._query()
            ledger = query.ledger
            if query.first_start:
                self.store.store_low_watermark(self.client_id, query.newest)
            elif query.moved is not None:
                self.store.store_low_watermark(self.client_id, query.moved)
                ledger.advance(query.moved)
            self._ledger, self._listener = ledger, listener
            self._flush()  # checkpoints every key of which a newer receipt covers
            in_flight = [
                CommittedVersion(key, version, epoch)
                for checkpoint in query.found.recent
                for key, (epoch, version) in ledger.unreceipted(checkpoint.id)
            ]
            self.source.register_checkpoint_listener(self.receive_checkpoint, query.newest)
        for committed in in_flight:
            listener(committed)
        return iter(_versions(query.found.missed))

    def receive_checkpoint(self, checkpoint: Checkpoint) -> None:
        """A new checkpoint from the source: its versions go to the listener."""
        with self._lock:
            ledger, listener = self._ledger, self._listener
            if ledger is None or listener is None or not ledger.add(checkpoint):
                return
            fresh = ledger.unreceipted(checkpoint.id)
            if not fresh:
                self._flush()  # nothing of it passes the filter: receipted at once
        for key, (epoch, version) in fresh:
            listener(CommittedVersion(key, version, epoch))

    # --- receipts (docs/semantics/recovery.md §2.1) --------------------------------------------
    def submit_receipt(self, key: str, version: int, epoch: int) -> Future[None]:
        """Receipt ``key`` up to ``version`` of topic instance ``epoch`` (what a
        :class:`CommittedVersion` names). Idempotent; the future fails with
        :class:`RecoveryError` if the version is not known to be committed or a
        receipt could not be persisted, and resolves once every checkpoint naming the
        key up to that version has its receipt persisted."""
        with self._lock:
            ledger = self._ledger
            if ledger is None:
                return _failed(RecoveryError("subscribe first: no version is known yet"))
            try:
                hit = ledger.receipt(key, (epoch, version))
            except RecoveryError as exc:
                return _failed(exc)
            waiting = [c for c in hit if not ledger.persisted(c)]
            if not waiting:
                return _DONE
            if len(waiting) == 1:  # the common case: one checkpoint's shared future
                future = self._futures.get(waiting[0])
                if future is None:
                    future = self._futures[waiting[0]] = Future()
            else:
                future = Future()
                waiter = _Waiter(future, len(waiting))
                for checkpoint in waiting:
                    self._waiters.setdefault(checkpoint, []).append(waiter)
            if ledger.has_ready():
                self._flush()
        return future

    def _flush(self) -> None:
        """Persist every complete checkpoint's receipt, then the watermark
        (docs/semantics/recovery.md §3.2)."""
        ledger = self._ledger
        assert ledger is not None
        client, store = self.client_id, self.store
        for checkpoint in ledger.ready():
            written = ledger.range_for(checkpoint)
            try:
                store.store_range_receipt(client, *written)
            except Exception as exc:  # the store's own error: the receipt stays pending
                self._fail(checkpoint, exc)
                return
            ledger.mark_persisted(checkpoint, written)
            if (shared := self._futures.pop(checkpoint, None)) is not None:
                shared.set_result(None)
            for waiter in self._waiters.pop(checkpoint, ()):
                waiter.remaining -= 1
                if waiter.remaining == 0 and not waiter.future.done():
                    waiter.future.set_result(None)
        mark = ledger.watermark()
        if mark > ledger.low_watermark:
            try:
                store.store_low_watermark(client, mark)
                store.purge_before(client, mark)
            except Exception:  # a store error: a lower watermark only costs a longer walk
                pass
            else:
                ledger.advance(mark)
        if self.clock.now_ms() >= self._next_compress:
            self.compress()

    def _fail(self, checkpoint: int, exc: Exception) -> None:
        error = RecoveryError(f"the receipt of checkpoint {checkpoint} was not persisted: {exc}")
        if (shared := self._futures.pop(checkpoint, None)) is not None:
            shared.set_exception(error)  # a later receipt gets a new one, and retries
        for waiter in self._waiters.pop(checkpoint, ()):
            if not waiter.future.done():
                waiter.future.set_exception(error)

    # --- compression (docs/semantics/recovery.md §4.2) -----------------------------------------
    def compress(self) -> int:
        """Merge contiguous range receipts and purge the ones merged; returns how many
        were purged."""
        with self._lock:
            self._next_compress = self.clock.now_ms() + self.compress_interval_ms
            ledger = self._ledger
            if ledger is None:
                return 0
            client, store = self.client_id, self.store
            purged = 0
            try:
                ranges = list(store.range_receipts(client, ledger.low_watermark))
                for merged, redundant in ledger.merged(ranges):
                    store.store_range_receipt(client, *merged)  # first: never a gap
                    store.purge_range_receipts(client, redundant)
                    purged += len(redundant)
            except Exception:  # a store error: compression is retried at the next interval
                return purged
            return purged

    def status(self) -> Status:
        query = self._query()
        mark = self.store.low_watermark(self.client_id)
        ranges = sorted(self.store.range_receipts(self.client_id, mark or 0))
        pending = [(c, sorted(keys)) for c, keys in query.ledger.waiting()]
        return Status(mark, ranges, pending, _versions(query.found.missed))

    def close(self) -> None:
        self.source.close()
