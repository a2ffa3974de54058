"""Ephemeral push consumers on a KV stream, built by hand on core NATS.

nats-py's KV watch cannot start from a revision nor take several filters, so
watches, ``scan`` and ``keys`` all use this consumer. It subscribes to its
inbox *before* creating the consumer (no early message can miss the
subscription), never acks (``AckPolicy.NONE``: an explicit-ack consumer stalls
after ``max_ack_pending`` messages), and keeps ordered-consumer discipline: a
gap in consumer sequence, lost heartbeats or a stalled consumer recreates a
watch's consumer (a reset). A reset resumes strictly after the last revision
*handed over* to the reader, never after the last one received: whatever was
received but not yet handed over (the chunk being built, a chunk blocked on a
full channel) is dropped and delivered again, so every revision reaches the
reader once and in order (docs/semantics/kv.md, "KvWatch resets"). A reset that
finds the stream no longer holds the next revision fails with
:class:`CursorExpired`, the resync path, never a silent skip. A reset that meets a
transient failure (no answer in time, no responders, a cluster electing a leader)
tries again after a backoff, each attempt from the last revision handed over, for
as long as it takes unless told to give up after some attempts, as nats.go's
ordered consumer does; any other failure fails the watch with :class:`WatchError`.
A listing (``scan``/``keys``) is not resumable that way: it fails with
:class:`ConsumerLost` and the reader starts over.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from waymark.clock import Backoff
from waymark.kv.deadline import timed
from waymark.kv.errors import CursorExpired, KvError, WatchError
from waymark.kv.guards import (
    listing_stuck,
    reset_resume_point,
    resume_window_ok,
    resume_within_stream,
)
from waymark.kv.transient import transient
from waymark.kv.types import UNKNOWN_VERSION, KvUpdate, Op, VersionToken

log = logging.getLogger("waymark.kv")

KV_OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"
MSG_SIZE = "Nats-Msg-Size"
_OPS = {"DEL": Op.DELETE, "PURGE": Op.PURGE}
_MARKER_OPS = {"MaxAge": Op.PURGE, "Purge": Op.PURGE, "Remove": Op.DELETE}
# A marker says the key's value is gone, whatever its reason; one of a reason
# this client does not know (a newer server's) carries no value either.
_UNKNOWN_MARKER_OP = Op.DELETE

HEARTBEAT = 5.0
RECONNECT_CHECK = 0.25  # how often the heartbeat monitor looks for a client reconnect
RESET_BACKOFF = Backoff(0.5, 5.0)
"""Delays between a reset's attempts: from 0.25-0.5 s up to 2.5-5 s, as the fold's start."""
_PUT = Op.PUT


def parse_ack(reply: str) -> tuple[int, int, int] | None:
    """(stream_seq, consumer_seq, num_pending) from a JetStream ACK subject.

    Legacy, 9 tokens: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
    Modern, 11-12:    $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>...
    The last token is ``num_pending``, never the sequence, so index from the front.
    None when the subject has neither shape: the update gets the unknown version.
    """
    t = reply.split(".")
    try:
        if len(t) == 9:
            return int(t[5]), int(t[6]), int(t[8])
        if len(t) in (11, 12):
            return int(t[7]), int(t[8]), int(t[10])
    except ValueError:
        return None
    return None


def update_op(headers: dict[str, str] | None) -> Op:
    """The KV operation a message carries; a marker of an unknown reason is a delete."""
    if not headers:
        return Op.PUT
    op = headers.get(KV_OPERATION)
    if op is not None:
        return _OPS.get(op, Op.PUT)
    reason = headers.get(MARKER_REASON)
    if reason is not None:
        return _MARKER_OPS.get(reason, _UNKNOWN_MARKER_OP)
    return Op.PUT


@dataclass(frozen=True)
class ConsumerSpec:
    stream: str
    subject_prefix: str  # "$KV.<bucket>." - stripped to get the key
    filters: tuple[str, ...]  # full subjects
    deliver_policy: api.DeliverPolicy
    start_seq: int | None = None
    headers_only: bool = False


class Failed:
    """Put on a feed's queue in place of a chunk when the feed stops with an error."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


END = object()
"""Put on a feed's queue when the feed is stopped cleanly."""


class ConsumerLost(KvError):
    """A listing's consumer was lost (a delivery gap, silent heartbeats).

    A last-per-subject listing cannot resume from a stream sequence: that
    would deliver every later revision, deletes included, rather than the
    last value of each key. The listing starts over with a fresh consumer.
    """


FloorCheck = Callable[[int, int], Awaitable[None]]


class OrderedFeed:
    """An ordered push consumer that hands chunks of :class:`KvUpdate` to a bounded queue.

    ``floor_check(frontier, delivered)`` runs before a delivery that skipped
    stream sequences is processed; it raises to fail the feed. A feed that is
    not ``resumable`` (a listing) fails with :class:`ConsumerLost` where a
    watch's feed recreates its consumer from the frontier. A re-creation that fails
    transiently is tried again after ``reset_backoff``'s delay (waited with
    ``sleep``), up to ``reset_attempts`` attempts in all (None: until it succeeds or
    the feed stops).
    """

    def __init__(
        self,
        js: JetStreamContext,
        spec: ConsumerSpec,
        out: asyncio.Queue[object],
        *,
        chunk_max: int,
        timeout: float,
        floor_check: FloorCheck | None = None,
        frontier: int = 0,
        heartbeat: float = HEARTBEAT,
        resumable: bool = True,
        reset_attempts: int | None = None,
        reset_backoff: Backoff = RESET_BACKOFF,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._js = js
        self._nc: Client = js._nc  # the core client that owns the inbox subscriptions
        self._spec = spec
        self._out = out
        self._chunk_max = chunk_max
        self._timeout = timeout
        self._floor_check = floor_check
        self._heartbeat = heartbeat
        self._resumable = resumable
        self._reset_attempts = reset_attempts
        self._reset_backoff = reset_backoff
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._backing_off: asyncio.Future[object] | None = None  # a reset's wait between attempts
        self.reset_retries = 0  # attempts of a reset that failed transiently and were retried
        self.frontier = frontier  # last stream sequence delivered
        self.handed = frontier  # last stream sequence handed over to the reader
        self._plen = len(spec.subject_prefix)
        self._dseq = 1
        self._gen = 0
        self._answered_fc: str | None = None
        self._stall_strikes = 0
        self._listing = 0  # messages this consumer's last-per-subject listing holds
        self._listing_from = 0  # ``delivered`` when this consumer was created
        self._sub: Subscription | None = None
        self._consumer: str | None = None
        self._chunk: list[KvUpdate] = []
        self._handing: asyncio.Task[None] | None = None  # a hand-over blocked on a full queue
        self._final: asyncio.Task[None] | None = None  # END or Failed, behind a full queue
        # A reset waits for a consumer creation in flight: two at once would
        # leave the feed holding one consumer's subscription and another's name.
        self._creating = asyncio.Lock()
        self._last_activity = time.monotonic()
        self._monitor: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # resets and teardowns in flight
        self._stopped = False
        self._resetting = False
        self.delivered = 0
        self.initial_pending = 0
        self.pending = 0  # the consumer's num_pending as of the last delivery

    async def start(self) -> None:
        async with self._creating:
            await self._create(self._spec.deliver_policy, self._spec.start_seq)
        self._monitor = asyncio.create_task(self._watch_heartbeats())

    async def _create(self, policy: api.DeliverPolicy, start_seq: int | None) -> None:
        self._gen += 1
        # Decided now: deliveries (and a reset bumping _gen) may come before the reply.
        first = self._gen == 1
        self._dseq = 1
        self._answered_fc, self._stall_strikes = None, 0
        # Deliveries may come before add_consumer returns: they count from here.
        self._listing, self._listing_from = 0, self.delivered
        inbox = self._nc.new_inbox()
        # Subscribe first: the consumer may deliver the moment it exists.
        self._sub = await self._nc.subscribe(
            inbox,
            cb=functools.partial(self._on_msg, self._gen),
            pending_msgs_limit=1 << 20,
            pending_bytes_limit=1 << 30,
        )
        spec = self._spec
        config = api.ConsumerConfig(
            deliver_subject=inbox,
            deliver_policy=policy,
            opt_start_seq=start_seq if policy == api.DeliverPolicy.BY_START_SEQUENCE else None,
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=self._heartbeat,
            headers_only=spec.headers_only or None,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=max(30.0, self._heartbeat * 6),
        )
        if len(spec.filters) == 1:
            config.filter_subject = spec.filters[0]
        else:
            config.filter_subjects = list(spec.filters)
        info = await timed(
            self._js.add_consumer(spec.stream, config=config), self._timeout, "create consumer"
        )
        self._consumer = info.name
        if policy == api.DeliverPolicy.LAST_PER_SUBJECT:
            self._listing = info.num_pending or 0
        if first:
            self.initial_pending = info.num_pending or 0

    async def _on_msg(self, gen: int, msg: Msg) -> None:
        # The hot path of every watch and scan: runs once per message, so the
        # common case (a put without headers) makes as few calls as it can.
        try:
            if gen != self._gen or self._stopped:
                return  # a message from a consumer we already replaced
            data = msg.data
            headers = msg.headers
            if headers and not data and headers.get("Status") == "100":
                await self._on_control(msg, headers)
                # A control message may be the last one queued behind the final
                # update of a burst: hand that chunk over now, not on the next update.
                sub = self._sub
                if self._chunk and not self._stopped and (sub is None or sub.pending_msgs == 0):
                    chunk, self._chunk = self._chunk, []
                    await self._hand_over(gen, chunk)
                return
            ack = parse_ack(msg.reply)
            if ack is None:
                version = UNKNOWN_VERSION
            else:
                sseq, dseq, self.pending = ack
                if dseq != self._dseq:
                    self._reset()
                    return
                self._dseq = dseq + 1
                if sseq > self.frontier + 1 and self._floor_check is not None:
                    # A reset that unsubscribes meanwhile cancels this delivery: the
                    # cancellation propagates, and the reset decides what comes next
                    # (docs/semantics/kv.md §4.4). Only the check's verdict fails the feed.
                    try:
                        await self._floor_check(self.frontier, sseq)
                    except Exception as e:
                        await self.fail(e)
                        return
                    if gen != self._gen:
                        return  # reset while the check ran: the new consumer resends this one
                self.frontier = sseq
                version = VersionToken(sseq.to_bytes(8, "big"))  # VersionToken.from_u64, inlined
            if headers:
                op = update_op(headers)
                if op is not _PUT:
                    data = b""
                elif self._spec.headers_only and headers.get(MSG_SIZE) == "0":
                    op = Op.DELETE  # no value bytes to look at: report the CAS tombstone as one
            else:
                op = _PUT  # what update_op says of a message without headers
            self.delivered += 1
            chunk = self._chunk
            chunk.append(KvUpdate(op, msg.subject[self._plen :], data, version))
            sub = self._sub
            if len(chunk) >= self._chunk_max or sub is None or sub.pending_msgs == 0:
                self._chunk = []
                await self._hand_over(gen, chunk)
        except Exception as e:
            # nats-py hands a callback's error to the connection's error callback and
            # goes on with the next message: this one would be skipped without a word.
            self._fail_now(WatchError(f"watch delivery failed: {e!r}"))

    async def _hand_over(self, gen: int, chunk: list[KvUpdate]) -> None:
        """Put ``chunk`` on the queue and move ``handed`` past it, as one step.

        ``self.frontier`` is the chunk's last known revision: a chunk is handed
        over as soon as the update that ends it is received. A full queue (an
        idle reader) blocks in a task of its own, so that a reset can cancel
        it and know for sure whether the chunk went out (then ``handed``
        covers it) or not (then the new consumer delivers it again).
        """
        if gen != self._gen:
            return  # reset meanwhile: the new consumer resends this chunk
        high = self.frontier
        try:
            self._out.put_nowait(chunk)
        except asyncio.QueueFull:
            self._handing = asyncio.create_task(self._put(chunk, high))
            try:
                await self._handing
            finally:
                self._handing = None
        else:
            self.handed = high

    async def _put(self, chunk: list[KvUpdate], high: int) -> None:
        await self._out.put(chunk)
        self.handed = high  # no await between the put and this: both or neither

    async def _on_control(self, msg: Msg, headers: dict[str, str]) -> None:
        if msg.reply:  # flow control: every message before it has been processed
            await self._answer(msg.reply)
            return
        stalled = headers.get("Nats-Consumer-Stalled")
        if stalled:
            # Measured on nats-server 2.15: once retention evicts messages a
            # flow-control-stalled consumer had not sent, it stays stalled on a
            # request we already answered, heartbeating but never delivering.
            # Answer again once; if it is still stuck, recreate it.
            if stalled == self._answered_fc:
                self._stall_strikes += 1
                if self._stall_strikes >= 2:
                    self._reset()
                    return
            await self._answer(stalled)
        last = headers.get("Nats-Last-Consumer")
        if last is not None and int(last) != self._dseq - 1:
            self._reset()
        elif not stalled and listing_stuck(self.delivered - self._listing_from, self._listing):
            # Waiting would crawl on, one removed message per heartbeat, without a
            # word: recreate the consumer (docs/semantics/kv.md §4.4).
            self._reset()

    async def _answer(self, request: str) -> None:
        """Answer a flow-control request. While the client reconnects its buffer may be
        full: the answer is dropped, unrecorded, and the server, still stalled on the
        request, repeats it in its heartbeats (answered then)."""
        try:
            await self._nc.publish(request)
        except nats.errors.OutboundBufferLimitError:
            return
        self._answered_fc = request

    def _reset(self) -> None:
        """Recreate the consumer after a gap, from the stream sequence after the frontier.

        Runs as its own task: unsubscribing cancels the subscription's delivery
        task, which is where most resets are decided.
        """
        if self._resetting or self._stopped:
            return
        if not self._resumable:
            self._fail_now(ConsumerLost(f"listing consumer lost after {self.delivered} deliveries"))
            return
        self._resetting = True
        self._gen += 1  # whatever the old consumer still delivers is ignored
        self._tasks.add(t := asyncio.create_task(self._recreate()))
        t.add_done_callback(self._tasks.discard)

    async def _recreate(self) -> None:
        """Recreate the consumer, again after a backoff while it fails transiently.

        Every attempt starts over from what was handed over (a failed attempt hands
        nothing over: its consumer, which the server may have created all the same,
        is abandoned), so a retry never resumes past a revision the reader has not
        had (docs/semantics/kv.md §4.4).
        """
        attempt = 0
        try:
            while True:
                attempt += 1
                try:
                    async with self._creating:
                        try:
                            await self._recreate_consumer()
                        except Exception:
                            await self._abandon_attempt()
                            raise
                except CursorExpired:
                    raise
                except Exception as e:
                    if self._stopped:
                        return  # stopped during the attempt: nothing left to recreate
                    if not transient(e):
                        raise
                    if self._reset_attempts is not None and attempt >= self._reset_attempts:
                        tries = f"{attempt} attempts" if attempt > 1 else "1 attempt"
                        raise WatchError(f"{e} ({tries})") from e
                    delay = self._reset_backoff.delay(attempt, self._rng)
                    self.reset_retries += 1
                    log.warning(
                        "watch consumer on %s lost; re-creating it failed (%s); retrying in "
                        "%.1f s from revision %d (attempt %d)",
                        self._spec.stream, e, delay, self.handed + 1, attempt + 1,
                    )  # fmt: skip
                    if not await self._back_off(delay):
                        return  # stopped meanwhile
                    continue
                if attempt > 1:
                    log.warning(
                        "watch consumer on %s re-created after %d attempts, from revision %d",
                        self._spec.stream, attempt, self.frontier + 1,
                    )  # fmt: skip
                return
        except CursorExpired as e:
            await self.fail(e)
        except Exception as e:
            await self.fail(WatchError(f"watch consumer lost and could not be recreated: {e}"))
        finally:
            self._resetting = False

    async def _abandon_attempt(self) -> None:
        """Leave a failed attempt's consumer behind: its create may have reached the
        server (the answer was what timed out), but nothing it delivers is taken."""
        self._gen += 1
        await self._drop_consumer()

    async def _back_off(self, delay: float) -> bool:
        """Wait ``delay`` seconds between attempts; False when the feed stopped meanwhile."""
        wait = self._backing_off = asyncio.ensure_future(self._sleep(delay))
        try:
            await asyncio.wait([wait])  # a stop cancels ``wait``, not this task
        finally:
            self._backing_off = None
            wait.cancel()
        return not self._stopped

    async def _recreate_consumer(self) -> None:
        handing = self._handing
        if handing is not None:
            # Settle the blocked hand-over first: after this, ``handed`` is final.
            handing.cancel()
            await asyncio.gather(handing, return_exceptions=True)
        self._chunk = []  # received, never handed over: the new consumer resends it
        await self._drop_consumer()
        if self._stopped:
            return
        after = reset_resume_point(self.frontier, self.handed)
        self.frontier = after
        if after == 0:  # nothing handed over yet: start over as the watch began
            await self._create(self._spec.deliver_policy, self._spec.start_seq)
        else:
            await self._check_window(after)
            await self._create(api.DeliverPolicy.BY_START_SEQUENCE, after + 1)
        self._last_activity = time.monotonic()

    async def _check_window(self, after: int) -> None:
        """CursorExpired unless the stream still holds everything after ``after``.

        NATS would silently start a consumer at its first sequence (retention
        evicted the rest) or wait past its last one (the bucket was recreated).
        """
        info = await timed(self._js.stream_info(self._spec.stream), self._timeout, "stream info")
        first, last = info.state.first_seq, info.state.last_seq
        if not resume_within_stream(after, last):
            raise CursorExpired(after, first, last, "beyond the last sequence: bucket recreated?")
        if not resume_window_ok(after, first):
            raise CursorExpired(after, first, last, "retention evicted sequences during a reset")

    async def _watch_heartbeats(self) -> None:
        # Arrivals, not processing, prove the consumer alive: a loop that is
        # merely backpressuring us must not look like a dead consumer.
        # A reconnect is looked for more often: the server the client reconnected to
        # may not have the consumer (a restarted one forgot it, it is kept in memory),
        # and three missed heartbeats would leave the feed idle for 15 s meanwhile
        # (docs/kv.md, "On a NATS cluster"). Recreating it is always safe: a reset
        # resumes strictly after what was delivered.
        seen = -1
        reconnects = self._nc.stats["reconnects"]
        beat = time.monotonic() + self._heartbeat
        while not self._stopped:
            await asyncio.sleep(min(self._heartbeat, RECONNECT_CHECK))
            if self._nc.stats["reconnects"] != reconnects:
                reconnects = self._nc.stats["reconnects"]
                self._reset()
                seen = -1
                continue
            if time.monotonic() < beat:
                continue
            beat = time.monotonic() + self._heartbeat
            arrived = self._sub.delivered if self._sub is not None else seen
            if arrived != seen:
                seen = arrived
                self._last_activity = time.monotonic()
            elif time.monotonic() - self._last_activity > 3 * self._heartbeat:
                self._reset()
                seen = -1

    async def _drop_consumer(self) -> None:
        sub, self._sub = self._sub, None
        name, self._consumer = self._consumer, None
        if sub is not None:
            # A dead connection drops the interest by itself.
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if name is not None:
            # Ephemeral: the server reaps it after inactive_threshold anyway.
            with contextlib.suppress(Exception):
                await timed(
                    self._js.delete_consumer(self._spec.stream, name),
                    self._timeout,
                    "delete consumer",
                )

    async def fail(self, error: BaseException) -> None:
        """Stop with ``error`` for the reader. Safe to call from the delivery callback:
        the reader learns first, the consumer is torn down in a task of its own."""
        self._fail_now(error)

    def _fail_now(self, error: BaseException) -> None:
        if self._stopped:
            return
        self._halt()
        self._put_final(Failed(error))
        self._tasks.add(t := asyncio.create_task(self._drop_consumer()))
        t.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        if not self._stopped:
            self._halt()
            self._put_final(END)
        # After fail() the teardown runs in a task, maybe before the consumer's
        # creation returned: wait for it, then drop whatever is left.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._drop_consumer()
        if self._final is not None:
            self._final.cancel()  # the reader stopped without reading to the end

    def _halt(self) -> None:
        self._stopped = True
        self._gen += 1
        if self._backing_off is not None:
            self._backing_off.cancel()  # a reset between attempts gives up at once
        if self._monitor is not None and self._monitor is not asyncio.current_task():
            self._monitor.cancel()

    def _put_final(self, item: object) -> None:
        """Queue ``item`` behind what was handed over, never in its place: a chunk
        handed over is the reader's (a reset resumes after it). Never blocks: the
        reader may be gone, so behind a full queue the put waits in a task that
        ``stop`` cancels."""
        try:
            self._out.put_nowait(item)
        except asyncio.QueueFull:
            self._final = asyncio.create_task(self._out.put(item))
