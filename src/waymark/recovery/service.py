"""``RecoveryService``: receipts in, "what did I miss?" out
(docs/semantics/recovery.md §2, §3).

The service holds the checkpoints its client has not finished in a
:class:`~waymark.recovery.ledger.Ledger`, persists a checkpoint's receipt through the
:class:`~waymark.recovery.store.ReceiptStore` once every key in it is receipted, and
moves the low watermark behind them. A receipt's future resolves once every
checkpoint it completes or contributes to is persisted. The bookkeeping is
:class:`~waymark.recovery.core.ServiceCore`, shared with the asyncio twin
(:class:`~waymark.recovery.aio.AsyncRecoveryService`); this class runs its store calls
in place, under a lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future

from ..client import Client
from ..clock import Clock, SystemClock
from ..protocol import Checkpoint, RecoveryReport
from .core import Query, ServiceCore, Status, listener_failed, run, source_failed
from .report import reporter_for
from .store import ReceiptStore
from .topicstore import TopicReceiptStore
from .types import (
    CheckpointSource,
    CommittedVersion,
    CommittedVersionListener,
    Missed,
    RecoveryError,
    WindowLoss,
)

log = logging.getLogger("waymark.recovery")


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
        report_to: Client | str | None = None,
        report_every_s: float = 5.0,
        report: bool = True,
    ) -> None:
        """``report_to`` (a server's URL or a client) gets this client's status every
        ``report_every_s`` seconds (docs/reports.md); a :class:`TopicReceiptStore`'s
        server gets it by default. ``report=False`` sends none."""
        self.source, self.store, self.client_id = source, store, client_id
        self.core: ServiceCore[Future[None]] = ServiceCore(
            store, client_id, recent_s=recent_s, max_window_s=max_window_s,
            compress_interval_s=compress_interval_s, clock=clock or SystemClock(),
            new_future=Future,
        )  # fmt: skip
        self.core.topics = sorted(source.topics) if source.topics is not None else None
        self.core.own = store.topic if isinstance(store, TopicReceiptStore) else None
        self._lock = threading.RLock()
        self.reporter = reporter_for(report_to, store, self._report, report_every_s, report)
        if self.reporter is not None:
            self.core.on_watermark = self.reporter.poke

    # --- the recovery query (docs/semantics/recovery.md §3.3) ----------------------------------
    def _query(self, resync: bool = False, new_filter: bool = False) -> Query:
        core = self.core
        newest = self.source.newest_id()
        stored = run(core.stored())
        checked = core.check(newest, self.source.view().instance, stored, resync=resync,
                             new_filter=new_filter)  # fmt: skip
        walk = core.walk(newest, stored, reset=checked.reset)
        if walk is not None:
            for checkpoint in self.source.request_checkpoints(core.earliest_ms()):
                if not walk.step(core.visible(checkpoint)):
                    break
        return core.query(newest, walk, view=self.source.view(), stored=stored, checked=checked)

    def missed(self, *, resync: bool = False, new_filter: bool = False) -> Missed:
        """The recovery query alone: keys never receipted with their newest version,
        each once, after a :class:`WindowLoss` for each range of checkpoints it could
        not examine (docs/semantics/recovery.md §3.2); nothing is written and nothing
        subscribed. Raises
        :class:`RecoveryError` if the receipts are of another server instance or ids
        went backwards; ``resync`` then reports every key the server's checkpoints
        name instead (docs/semantics/recovery.md §3.5)."""
        return self._query(resync, new_filter).missed()

    def subscribe(
        self,
        listener: CommittedVersionListener,
        *,
        resync: bool = False,
        new_filter: bool = False,
    ) -> Iterator[CommittedVersion | WindowLoss]:
        """The committed versions this client never receipted (each key once, at its
        newest version), after a :class:`WindowLoss` for each range of checkpoints the
        query could not examine (reported once: the watermark then moves past it), then
        every later version through ``listener`` (docs/semantics/recovery.md §3.3).

        ``resync``: if the receipts are of another server instance (or ids went
        backwards), drop them and report every key this server's checkpoints name
        (docs/semantics/recovery.md §3.5); without it, that case raises
        :class:`RecoveryError`. ``new_filter``: the source's topics differ from those
        the receipts were kept for; adopt them, reporting what the old filter passed of
        the topics added as a :class:`WindowLoss` (docs/semantics/recovery.md §3.4);
        without it, refused."""
        with self._lock:
            query = self._query(resync, new_filter)
            in_flight = run(self.core.start(query, listener))
            self.source.register_checkpoint_listener(
                self.receive_checkpoint, query.newest, self._source_failed
            )
            if self.reporter is not None:
                self.reporter.start()
        self._deliver(in_flight)
        return self._reported(query.missed())

    def _reported(self, found: Missed) -> Iterator[CommittedVersion | WindowLoss]:
        """``found``, one at a time; raises the service's failure once it stopped."""
        for item in found:
            if self.core.failure is not None:
                raise self.core.failure
            yield item

    @property
    def failure(self) -> RecoveryError | None:
        """Why the service stopped (docs/semantics/recovery.md §3.6); None while it runs."""
        return self.core.failure

    def receive_checkpoint(self, checkpoint: Checkpoint) -> None:
        """A new checkpoint from the source: its versions go to the listener."""
        with self._lock:
            fresh, flush = self.core.offer(checkpoint)
            if flush:
                run(self.core.flush())
        self._deliver(fresh)

    def _deliver(self, versions: list[CommittedVersion]) -> None:
        """Hand ``versions`` to the listener; one that raises stops the service
        (docs/semantics/recovery.md §3.6): never a dead thread and a service that goes
        on taking receipts."""
        listener = self.core.listener
        for committed in versions:
            if self.core.failure is not None:
                return
            assert listener is not None
            try:
                listener(committed)
            except Exception as exc:
                self._fail(listener_failed(self.client_id, committed, exc), exc)
                return

    def _source_failed(self, exc: BaseException) -> None:
        """The source can follow new checkpoints no longer (its server refused, or
        stayed unreachable): the service stops."""
        self._fail(source_failed(self.client_id, exc), exc)

    def _fail(self, error: RecoveryError, cause: BaseException) -> None:
        error.__cause__ = cause
        log.error("%s", error, exc_info=cause)
        with self._lock:
            self.core.fail(error)
        if self.reporter is not None:
            self.reporter.poke()

    # --- receipts (docs/semantics/recovery.md §2.1) --------------------------------------------
    def submit_receipt(
        self, key: str | CommittedVersion, version: int | None = None, epoch: int | None = None
    ) -> Future[None]:
        """Receipt ``key`` up to ``version`` of topic instance ``epoch``: the
        :class:`CommittedVersion` the listener got, or its three parts. Idempotent, also
        after a restart; the future fails with :class:`RecoveryError` saying why if the
        receipt cannot be right (not an integer version, an epoch or a version the key
        never had, a key no checkpoint names, a topic this client does not read,
        docs/semantics/recovery.md §2.1) or could not be persisted, and resolves once
        every checkpoint naming the key up to that version has its receipt persisted."""
        with self._lock:
            future, flush, lookup = self.core.receipt(key, version, epoch)
            if flush:
                run(self.core.flush())
        if lookup is not None:
            refusal = self.source.committed(lookup.key, lookup.version, lookup.epoch)
            self.core.looked_up(future, lookup, refusal)
        return future

    # --- compression (docs/semantics/recovery.md §4.2) -----------------------------------------
    def compress(self) -> int:
        """Merge contiguous range receipts and purge the ones merged; returns how many
        were purged."""
        with self._lock:
            return run(self.core.compress())

    def status(self) -> Status:
        return run(self.core.status(self._query()))

    def _report(self) -> RecoveryReport | None:
        """This client's status for the server (None before :meth:`subscribe`)."""
        assert self.reporter is not None
        with self._lock:
            return run(self.core.report(self.reporter.every_s))

    def close(self) -> None:
        if self.reporter is not None:
            self.reporter.close()
        self.source.close()
