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
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from ..clock import Clock
from ..protocol import Checkpoint, RecoveryReport, key_topic
from .ledger import Ledger, Recovery, Version, Walk
from .store import Binding, ReceiptStore
from .types import (
    CommittedVersion,
    CommittedVersionListener,
    Missed,
    RecoveryError,
    ServerView,
    WindowLoss,
)

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
    failure: str | None = None  # why it stopped (docs/semantics/recovery.md §3.6)


@dataclass(frozen=True)
class Lookup:
    """A receipt the service asks the log about (:meth:`CheckpointSource.committed`)."""

    key: str
    version: int
    epoch: int


@dataclass(frozen=True)
class Checked:
    """What :meth:`ServiceCore.check` found: a reset (a resync), the losses of a filter
    change, how far the stored receipts reached."""

    reset: bool
    losses: list[WindowLoss]
    receipted: int
    holes: list[tuple[int, int]] = field(default_factory=list)  # of the receipts below it


def _topics(topics: list[str] | None) -> str:
    return "every topic" if topics is None else "topics " + ", ".join(topics)


@dataclass
class Stored:
    """A client's persisted state: watermark, range receipts above it, binding."""

    mark: int | None
    ranges: list[tuple[int, int]]
    binding: Binding | None


@dataclass
class Query:
    ledger: Ledger
    found: Recovery
    newest: int
    first_start: bool
    moved: int | None  # the watermark moved into the window, if it was older
    instance: str = ""  # the server instance the query walked
    binding: Binding | None = None  # as stored before the query
    reset: bool = False  # a resync: the receipts of another instance are dropped
    losses: list[WindowLoss] = field(default_factory=list)  # ids it could not examine
    receipted: int = 0  # the highest checkpoint id the stored receipts reached
    holes: list[tuple[int, int]] = field(default_factory=list)  # what they had not below it

    def missed(self) -> Missed:
        """What the query reports: its losses first, then each missed key once."""
        return [*self.losses, *versions(self.found.missed)]


# The highest checkpoint id there is: a resync purges every range at or below it.
MAX_ID = 2**63 - 1
MAX_FAILURE = 1000  # characters of a failure a status report carries


class _Waiter(Generic[F]):
    """A receipt's future and how many checkpoints it still waits for."""

    __slots__ = ("future", "remaining")

    def __init__(self, future: F, remaining: int) -> None:
        self.future, self.remaining = future, remaining


def holes(stored: Stored) -> list[tuple[int, int]]:
    """The checkpoint ranges between the stored watermark and the receipts' end that
    no receipt holds."""
    found, after = [], stored.mark or 0
    for begin, end in sorted(stored.ranges):
        if begin > after + 1:
            found.append((after + 1, begin - 1))
        after = max(after, end)
    return found


def passed(binding: Binding, held: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Of the checkpoints ``binding``'s filter could pass (its unreceipted ranges and
    every id above its ``since``), those the receipts ``held`` now: what it may have
    receipted for the topics it left out, in maximal ranges
    (docs/semantics/recovery.md §3.4)."""
    could = sorted([*binding.unreceipted, (binding.since + 1, MAX_ID)])
    found: list[tuple[int, int]] = []
    for first, last in sorted(held):
        for low, high in could:
            begin, end = max(first, low), min(last, high)
            if begin > end:
                continue
            if found and found[-1][1] + 1 >= begin:
                found[-1] = (found[-1][0], max(found[-1][1], end))
            else:
                found.append((begin, end))
    return found


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
        self.topics: list[str] | None = None  # the source's filter, bound with the receipts
        # The topic the receipts themselves are written to (a TopicReceiptStore's): its
        # changes are this client's own writes, never reported to it
        # (docs/semantics/recovery.md §3.4).
        self.own: str | None = None
        self.instance = ""  # the server instance subscribed to
        # Why the service stopped, once it did: every later call says so.
        self.failure: RecoveryError | None = None
        self.on_watermark: Callable[[], None] | None = None  # told when the watermark moves
        # Per unpersisted checkpoint, the future of every receipt waiting for it alone
        # (shared: one object per checkpoint, not per receipt), and the receipts that
        # wait for it among others.
        self._futures: dict[int, F] = {}
        self._waiters: dict[int, list[_Waiter[F]]] = {}
        self._next_compress = clock.now_ms() + self.compress_interval_ms

    # --- the recovery query (docs/semantics/recovery.md §3.3) ----------------------------
    def stored(self) -> Io[Stored]:
        """The persisted watermark, the range receipts above it and the binding."""
        mark = yield (self.store.low_watermark, (self.client_id,))
        ranges = yield (_list_ranges, (self.store, self.client_id, mark or 0))
        binding = yield (self.store.binding, (self.client_id,))
        return Stored(mark, ranges, binding)

    def check(
        self, newest: int, instance: str, stored: Stored, *, resync: bool, new_filter: bool
    ) -> Checked:
        """Whether the stored receipts hold for this server and this filter. Another
        instance or ids gone backwards (docs/semantics/recovery.md §3.5) raise a
        :class:`RecoveryError` naming both sides, or with ``resync`` the receipts are to
        be dropped (a reset). Another filter (docs/semantics/recovery.md §3.4) raises
        one too, or with
        ``new_filter`` it is adopted, and what the receipts took implicitly of the topics
        it adds is a loss."""
        binding = stored.binding
        receipted = max([stored.mark or 0, *(end for _, end in stored.ranges)])
        if other := self._other_server(newest, instance, receipted, binding):
            if not resync:
                raise RecoveryError(
                    f"{other}. No answer "
                    "rather than a wrong one: re-process every key from its current state, "
                    "then resync (subscribe(..., resync=True); `waymark recovery missed "
                    "--resync` lists what this server's checkpoints name)"
                )
            return Checked(True, [], receipted)
        if binding is None or binding.topics == self.topics:
            return Checked(False, [], receipted, holes(stored))
        if not new_filter:
            raise RecoveryError(
                f"client {self.client_id!r} kept its receipts for {_topics(binding.topics)}, "
                f"but this run reads {_topics(self.topics)}: the changes of topics outside a "
                "filter count as receipted, so a new filter cannot see what the old one "
                "passed. Pass new_filter=True (--new-filter) to change it; the changes the "
                "receipts passed of the topics it adds are then reported lost"
            )
        old, new = binding.topics, self.topics
        adds = old is not None and (new is None or not set(new) <= set(old))
        losses = []
        if adds:
            held = [(1, stored.mark)] if stored.mark else []
            for first, last in passed(binding, [*held, *stored.ranges]):
                losses.append(WindowLoss(first, last, "filter_changed"))
        return Checked(False, losses, receipted, holes(stored))

    def _binding(self, query: Query) -> Binding:
        """The binding a run stores: what its filter may pass of the topics it leaves
        out (docs/semantics/recovery.md §3.4). A filter that follows another keeps what
        the first could pass, as its run may not have receipted it yet."""
        if query.first_start:
            return Binding(query.instance, self.topics, query.newest)
        if query.reset:
            return Binding(query.instance, self.topics, 0)
        old = query.binding
        if self.topics is not None and old is not None and old.topics is not None:
            return Binding(query.instance, self.topics, old.since, old.unreceipted)
        return Binding(query.instance, self.topics, query.receipted, query.holes)

    def _other_server(
        self, newest: int, instance: str, receipted: int, binding: Binding | None
    ) -> str | None:
        """Why the receipts do not count in this server's ids, if they do not."""
        bound = binding.instance if binding is not None else ""
        if bound and instance and bound != instance:
            return (
                f"client {self.client_id!r} receipted the change checkpoints of server "
                f"instance {bound}, but this server is instance {instance} (a new or "
                "replaced data directory): its checkpoint ids count from scratch"
            )
        if receipted > newest:
            return (
                f"checkpoint ids went backwards: client {self.client_id!r} receipted up to "
                f"checkpoint {receipted}, but the newest checkpoint of this server "
                f"(instance {instance or 'unknown'}) is {newest} (a data directory "
                "restored from a backup?)"
            )
        return None

    def walk(self, newest: int, stored: Stored, *, reset: bool = False) -> Walk | None:
        """The walk of the checkpoints back to :meth:`earliest_ms`; None on a first
        start, which reports nothing (docs/semantics/recovery.md §3.1). A reset walks
        as if nothing were receipted: every key of the window is missed."""
        recent = self.clock.now_ms() - self.recent_ms
        if reset:
            return Walk(Ledger(0), [], newest, recent)
        if stored.mark is None and not stored.ranges:
            return None
        return Walk(Ledger(stored.mark or 0), stored.ranges, newest, recent)

    def earliest_ms(self) -> int:
        return self.clock.now_ms() - self.max_window_ms

    def query(
        self,
        newest: int,
        walk: Walk | None,
        *,
        view: ServerView | None = None,
        stored: Stored | None = None,
        checked: Checked | None = None,
    ) -> Query:
        """The query's outcome once its walk ended (or ran out of checkpoints)."""
        view = view or ServerView()
        checked = checked or Checked(False, [], 0)
        reset = checked.reset
        binding = stored.binding if stored is not None else None
        if walk is None:
            return Query(Ledger(newest), Recovery(), newest, True, None, view.instance, binding)
        found = walk.done()
        moved = None
        losses: list[WindowLoss] = []
        if not found.reached:
            # What lies between the watermark and the walk's end is older than the
            # window: the watermark moves into it (docs/semantics/recovery.md §3.2).
            moved = newest if found.oldest is None else found.oldest - 1
            losses = window_losses(walk.ledger.low_watermark, moved, view)
            if moved <= walk.ledger.low_watermark:
                moved = None
        return Query(walk.ledger, found, newest, False, moved, view.instance, binding, reset,
                     [*checked.losses, *losses], checked.receipted, checked.holes)  # fmt: skip

    def start(self, query: Query, listener: CommittedVersionListener) -> Io[list[CommittedVersion]]:
        """Subscribe ``listener`` after ``query``: drop another instance's receipts on a
        resync, store the first or moved watermark and the binding, persist what the
        walk found receipted; the in-flight versions for the listener."""
        ledger = query.ledger
        client, store = self.client_id, self.store
        if query.reset:  # (the binding goes last: a crash in between resyncs again)
            yield (store.purge_before, (client, MAX_ID))
            yield (store.store_low_watermark, (client, 0))
        if query.first_start:
            yield (store.store_low_watermark, (client, query.newest))
        elif query.moved is not None:
            yield (store.store_low_watermark, (client, query.moved))
            ledger.advance(query.moved)
        binding = self._binding(query)
        if not binding.same(query.binding):
            yield (store.store_binding, (client, binding))
        self.instance = query.instance
        self.ledger, self.listener = ledger, listener
        yield from self.flush()  # checkpoints every key of which a newer receipt covers
        return [
            CommittedVersion(key, version, epoch)
            for checkpoint in query.found.recent
            for key, (epoch, version) in ledger.unreceipted(checkpoint.id)
        ]

    def visible(self, checkpoint: Checkpoint) -> Checkpoint:
        """``checkpoint`` without the changes of the receipt store's own topic: they
        count as receipted, like a filtered client's other topics
        (docs/semantics/recovery.md §3.4)."""
        own = self.own
        if own is None or not any(key_topic(c.key) == own for c in checkpoint.changes):
            return checkpoint
        changes = [c for c in checkpoint.changes if key_topic(c.key) != own]
        return msgspec.structs.replace(checkpoint, changes=changes)

    def offer(self, checkpoint: Checkpoint) -> tuple[list[CommittedVersion], bool]:
        """A new checkpoint from the source: its versions for the listener, and whether
        to :meth:`flush` (nothing of it passes the filter: receipted at once). One of
        another server instance stops the service (docs/semantics/recovery.md §3.5)."""
        ledger = self.ledger
        if ledger is None or self.listener is None or self.failure is not None:
            return [], False
        if checkpoint.instance and self.instance and checkpoint.instance != self.instance:
            self.fail(RecoveryError(
                f"checkpoint {checkpoint.id} comes from server instance "
                f"{checkpoint.instance}, but client {self.client_id!r} follows instance "
                f"{self.instance} (a new or replaced data directory): stopped rather than "
                "skip its checkpoints; subscribe again (with resync=True once every key "
                "is re-processed)"
            ))  # fmt: skip
            return [], False
        checkpoint = self.visible(checkpoint)
        if not ledger.add(checkpoint):
            return [], False
        fresh = ledger.unreceipted(checkpoint.id)
        return [CommittedVersion(key, v, epoch) for key, (epoch, v) in fresh], not fresh

    # --- receipts (docs/semantics/recovery.md §2.1) --------------------------------------
    def receipt(
        self, key: str | CommittedVersion, version: int | None, epoch: int | None
    ) -> tuple[F, bool, Lookup | None]:
        """The receipt's future, whether to :meth:`flush` for it, and what to ask the
        log when no checkpoint this service saw names the key (then the future waits
        for :meth:`looked_up`)."""
        ledger = self.ledger
        if ledger is None:
            return (
                self._failed(RecoveryError("subscribe first: no version is known yet")),
                False,
                None,
            )
        if self.failure is not None:
            return self._failed(self.failure), False, None
        try:
            key, version, epoch = self._checked(key, version, epoch)
            hit = ledger.receipt(key, (epoch, version))
        except RecoveryError as exc:
            return self._failed(exc), False, None
        if hit is None:
            return self.new_future(), False, Lookup(key, version, epoch)
        waiting = [c for c in hit if not ledger.persisted(c)]
        if not waiting:
            done = self.new_future()
            done.set_result(None)
            return done, False, None
        if len(waiting) == 1:  # the common case: one checkpoint's shared future
            future = self._futures.get(waiting[0])
            if future is None:
                future = self._futures[waiting[0]] = self.new_future()
        else:
            future = self.new_future()
            waiter = _Waiter(future, len(waiting))
            for checkpoint in waiting:
                self._waiters.setdefault(checkpoint, []).append(waiter)
        return future, ledger.has_ready(), None

    def _checked(
        self, key: str | CommittedVersion, version: int | None, epoch: int | None
    ) -> tuple[str, int, int]:
        """A receipt's key, version and epoch, or a RecoveryError saying what is wrong
        (docs/semantics/recovery.md §2.1)."""
        if isinstance(key, CommittedVersion):
            if version is not None or epoch is not None:
                raise RecoveryError("a CommittedVersion is a whole receipt: pass it alone")
            committed = key
            key, version, epoch = committed.key, committed.version, committed.epoch
        if not isinstance(key, str) or not key:
            raise RecoveryError(f"a key is '<topic>/<tag>' or '<topic>', got {key!r}")
        for name, value in (("version", version), ("epoch", epoch)):
            if type(value) is not int:  # (not a bool, a float, a string)
                raise RecoveryError(f"the {name} is an integer, got {value!r}")
        assert isinstance(version, int) and isinstance(epoch, int)
        if version < 1:
            raise RecoveryError(f"a version is a seq, 1 or more: got {version}")
        if epoch < 0:
            raise RecoveryError(f"an epoch is 0 or more: got {epoch}")
        topic = key_topic(key)
        if topic == self.own:
            raise RecoveryError(
                f"{key!r}: topic {topic!r} holds this client's receipts; its changes are "
                "the client's own writes, never reported to it"
            )
        if self.topics is not None and topic not in self.topics:
            raise RecoveryError(
                f"{key!r}: this client does not read topic {topic!r} (its topics are "
                f"{', '.join(self.topics)}); their changes are receipted implicitly"
            )
        return key, version, epoch

    def looked_up(self, future: F, lookup: Lookup, refusal: str | None) -> None:
        """What the log said of a receipt of a key no checkpoint this service saw names:
        ``refusal`` None, the version is committed and nothing held waits for it (a
        receipt persisted before a restart, again: idempotent)."""
        if future.done():
            return
        if refusal is None:
            future.set_result(None)
        else:
            future.set_exception(RecoveryError(refusal))

    def fail(self, error: RecoveryError) -> None:
        """Stop the service (docs/semantics/recovery.md §3.6): no checkpoint reaches the
        listener any more, every receipt waiting for a checkpoint fails with ``error``
        and so does every later call."""
        if self.failure is None:
            self.failure = error
        for future in self._futures.values():
            if not future.done():
                future.set_exception(error)
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(error)
        self._futures.clear()
        self._waiters.clear()

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
        failure = None if self.failure is None else str(self.failure)
        return Status(mark, sorted(ranges), pending, versions(query.found.missed), failure)

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
        failed = None if self.failure is None else str(self.failure)[:MAX_FAILURE]
        return RecoveryReport(self.client_id, mark, ranges, pending, interval_ms, failed)


def listener_failed(client: str, committed: CommittedVersion, exc: Exception) -> RecoveryError:
    """Why a service stopped when its listener raised (docs/recovery.md)."""
    return RecoveryError(
        f"the listener raised {type(exc).__name__}: {exc} (on {committed}): client "
        f"{client!r} stopped; subscribe again once it is fixed, the keys it did not "
        "receipt are reported then"
    )


def source_failed(client: str, exc: BaseException) -> RecoveryError:
    """Why a service stopped when its source could follow new checkpoints no longer."""
    return RecoveryError(
        f"following new change checkpoints failed: {exc}: client {client!r} stopped; "
        "subscribe again"
    )


def window_losses(mark: int, below: int, view: ServerView) -> list[WindowLoss]:
    """The checkpoints above ``mark`` up to ``below`` that a walk could not examine, by
    reason (docs/semantics/recovery.md §3.2): those the server's window removed, and
    those older than the service's window. Ids neither holds never held a checkpoint (a
    crash skips some): no loss is reported for them."""
    losses = []
    first = mark + 1
    if min(view.expired_to, below) >= first:
        losses.append(WindowLoss(first, min(view.expired_to, below), "expired"))
        first = view.expired_to + 1
    if min(view.older, below) >= first:
        losses.append(WindowLoss(first, min(view.older, below), "outside_window"))
    return losses


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
