"""What :class:`~waymark.recovery.service.RecoveryService` and its asyncio twin
:class:`~waymark.recovery.aio.AsyncRecoveryService` share: the whole bookkeeping of one
client over a :class:`~waymark.recovery.ledger.Ledger` — receipts and their futures,
which checkpoint receipts to persist, the watermark, compression
(docs/semantics/recovery.md §2-§4) — written once, without I/O.

Every step that writes or reads the receipt store is a generator that yields the store
calls it needs (:data:`Op`) and gets each one's result, or its exception, back: the
blocking service runs them in place, the asyncio one in a worker thread. The checkpoint
source's calls stay with each service (a blocking iterator or an asyncio one), which
feed the walk of the recovery query (:class:`~waymark.recovery.ledger.Walk`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ..clock import Clock
from ..protocol import Checkpoint, RecoveryReport
from .ledger import Ledger, Recovery, Version, Walk
from .store import ReceiptStore
from .types import CommittedVersion, CommittedVersionListener, RecoveryError

Op = tuple[Callable[..., Any], tuple[Any, ...]]  # a store call: method, arguments
T = TypeVar("T")
Io = Generator[Op, Any, T]


class ReceiptFuture(Protocol):
    """A ``concurrent.futures.Future`` or an ``asyncio.Future``."""

    def done(self) -> bool: ...
    def set_result(self, result: None) -> None: ...
    def set_exception(self, exception: BaseException) -> None: ...


F = TypeVar("F", bound=ReceiptFuture)


@dataclass(frozen=True)
class Status:
    """What ``waymark recovery status`` shows."""

    low_watermark: int | None
    ranges: list[tuple[int, int]]
    pending: list[tuple[int, list[str]]]  # unreceipted checkpoints and their keys
    missed: list[CommittedVersion]


@dataclass
class Query:
    ledger: Ledger
    found: Recovery
    newest: int
    first_start: bool
    moved: int | None  # the watermark moved into the window, if it was older


class _Waiter(Generic[F]):
    """A receipt's future and how many checkpoints it still waits for."""

    __slots__ = ("future", "remaining")

    def __init__(self, future: F, remaining: int) -> None:
        self.future, self.remaining = future, remaining


def versions(missed: dict[str, Version]) -> list[CommittedVersion]:
    return [CommittedVersion(key, seq, epoch) for key, (epoch, seq) in sorted(missed.items())]


class ServiceCore(Generic[F]):
    """The bookkeeping of one client; ``new_future`` makes the futures receipts get."""

    def __init__(
        self,
        store: ReceiptStore,
        client_id: str,
        *,
        recent_s: float,
        max_window_s: float,
        compress_interval_s: float,
        clock: Clock,
        new_future: Callable[[], F],
    ) -> None:
        self.store, self.client_id, self.clock = store, client_id, clock
        self.recent_ms = int(recent_s * 1000)
        self.max_window_ms = int(max_window_s * 1000)
        self.compress_interval_ms = int(compress_interval_s * 1000)
        self.new_future = new_future
        self.ledger: Ledger | None = None
        self.listener: CommittedVersionListener | None = None
        self.on_watermark: Callable[[], None] | None = None  # told when the watermark moves
        # Per unpersisted checkpoint, the future of every receipt waiting for it alone
        # (shared: one object per checkpoint, not per receipt), and the receipts that
        # wait for it among others.
        self._futures: dict[int, F] = {}
        self._waiters: dict[int, list[_Waiter[F]]] = {}
        self._next_compress = clock.now_ms() + self.compress_interval_ms

    # --- the recovery query (docs/semantics/recovery.md §3.3) ----------------------------
    def stored(self) -> Io[tuple[int | None, list[tuple[int, int]]]]:
        """The persisted watermark and the range receipts above it."""
        mark = yield (self.store.low_watermark, (self.client_id,))
        ranges = yield (_list_ranges, (self.store, self.client_id, mark or 0))
        return mark, ranges

    def walk(self, newest: int, mark: int | None, ranges: list[tuple[int, int]]) -> Walk | None:
        """The walk of the checkpoints back to :meth:`earliest_ms`; None on a first
        start, which reports nothing (docs/semantics/recovery.md §3.1)."""
        if mark is None and not ranges:
            return None
        return Walk(Ledger(mark or 0), ranges, newest, self.clock.now_ms() - self.recent_ms)

    def earliest_ms(self) -> int:
        return self.clock.now_ms() - self.max_window_ms

    def query(self, newest: int, walk: Walk | None) -> Query:
        """The query's outcome once its walk ended (or ran out of checkpoints)."""
        if walk is None:
            return Query(Ledger(newest), Recovery(), newest, True, None)
        found = walk.done()
        moved = None
        if not found.reached:
            # What lies between the watermark and the walk's end is older than the
            # window: the watermark moves into it (docs/semantics/recovery.md §3.2).
            moved = newest if found.oldest is None else found.oldest - 1
            if moved <= walk.ledger.low_watermark:
                moved = None
        return Query(walk.ledger, found, newest, False, moved)

    def start(self, query: Query, listener: CommittedVersionListener) -> Io[list[CommittedVersion]]:
        """Subscribe ``listener`` after ``query``: store the first or moved watermark,
        persist what the walk found receipted; the in-flight versions for the listener."""
        ledger = query.ledger
        if query.first_start:
            yield (self.store.store_low_watermark, (self.client_id, query.newest))
        elif query.moved is not None:
            yield (self.store.store_low_watermark, (self.client_id, query.moved))
            ledger.advance(query.moved)
        self.ledger, self.listener = ledger, listener
        yield from self.flush()  # checkpoints every key of which a newer receipt covers
        return [
            CommittedVersion(key, version, epoch)
            for checkpoint in query.found.recent
            for key, (epoch, version) in ledger.unreceipted(checkpoint.id)
        ]

    def offer(self, checkpoint: Checkpoint) -> tuple[list[CommittedVersion], bool]:
        """A new checkpoint from the source: its versions for the listener, and whether
        to :meth:`flush` (nothing of it passes the filter: receipted at once)."""
        ledger = self.ledger
        if ledger is None or self.listener is None or not ledger.add(checkpoint):
            return [], False
        fresh = ledger.unreceipted(checkpoint.id)
        return [CommittedVersion(key, v, epoch) for key, (epoch, v) in fresh], not fresh

    # --- receipts (docs/semantics/recovery.md §2.1) --------------------------------------
    def receipt(self, key: str, version: int, epoch: int) -> tuple[F, bool]:
        """The receipt's future, and whether to :meth:`flush` for it."""
        ledger = self.ledger
        if ledger is None:
            return self._failed(RecoveryError("subscribe first: no version is known yet")), False
        try:
            hit = ledger.receipt(key, (epoch, version))
        except RecoveryError as exc:
            return self._failed(exc), False
        waiting = [c for c in hit if not ledger.persisted(c)]
        if not waiting:
            done = self.new_future()
            done.set_result(None)
            return done, False
        if len(waiting) == 1:  # the common case: one checkpoint's shared future
            future = self._futures.get(waiting[0])
            if future is None:
                future = self._futures[waiting[0]] = self.new_future()
        else:
            future = self.new_future()
            waiter = _Waiter(future, len(waiting))
            for checkpoint in waiting:
                self._waiters.setdefault(checkpoint, []).append(waiter)
        return future, ledger.has_ready()

    def _failed(self, error: RecoveryError) -> F:
        future = self.new_future()
        future.set_exception(error)
        return future

    def flush(self) -> Io[None]:
        """Persist every complete checkpoint's receipt, then the watermark
        (docs/semantics/recovery.md §3.2)."""
        ledger = self.ledger
        assert ledger is not None
        client, store = self.client_id, self.store
        for checkpoint in ledger.ready():
            written = ledger.range_for(checkpoint)
            try:
                yield (store.store_range_receipt, (client, *written))
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
                yield (store.store_low_watermark, (client, mark))
                yield (store.purge_before, (client, mark))
            except Exception:  # a store error: a lower watermark only costs a longer walk
                pass
            else:
                ledger.advance(mark)
                if self.on_watermark is not None:
                    self.on_watermark()
        if self.clock.now_ms() >= self._next_compress:
            yield from self.compress()

    def _fail(self, checkpoint: int, exc: Exception) -> None:
        error = RecoveryError(f"the receipt of checkpoint {checkpoint} was not persisted: {exc}")
        if (shared := self._futures.pop(checkpoint, None)) is not None:
            shared.set_exception(error)  # a later receipt gets a new one, and retries
        for waiter in self._waiters.pop(checkpoint, ()):
            if not waiter.future.done():
                waiter.future.set_exception(error)

    # --- compression (docs/semantics/recovery.md §4.2) -----------------------------------
    def compress(self) -> Io[int]:
        """Merge contiguous range receipts and purge the ones merged; how many were
        purged."""
        self._next_compress = self.clock.now_ms() + self.compress_interval_ms
        ledger = self.ledger
        if ledger is None:
            return 0
        client, store = self.client_id, self.store
        purged = 0
        try:
            ranges = yield (_list_ranges, (store, client, ledger.low_watermark))
            for merged, redundant in ledger.merged(ranges):
                yield (store.store_range_receipt, (client, *merged))  # first: never a gap
                yield (store.purge_range_receipts, (client, redundant))
                purged += len(redundant)
        except Exception:  # a store error: compression is retried at the next interval
            return purged
        return purged

    def status(self, query: Query) -> Io[Status]:
        mark = yield (self.store.low_watermark, (self.client_id,))
        ranges = yield (_list_ranges, (self.store, self.client_id, mark or 0))
        pending = [(c, sorted(keys)) for c, keys in query.ledger.waiting()]
        return Status(mark, sorted(ranges), pending, versions(query.found.missed))

    # --- status reports (docs/reports.md) -------------------------------------------------
    def report(self, every_s: float) -> Io[RecoveryReport | None]:
        """This client's status for a server; None before :meth:`start`."""
        ledger = self.ledger
        if ledger is None:
            return None
        mark = ledger.low_watermark
        pending = sum(1 for _ in ledger.waiting())
        ranges = yield (_count_ranges, (self.store, self.client_id, mark))
        interval_ms = min(max(int(every_s * 1000), 100), 3_600_000)
        return RecoveryReport(self.client_id, mark, ranges, pending, interval_ms)


def _count_ranges(store: ReceiptStore, client: str, after: int) -> int:
    return sum(1 for _ in store.range_receipts(client, after))


def _list_ranges(store: ReceiptStore, client: str, after: int) -> list[tuple[int, int]]:
    return list(store.range_receipts(client, after))


def run(io: Io[T]) -> T:
    """Run ``io``'s store calls in place (the blocking service)."""
    try:
        op = next(io)
        while True:
            call, args = op
            try:
                result = call(*args)
            except Exception as exc:
                op = io.throw(exc)
            else:
                op = io.send(result)
    except StopIteration as stop:
        return stop.value
