"""The shipper: deliver a topic to an HTTP collector, many batches in flight.

One diff page of the topic is one batch, and its checkpoint is the page's
``next_from_seq``: the diff cursor, i.e. the last shipped ``$seq``. Batches go
through the ordered :class:`~waymark.checkpoint.Tracker`, so however the collector
orders its acks, the committed checkpoint never passes an unresolved batch and a
restart resumes from it (at least once: the collector deduplicates by ``$seq``).

- 2xx acks the batch.
- 408, 429, 5xx and transport errors are transient: the batch is retried with
  capped exponential backoff and jitter, and holds the checkpoint meanwhile.
- Any other 4xx (413, ...) rejects the batch for good: each of its records is first
  written to the dead-letter topic, then the checkpoint moves past it.

Stopping (a signal, or ``once`` reaching the head seen at start) creates no new
batch, lets the POSTs on the wire finish, gives up batches waiting for a retry
(their data is read again after restart) and saves the final checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import httpx
import msgspec
import orjson

from waymark.checkpoint.errors import CheckpointError
from waymark.checkpoint.shipstats import ShipStats, append_gap, write_status
from waymark.checkpoint.store import CheckpointStore
from waymark.checkpoint.tickets import QueuedTicket, SendingTicket
from waymark.checkpoint.tracker import Tracker
from waymark.checkpoint.verdict import Verdict, verdict
from waymark.client import (
    ApiError,
    AsyncClient,
    DiffResponse,
    Record,
    RecordIn,
    Tombstone,
    TransportError,
)
from waymark.clock import Backoff, Clock, SystemClock
from waymark.protocol import MAX_DIFF_LIMIT

log = logging.getLogger("waymark.ship")
T = TypeVar("T")

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ShipConfig:
    """Everything ``waymark ship`` takes on its command line."""

    url: str
    topic: str
    to: str
    state_dir: Path
    in_flight: int = 8
    batch_records: int = 500
    dead_letter: str | None = None
    once: bool = False
    wait_ms: int = 5_000
    save_interval_s: float = 0.2
    backoff: Backoff = field(default_factory=Backoff)
    # How long one call may keep failing (the waymark API, a batch's POST) before the
    # shipper gives up and stops with RetriesExhausted (docs/checkpoint.md#shipper).
    # As Kafka's delivery.timeout.ms: 120 s by default.
    retry_budget_s: float = 120.0
    post_timeout_s: float = 30.0
    # A server with tokens or TLS (docs/security.md); the token never shows in a repr.
    token: str | None = field(default=None, repr=False)
    ca_file: str | None = None

    @property
    def dead_letter_topic(self) -> str:
        return self.dead_letter or f"{self.topic}.dead-letter"


class _Outgoing(msgspec.Struct):
    """The body POSTed to the collector."""

    topic: str
    records: list[Record]


class _Incoming(msgspec.Struct):
    """The same body read back with each record as its raw JSON slice (for dead-lettering)."""

    records: list[msgspec.Raw]


@dataclass(slots=True)
class _Batch:
    body: bytes
    first_seq: int
    last_seq: int
    count: int


class _SeqOnly(msgspec.Struct):
    seq: int = msgspec.field(name="$seq")


class _Stopped(Exception):
    """Stop was requested while waiting."""


class RetriesExhausted(CheckpointError):
    """A call kept failing for longer than ``retry_budget_s``: the shipper stopped,
    its checkpoint below every batch not acked (read again after a restart)."""


_encode_outgoing = msgspec.json.Encoder().encode
_decode_incoming = msgspec.json.Decoder(_Incoming).decode
_decode_seq = msgspec.json.Decoder(_SeqOnly).decode


class Shipper:
    """Ships one topic; ``run()`` returns when it has stopped and saved its checkpoint.

    ``sleep`` and ``rng`` drive the retry backoff, so tests can retry without waiting.
    Drive one shipper from one asyncio loop (the tracker is single-threaded).
    """

    def __init__(
        self,
        config: ShipConfig,
        *,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        clock: Clock | None = None,
    ) -> None:
        if config.in_flight < 1 or config.batch_records < 1:
            raise ValueError("in_flight and batch_records must be at least 1")
        self.config = config
        self.stats = ShipStats(config.topic)
        self.state = "starting"
        self.store = CheckpointStore(config.state_dir / "checkpoints.json")
        self.tracker: Tracker[list[int]] = Tracker()  # checkpoints: [topic epoch, seq]
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._clock = clock or SystemClock()
        self._stop = asyncio.Event()
        self._finished = asyncio.Event()
        self._slots = asyncio.Semaphore(config.in_flight)
        self._deliveries: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self._saved_version = -1
        # One diff per batch would make reading the bottleneck: read enough for every
        # slot at once (within the server's page limit) and cut it into batches.
        self._page_records = min(MAX_DIFF_LIMIT, config.batch_records * config.in_flight)

    def request_stop(self) -> None:
        """Begin a clean stop (safe to call more than once, from a signal handler)."""
        if not self._stop.is_set():
            log.info("stop requested: draining in-flight batches")
        self._stop.set()

    async def run(self) -> ShipStats:
        config = self.config
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.tracker = Tracker(self.store.load())
        committed = self.tracker.committed(config.topic)
        # A checkpoint is [topic epoch, seq]: a restart presents the epoch with its cursor,
        # so a topic deleted and recreated meanwhile reads as a tombstone, never silently.
        epoch, cursor = committed.checkpoint if committed is not None else (None, 0)
        self.stats.committed_seq = self.stats.read_seq = cursor
        limits = httpx.Limits(
            max_connections=config.in_flight, max_keepalive_connections=config.in_flight
        )
        async with (
            AsyncClient(config.url, token=config.token, ca_file=config.ca_file) as self._waymark,
            httpx.AsyncClient(limits=limits, timeout=config.post_timeout_s) as self._collector,
        ):
            saver = asyncio.create_task(self._save_loop())
            self.state = "running"
            try:
                await self._read_loop(cursor, epoch)
                self.state = "draining"
                while self._deliveries:
                    await asyncio.wait(set(self._deliveries))
                if self._failure is None:
                    await self.tracker.drain()
            finally:
                # Only reached with deliveries left on a cancel (a second signal): each
                # cancelled delivery abandons its batch, so the checkpoint stays below it.
                for task in self._deliveries:
                    task.cancel()
                await asyncio.gather(*self._deliveries, return_exceptions=True)
                self._finished.set()
                await saver
                self.state = "stopped"
                write_status(config.state_dir / "status.json", self.stats, self.state)
        if self._failure is not None:
            raise self._failure
        return self.stats

    # -- reading ---------------------------------------------------------------

    async def _read_loop(self, cursor: int, epoch: int | None) -> None:
        config, stats = self.config, self.stats
        target: int | None = None
        try:
            if config.once:
                state = await self._waymark_call(
                    partial(self._waymark.get_topic, config.topic, touch=False)
                )
                target = stats.head_seq = state.head_seq
            while target is None or cursor < target:
                if self._stop.is_set():
                    return
                wait_ms = 0 if config.once else config.wait_ms
                page: DiffResponse = await self._waymark_call(
                    partial(
                        self._waymark.diff,
                        config.topic,
                        cursor,
                        limit=self._page_records,
                        epoch=epoch,
                        wait_ms=wait_ms,
                    )
                )
                epoch, stats.head_seq = page.epoch, page.head_seq
                if page.tombstone is not None:
                    self._record_gap(page.tombstone)
                if page.next_from_seq == cursor:
                    continue  # a long-poll that timed out
                await self._dispatch_page(page)
                cursor = stats.read_seq = page.next_from_seq
        except _Stopped:
            return

    async def _dispatch_page(self, page: DiffResponse) -> None:
        """Cut a page into batches of ``batch_records``, each sent once it gets a slot.

        A batch's checkpoint is its last record's seq; the page's last batch takes the
        page's cursor, which may lie beyond it (evicted or filtered seqs).
        """
        size, records = self.config.batch_records, page.records
        if not records:
            # The cursor moved over evicted or filtered seqs only: nothing to post, but
            # the batch keeps its place in the order so the checkpoint can pass it.
            point = [page.epoch, page.next_from_seq]
            self.tracker.create_batch(self.config.topic, point).begin_send().ack()
            return
        self.stats.records_read += len(records)
        for start in range(0, len(records), size):
            chunk = records[start : start + size]
            end = start + size >= len(records)
            await self._until_stop(self._slots.acquire())
            ticket = self.tracker.create_batch(
                self.config.topic, [page.epoch, page.next_from_seq if end else chunk[-1].seq]
            )
            body = _encode_outgoing(_Outgoing(self.config.topic, chunk))
            batch = _Batch(body, chunk[0].seq, chunk[-1].seq, len(chunk))
            task = asyncio.create_task(self._deliver(batch, ticket))
            self._deliveries.add(task)
            task.add_done_callback(self._delivered)

    def _give_up(self, exhausted: RetriesExhausted) -> None:
        """Stop: the retry budget is spent. run() raises it once the rest drained."""
        log.error("%s", exhausted)
        self._failure = self._failure or exhausted
        self._stop.set()

    def _delivered(self, task: asyncio.Task[None]) -> None:
        self._deliveries.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            # A bug, not a delivery outcome: stop rather than carry on past it.
            log.error("delivery failed unexpectedly", exc_info=error)
            self._failure = self._failure or error
            self._stop.set()

    def _record_gap(self, tomb: Tombstone) -> None:
        stats = self.stats
        stats.tombstones += 1
        stats.gap_records += tomb.missed_estimate
        log.warning(
            "tombstone in %s: seqs %d..%d lost before they were read (%s, ~%d records)",
            self.config.topic, tomb.gap_from, tomb.gap_to, tomb.reason, tomb.missed_estimate,
        )  # fmt: skip
        append_gap(
            self.config.state_dir / "gaps.jsonl",
            {
                "topic": self.config.topic,
                "gap_from": tomb.gap_from,
                "gap_to": tomb.gap_to,
                "reason": tomb.reason,
                "missed_estimate": tomb.missed_estimate,
                "seen_ms": self._clock.now_ms(),
            },
        )

    # -- delivering ------------------------------------------------------------

    async def _deliver(self, batch: _Batch, queued: QueuedTicket[list[int]]) -> None:
        stats = self.stats
        ticket: QueuedTicket[list[int]] | SendingTicket[list[int]] | None = queued
        failing_since: int | None = None
        try:
            while True:
                sending = ticket = queued.begin_send()
                status, reason = await self._post(batch.body)
                outcome = verdict(status) if status else Verdict.TRANSIENT
                if outcome is Verdict.ACK:
                    ticket = None
                    sending.ack()
                    stats.batches_acked += 1
                    stats.records_acked += batch.count
                    return
                if outcome is Verdict.REJECT:
                    await self._dead_letter(batch, status, reason)
                    ticket = None
                    sending.reject()
                    stats.batches_rejected += 1
                    return
                queued = ticket = sending.fail()
                now = self._clock.now_ms()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= self.config.retry_budget_s * 1000:
                    raise RetriesExhausted(
                        f"collector {self.config.to}: batch {batch.first_seq}..{batch.last_seq}"
                        f" failed {queued.attempts} times in {(now - failing_since) / 1000:.1f}"
                        f" s ({reason}); retry budget {self.config.retry_budget_s:g} s spent"
                    )
                stats.retries += 1
                delay = self.config.backoff.delay(queued.attempts, self._rng)
                log.info(
                    "batch %d..%d: %s, retry %d in %.3f s",
                    batch.first_seq, batch.last_seq, reason, queued.attempts, delay,
                )  # fmt: skip
                if self._stop.is_set():
                    raise _Stopped
                await self._until_stop(self._sleep(delay))
        except (_Stopped, RetriesExhausted, asyncio.CancelledError) as exc:
            # Given up at shutdown: the checkpoint stays below it; read again on restart.
            if isinstance(exc, RetriesExhausted):
                self._give_up(exc)
            if isinstance(ticket, SendingTicket):
                ticket = ticket.fail()
            if ticket is not None:
                ticket.abandon()
                stats.batches_abandoned += 1
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._slots.release()

    async def _post(self, body: bytes) -> tuple[int, str]:
        """POST one batch: (HTTP status, reason); status 0 for a transport error."""
        stats = self.stats
        stats.batches_sent += 1
        stats.in_flight += 1
        try:
            response = await self._collector.post(
                self.config.to, content=body, headers={"content-type": "application/json"}
            )
        except httpx.TransportError as exc:
            stats.count_status("transport")
            return 0, f"{type(exc).__name__}: {exc}"
        finally:
            stats.in_flight -= 1
        stats.count_status(response.status_code)
        return response.status_code, f"HTTP {response.status_code} {response.text[:200]}".strip()

    async def _dead_letter(self, batch: _Batch, status: int, reason: str) -> None:
        """Write one dead-letter record per record of a rejected batch, before the
        checkpoint may pass it. The record id makes a re-write after a crash a no-op
        within the topic's idempotency window."""
        topic = self.config.topic
        head = b'{"record":'
        tail = b',"status":%d,"reason":%s}' % (status, orjson.dumps(reason))
        records = [
            RecordIn(msgspec.Raw(head + raw + tail), id=f"{topic}:{_decode_seq(raw).seq}")
            for raw in _decode_incoming(batch.body).records
        ]
        log.warning(
            "batch %d..%d rejected (%s): %d records to %s",
            batch.first_seq, batch.last_seq, reason, len(records), self.config.dead_letter_topic,
        )  # fmt: skip
        await self._waymark_call(
            partial(self._waymark.append, self.config.dead_letter_topic, records, create=True),
            retry_refusals=True,
        )
        self.stats.records_dead_lettered += len(records)

    # -- plumbing --------------------------------------------------------------

    async def _waymark_call(
        self, make: Callable[[], Awaitable[T]], *, retry_refusals: bool = False
    ) -> T:
        """Call the waymark API until it answers, backing off on transient errors.

        A refusal (4xx) is raised, unless ``retry_refusals``: a dead-letter write
        must never be skipped, so it keeps trying (and logging) until stopped.
        """
        attempt = 0
        failing_since: int | None = None
        while True:
            try:
                return await self._until_stop(make())
            except ApiError as exc:
                if exc.status < 500 and exc.status != 429 and not retry_refusals:
                    raise
                error: Exception = exc
            except TransportError as exc:  # no answer from waymark: try again
                error = exc
            attempt += 1
            now = self._clock.now_ms()
            failing_since = now if failing_since is None else failing_since
            if now - failing_since >= self.config.retry_budget_s * 1000:
                raise RetriesExhausted(
                    f"waymark API at {self.config.url}: {attempt} attempts failed in "
                    f"{(now - failing_since) / 1000:.1f} s ({error}); retry budget "
                    f"{self.config.retry_budget_s:g} s spent"
                ) from error
            delay = self.config.backoff.delay(attempt, self._rng)
            log.warning("waymark API: %s; retry %d in %.3f s", error, attempt, delay)
            await self._until_stop(self._sleep(delay))

    async def _until_stop(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` unless a stop comes first: then cancel it, raise _Stopped."""
        work = asyncio.ensure_future(awaitable)
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait((work, stopper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
        if work.cancelled() or not work.done():
            raise _Stopped
        return work.result()

    async def _save_loop(self) -> None:
        """Persist the committed checkpoint when it moved, on a timer: a save is an fsync.

        The final save is one that began after the run finished. A save already on the
        disk then holds an older snapshot (batches may have committed during its fsync),
        so it is followed by one more (docs/semantics/checkpoint.md §7).
        """
        interval = self.config.save_interval_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finished.wait(), interval)
            final = self._finished.is_set()
            await self._persist()
            if final:
                return

    async def _persist(self) -> None:
        version = self.tracker.version
        if version != self._saved_version:
            snapshot = self.tracker.snapshot()
            await asyncio.to_thread(self.store.save, snapshot)
            self._saved_version = version
            self.stats.checkpoint_saves += 1
            if (point := snapshot.get(self.config.topic)) is not None:
                self.stats.committed_seq = point.checkpoint[1]
        write_status(self.config.state_dir / "status.json", self.stats, self.state)
