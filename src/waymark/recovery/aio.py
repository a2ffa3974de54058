"""The asyncio twin of :class:`~waymark.recovery.RecoveryService`
(docs/recovery.md, "asyncio").

``AsyncRecoveryService`` keeps the same bookkeeping, :class:`~.core.ServiceCore`, over
an asyncio checkpoint source (``AsyncTopicCheckpoints``, on the
:class:`~waymark.client.AsyncClient`). Receipts return ``asyncio.Future`` objects at
once; the store writes they complete run in a worker thread, one step at a time, so
the event loop never waits on a disk sync. Any
:class:`~waymark.recovery.ReceiptStore` serves (``LocalReceiptStore``,
``TopicReceiptStore``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from ..client import ApiError, AsyncClient, Client, TransportError
from ..clock import Clock, SystemClock
from ..protocol import Checkpoint, ErrorCode, RecoveryReport, key_topic
from .core import Io, Lookup, Query, ServiceCore, Status, T, listener_failed, source_failed
from .report import reporter_for
from .source import PAGE, check_topics, refusal
from .store import ReceiptStore
from .topicstore import TopicReceiptStore
from .types import (
    CheckpointListener,
    CommittedVersion,
    CommittedVersionListener,
    Missed,
    RecoveryError,
    ServerView,
)

log = logging.getLogger("waymark.recovery")


class AsyncCheckpointSource(Protocol):
    """Where change checkpoints come from, for asyncio (docs/semantics/recovery.md §1.5)."""

    @property
    def topics(self) -> Sequence[str] | None:
        """The topics whose changes it hands out, None for all."""
        ...

    async def newest_id(self) -> int:
        """The newest checkpoint's id (0: none yet)."""
        ...

    def view(self) -> ServerView:
        """What the last answers said of the server (as ``CheckpointSource.view``)."""
        ...

    def request_checkpoints(self, earliest_ms: int) -> AsyncIterator[Checkpoint]:
        """Checkpoints back to time ``earliest_ms``, newest first."""
        ...

    async def committed(self, key: str, version: int, epoch: int) -> str | None:
        """As ``CheckpointSource.committed``."""
        ...

    def register_checkpoint_listener(
        self,
        listener: CheckpointListener,
        after: int,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Call ``listener`` with every checkpoint whose id is above ``after``, in id
        order, from now on (on the running loop); ``on_error`` with what ended that."""
        ...

    async def aclose(self) -> None: ...


class AsyncTopicCheckpoints:
    """The checkpoints of the server at ``url`` over the asyncio client; only the changes
    of ``topics`` when given (docs/semantics/recovery.md §3.4)."""

    def __init__(
        self,
        url: str,
        topics: Sequence[str] | None = None,
        *,
        client: AsyncClient | None = None,
        token: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        """``token`` and ``ca_file`` go to every connection it opens: its queries' (unless
        ``client`` is given) and each listener's stream (docs/security.md)."""
        self.url = url
        self.topics = list(topics) if topics else None
        self._token, self._ca_file = token, ca_file
        self.client = client or AsyncClient(url, token=token, ca_file=ca_file)
        self._follows: list[tuple[AsyncClient, asyncio.Task[None]]] = []
        self._view = ServerView()

    async def newest_id(self) -> int:
        for topic in self.topics or ():  # one cheap look each; the list only on a miss
            try:
                await self.client.get_topic(topic, touch=False)
            except ApiError as exc:
                if exc.code != ErrorCode.TOPIC_NOT_FOUND:
                    raise
                check_topics(self.url, self.topics or (),
                             [t.name for t in await self.client.list_topics()])  # fmt: skip
        page = await self.client.list_checkpoints(limit=1)
        self._view = ServerView(page.instance, page.expired_to)
        # (the newest may have expired with the rest: its id is still the newest one)
        return max(page.checkpoints[0].id if page.checkpoints else 0, page.expired_to)

    def view(self) -> ServerView:
        return self._view

    async def request_checkpoints(self, earliest_ms: int) -> AsyncIterator[Checkpoint]:
        before: int | None = None
        while True:
            page = await self.client.list_checkpoints(
                earliest_ms=earliest_ms, before=before, limit=PAGE, topics=self.topics
            )
            self._view = ServerView(page.instance, page.expired_to, page.older)
            for checkpoint in page.checkpoints:
                yield checkpoint
            if page.next_before is None:
                return
            before = page.next_before

    async def committed(self, key: str, version: int, epoch: int) -> str | None:
        topic = key_topic(key)
        try:
            state = await self.client.get_topic(topic, touch=False)
        except ApiError as exc:
            if exc.code != ErrorCode.TOPIC_NOT_FOUND:
                raise
            return refusal(key, version, epoch, None, None)
        found = None
        if version <= state.head_seq:
            page = await self.client.diff(topic, version - 1, limit=1)
            found = page.records[0] if page.records else None
        return refusal(key, version, epoch, state, found)

    def register_checkpoint_listener(
        self,
        listener: CheckpointListener,
        after: int,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Follow new checkpoints over SSE in a task of the running loop, until
        :meth:`aclose`; what ends it otherwise goes to ``on_error``."""
        watcher = AsyncClient(self.url, token=self._token, ca_file=self._ca_file)

        async def follow() -> None:
            try:
                async for checkpoint in watcher.watch_checkpoints(after=after,
                                                                  topics=self.topics):  # fmt: skip
                    listener(checkpoint)
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(exc)

        self._follows.append((watcher, asyncio.create_task(follow(), name="waymark-checkpoints")))

    async def aclose(self) -> None:
        for watcher, task in self._follows:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TransportError):
                await task
            await watcher.aclose()
        await self.client.aclose()


def _future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


class AsyncRecoveryService:
    """Receipts and recovery for one client over an asyncio checkpoint source; for one
    event loop. The same parameters and meaning as
    :class:`~waymark.recovery.RecoveryService`."""

    def __init__(
        self,
        source: AsyncCheckpointSource,
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
        self.source, self.store, self.client_id = source, store, client_id
        self.core: ServiceCore[asyncio.Future[None]] = ServiceCore(
            store, client_id, recent_s=recent_s, max_window_s=max_window_s,
            compress_interval_s=compress_interval_s, clock=clock or SystemClock(),
            new_future=_future,
        )  # fmt: skip
        self.core.topics = sorted(source.topics) if source.topics is not None else None
        self.core.own = store.topic if isinstance(store, TopicReceiptStore) else None
        # One step of the bookkeeping at a time: a flush awaits the store, and the
        # receipts arriving meanwhile wait for the next one.
        self._lock = asyncio.Lock()
        self._flushes: set[asyncio.Task[None]] = set()
        # Reports go from the reporter's thread; the status is taken on the loop.
        self.reporter = reporter_for(report_to, store, self._report, report_every_s, report)
        self._loop: asyncio.AbstractEventLoop | None = None
        if self.reporter is not None:
            self.core.on_watermark = self.reporter.poke

    async def _run(self, io: Io[T]) -> T:
        """Run ``io``'s store calls in a worker thread, one after another."""
        try:
            op = next(io)
            while True:
                call, args = op
                try:
                    result = await asyncio.to_thread(call, *args)
                except Exception as exc:
                    op = io.throw(exc)
                else:
                    op = io.send(result)
        except StopIteration as stop:
            return stop.value

    # --- the recovery query (docs/semantics/recovery.md §3.3) ----------------------------
    async def _query(self, resync: bool = False, new_filter: bool = False) -> Query:
        core = self.core
        newest = await self.source.newest_id()
        stored = await self._run(core.stored())
        checked = core.check(newest, self.source.view().instance, stored, resync=resync,
                             new_filter=new_filter)  # fmt: skip
        walk = core.walk(newest, stored, reset=checked.reset)
        if walk is not None:
            async for checkpoint in self.source.request_checkpoints(core.earliest_ms()):
                if not walk.step(core.visible(checkpoint)):
                    break
        return core.query(newest, walk, view=self.source.view(), stored=stored, checked=checked)

    async def missed(self, *, resync: bool = False, new_filter: bool = False) -> Missed:
        """The recovery query alone; nothing is written and nothing subscribed
        (``resync`` as :meth:`RecoveryService.missed`)."""
        return (await self._query(resync, new_filter)).missed()

    async def subscribe(
        self,
        listener: CommittedVersionListener,
        *,
        resync: bool = False,
        new_filter: bool = False,
    ) -> Missed:
        """The committed versions this client never receipted (each key once, at its
        newest version), after its window losses; every later one goes to
        ``listener``, called on the loop (``resync`` as
        :meth:`RecoveryService.subscribe`)."""
        async with self._lock:
            query = await self._query(resync, new_filter)
            in_flight = await self._run(self.core.start(query, listener))
            self.source.register_checkpoint_listener(
                self.receive_checkpoint, query.newest, self._source_failed
            )
            if self.reporter is not None:
                self._loop = asyncio.get_running_loop()
                self.reporter.start()
        self._deliver(in_flight)
        return query.missed()

    @property
    def failure(self) -> RecoveryError | None:
        """Why the service stopped (docs/semantics/recovery.md §3.6); None while it runs."""
        return self.core.failure

    def receive_checkpoint(self, checkpoint: Checkpoint) -> None:
        """A new checkpoint from the source: its versions go to the listener."""
        fresh, flush = self.core.offer(checkpoint)
        if flush:
            self._flush_soon()
        self._deliver(fresh)

    def _deliver(self, versions: list[CommittedVersion]) -> None:
        """As :meth:`RecoveryService._deliver`: a listener that raises stops the service."""
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
        self._fail(source_failed(self.client_id, exc), exc)

    def _fail(self, error: RecoveryError, cause: BaseException) -> None:
        error.__cause__ = cause
        log.error("%s", error, exc_info=cause)
        self.core.fail(error)
        if self.reporter is not None:
            self.reporter.poke()

    # --- receipts (docs/semantics/recovery.md §2.1) --------------------------------------
    def submit_receipt(
        self, key: str | CommittedVersion, version: int | None = None, epoch: int | None = None
    ) -> asyncio.Future[None]:
        """Receipt ``key`` up to ``version`` of topic instance ``epoch`` (or the
        :class:`CommittedVersion` itself); returns at once. The future resolves once
        every checkpoint naming the key up to that version has its receipt persisted,
        and fails with :class:`~waymark.recovery.RecoveryError` as
        :meth:`RecoveryService.submit_receipt`'s does."""
        future, flush, lookup = self.core.receipt(key, version, epoch)
        if flush:
            self._flush_soon()
        if lookup is not None:
            task = asyncio.create_task(self._look_up(future, lookup))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)
        return future

    async def _look_up(self, future: asyncio.Future[None], lookup: Lookup) -> None:
        refusal = await self.source.committed(lookup.key, lookup.version, lookup.epoch)
        self.core.looked_up(future, lookup, refusal)

    def _flush_soon(self) -> None:
        task = asyncio.create_task(self._flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self) -> None:
        async with self._lock:
            ledger = self.core.ledger
            if ledger is not None and ledger.has_ready():  # (an earlier flush took them)
                await self._run(self.core.flush())

    async def compress(self) -> int:
        """Merge contiguous range receipts and purge the ones merged."""
        async with self._lock:
            return await self._run(self.core.compress())

    async def status(self) -> Status:
        return await self._run(self.core.status(await self._query()))

    def _report(self) -> RecoveryReport | None:
        """This client's status for the server, from the reporter's thread (docs/reports.md)."""
        loop, reporter = self._loop, self.reporter
        if loop is None or reporter is None or loop.is_closed():
            return None
        return asyncio.run_coroutine_threadsafe(
            self._status_report(reporter.every_s), loop
        ).result()

    async def _status_report(self, every_s: float) -> RecoveryReport | None:
        async with self._lock:
            return await self._run(self.core.report(every_s))

    async def aclose(self) -> None:
        """Wait for the flushes under way, stop reporting, then close the source."""
        if self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
        if self.reporter is not None:  # its thread may wait for the loop: keep it running
            await asyncio.to_thread(self.reporter.close)
        await self.source.aclose()
