"""Server-Sent Events: one stream implementation for ``GET /v0/topics/{topic}/watch``
and the queue ``GET /v0/topics/{q}/work`` push (docs/http-api.md).

:class:`EventStream` owns what every SSE stream does: the response head, the watch for
the client's disconnect, the wake-on-change loop over the :class:`Notifier`, a ``:
heartbeat`` comment when nothing was sent for ``heartbeat_s``, an in-band ``error``
event for a refusal after the head, and the close when the client leaves or the server
shuts down. A :class:`Feed` supplies only what differs: the next chunk of events.

The topic watch's feed is :class:`TopicFeed`. Each event's ``id:`` is a resumable cursor
``"<epoch>:<seq>"`` (:mod:`waymark.protocol.cursors`): the topic instance and the
exclusive lower bound to resume from. A record's cursor is its own ``$seq``; a
tombstone's is its ``$seq - 1``, the position the read went on from after the gap
(``gap_to`` for an evicted range or a crash hole, also one in the middle of the topic),
so a reconnect with ``Last-Event-ID`` never re-reports the gap nor skips the first
record after it. The epoch lets a resumed cursor detect a topic that was deleted and
recreated meanwhile (docs/semantics/topics.md §5.5).

The stream pulls from its feed one bounded batch at a time, and awaits the transport's
flow control before reading more. A slow consumer therefore costs the server one batch,
never an unbounded queue; if it falls so far behind that its records are evicted it
gets a tombstone, like any reader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import msgspec
import orjson

from ..log import DiffResult, Engine, ErrorCode, TopicError
from ..protocol.cursors import EVENT_ID, tombstone_cursor_seq
from .http import Receive, Response, Send
from .metrics import Metrics
from .notify import Notifier

HEARTBEAT = b": heartbeat\n\n"


def one_line(data: bytes) -> bytes:
    """``data`` (JSON) without line breaks: SSE data may not hold them, and a producer's
    JSON verbatim may, between tokens."""
    if b"\n" in data or b"\r" in data:
        return orjson.dumps(orjson.loads(data))
    return data


class Feed(Protocol):
    """What one kind of stream sends; :class:`EventStream` does the rest."""

    topic: str  # commits to this topic wake the stream

    async def next(self) -> tuple[bytes, bool]:
        """The next events as one chunk (``b""``: none now), and whether more are ready
        at once (a backlog). Runs after the stream took the topic's change future, so
        a commit while it runs, or while the chunk is sent, wakes the stream."""
        ...

    def due_s(self) -> float | None:
        """Seconds until the feed may have events without a commit (None: never)."""
        ...

    def close(self) -> None:
        """The stream ended (the client left, the server closes, or a refusal)."""
        ...


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _body(chunk: bytes) -> dict[str, object]:
    return {"type": "http.response.body", "body": chunk, "more_body": True}


class EventStream(Response):
    """A ``text/event-stream`` response that sends ``feed``'s events until the client
    disconnects or the server shuts down. Build it in the same step as the handler's
    first read (no await between): it takes the topic's change future then."""

    def __init__(
        self, feed: Feed, notifier: Notifier, metrics: Metrics, heartbeat_s: float
    ) -> None:
        super().__init__(
            b"",
            200,
            b"text/event-stream",
            ((b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")),
        )
        self._feed, self._notifier, self._metrics = feed, notifier, metrics
        self._heartbeat_s = heartbeat_s
        self._changed = notifier.next_change(feed.topic)
        # Set by the app for a stream opened with a token: the refusal the request would
        # get now, re-checked before every read (a reload may have revoked the token).
        self.admitted: Callable[[], TopicError | None] | None = None

    async def __call__(self, send: Send, receive: Receive) -> None:
        # Counted before the first await: the app's stream limit reads this count
        # (docs/security.md, Limits).
        self._metrics.watchers += 1
        disconnected = None
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", self.content_type), *self.headers],
                }
            )
            disconnected = asyncio.ensure_future(_disconnected(receive))
            await self._pump(send, disconnected)
        except TopicError as error:
            # The head is already sent: report the refusal in-band, then end the stream.
            await send(_body(b"event: error\ndata: " + msgspec.json.encode(error.body()) + b"\n\n"))
        finally:
            self._metrics.watchers -= 1
            if disconnected is not None:
                disconnected.cancel()
            self._feed.close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send, disconnected: asyncio.Future[None]) -> None:
        feed, notifier, heartbeat_s = self._feed, self._notifier, self._heartbeat_s
        topic, changed = feed.topic, self._changed
        loop = asyncio.get_running_loop()
        last_sent = loop.time()
        while not (disconnected.done() or notifier.closing):
            if self.admitted is not None and (refusal := self.admitted()) is not None:
                self._metrics.refused(refusal.code)
                raise refusal
            chunk, more = await feed.next()
            if chunk:
                # A slow reader holds this send; commits meanwhile complete `changed`.
                await send(_body(chunk))
                last_sent = loop.time()
            if more:
                # A backlog: let other requests run between batches.
                await asyncio.sleep(0)
            else:
                timeout = heartbeat_s - (loop.time() - last_sent)
                if (due := feed.due_s()) is not None:
                    timeout = min(timeout, due)
                await notifier.wait_turn(topic, max(timeout, 0.001), disconnected, changed)
                if disconnected.done() or notifier.closing:
                    return
                if loop.time() - last_sent >= heartbeat_s:
                    await send(_body(HEARTBEAT))
                    last_sent = loop.time()
            # Taken before the next read: a commit from here on wakes the next wait.
            changed = notifier.next_change(topic)


def frame(result: DiffResult) -> bytes:
    """The SSE events of one diff page (tombstone first), as one chunk."""
    epoch = result.epoch
    parts: list[bytes | memoryview] = []
    if (tomb := result.tombstone) is not None:
        parts += (
            b"event: tombstone\nid: ",
            EVENT_ID % (epoch, tombstone_cursor_seq(tomb)),
            b"\ndata: ",
            msgspec.json.encode(tomb),
            b"\n\n",
        )
    runs = result.runs
    # Records are stored canonical, without line breaks (docs/semantics/topics.md §1.2);
    # those written before (recovered from an older WAL or segment) may hold them between
    # tokens, which SSE data may not: checked once per page, only such a page re-encoded.
    joined = b"".join(runs)
    if b"\n" in joined or b"\r" in joined:
        runs = [one_line(bytes(run)[:-1]) + b"," for run in runs]
    for run, seq in zip(runs, result.seqs, strict=True):
        parts += (b"event: record\nid: ", EVENT_ID % (epoch, seq), b"\ndata: ", run[:-1], b"\n\n")
    return b"".join(parts)


class TopicFeed:
    """The topic watch: diff pages from a cursor, starting with the handler's first read
    (errors before it are plain HTTP)."""

    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        topic: str,
        first: DiffResult,
        nodes: frozenset[str] | None,
        batch: int,
    ) -> None:
        self._engine, self._metrics = engine, metrics
        self.topic, self._nodes, self._batch = topic, nodes, batch
        self._first: DiffResult | None = first
        self._cursor, self._epoch = first.next_from_seq, first.epoch

    async def next(self) -> tuple[bytes, bool]:
        result, self._first = self._first, None
        if result is None:
            result = self._read()
            if result is None:
                return b"", False
        self._cursor, self._epoch = result.next_from_seq, result.epoch
        self._metrics.records_read += result.count
        return frame(result), not result.caught_up

    def due_s(self) -> None:
        return None

    def close(self) -> None:
        pass

    def _read(self) -> DiffResult | None:
        try:
            return self._engine.diff(
                self.topic,
                self._cursor,
                limit=self._batch,
                nodes=self._nodes,
                epoch=self._epoch,
                per_record=True,
            )
        except TopicError as error:
            if error.code is not ErrorCode.TOPIC_NOT_FOUND:
                raise
            # Deleted while watched: keep the cursor and its epoch, so that if the
            # topic is recreated the reader gets the `recreated` tombstone
            # (docs/semantics/topics.md §5.5).
            return None
