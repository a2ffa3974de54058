"""``GET /v0/topics/{topic}/watch``: a topic as a Server-Sent Events stream.

Each event's ``id:`` is a resumable cursor ``"<epoch>:<seq>"``
(:mod:`waymark.protocol.cursors`): the topic instance and the exclusive lower bound
to resume from. A record's cursor is its own ``$seq``; a tombstone's is its
``$seq - 1``, the position the read went on from after the gap (``gap_to`` for an
evicted range or a crash hole, also one in the middle of the topic), so a reconnect
with ``Last-Event-ID`` never re-reports the gap nor skips the first record after it.
The epoch lets a resumed cursor detect a topic that was deleted and recreated
meanwhile (docs/semantics/topics.md §5.5).

The stream pulls from the engine by cursor, one bounded batch at a time, and
awaits the transport's flow control before reading more. A slow consumer
therefore costs the server one batch, never an unbounded queue; if it falls so
far behind that its records are evicted it gets a tombstone, like any reader.
"""

from __future__ import annotations

import asyncio

import msgspec
import orjson

from ..log import DiffResult, Engine, ErrorCode, TopicError
from ..protocol.cursors import EVENT_ID, tombstone_cursor_seq
from .http import Receive, Response, Send
from .metrics import Metrics
from .notify import Notifier

HEARTBEAT = b": heartbeat\n\n"


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
    # A record's data is the producer's JSON verbatim, which may hold line breaks
    # between tokens; SSE data may not, so only those pages are re-encoded.
    joined = b"".join(runs)
    if b"\n" in joined or b"\r" in joined:
        runs = [orjson.dumps(orjson.loads(bytes(run)[:-1])) + b"," for run in runs]
    for run, seq in zip(runs, result.seqs, strict=True):
        parts += (b"event: record\nid: ", EVENT_ID % (epoch, seq), b"\ndata: ", run[:-1], b"\n\n")
    return b"".join(parts)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream(Response):
    """The stream that follows a successful first read (errors before it are plain HTTP)."""

    def __init__(
        self,
        engine: Engine,
        notifier: Notifier,
        metrics: Metrics,
        topic: str,
        first: DiffResult,
        nodes: frozenset[str] | None,
        batch: int,
        heartbeat_s: float,
    ) -> None:
        super().__init__(
            b"",
            200,
            b"text/event-stream",
            ((b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")),
        )
        self._engine, self._notifier, self._metrics = engine, notifier, metrics
        self._topic, self._first, self._nodes = topic, first, nodes
        self._batch, self._heartbeat_s = batch, heartbeat_s
        # Taken in the same step as the first read (no await between): a commit while
        # the stream starts or sends still wakes it.
        self._changed = notifier.next_change(topic)

    async def __call__(self, send: Send, receive: Receive) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", self.content_type), *self.headers],
            }
        )
        disconnected = asyncio.ensure_future(_disconnected(receive))
        self._metrics.watchers += 1
        try:
            await self._pump(send, disconnected)
        except TopicError as error:
            # The head is already sent: report the refusal in-band, then end the stream.
            body = b"event: error\ndata: " + msgspec.json.encode(error.body()) + b"\n\n"
            await send({"type": "http.response.body", "body": body, "more_body": True})
        finally:
            self._metrics.watchers -= 1
            disconnected.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send, disconnected: asyncio.Future[None]) -> None:
        result: DiffResult | None = self._first
        cursor, epoch = self._first.next_from_seq, self._first.epoch
        notifier, changed = self._notifier, self._changed
        while not (disconnected.done() or notifier.closing):
            if result is not None:
                chunk = frame(result)
                if chunk:
                    # A slow reader holds this send; commits meanwhile complete `changed`.
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    self._metrics.records_read += result.count
                cursor, epoch = result.next_from_seq, result.epoch
                if not result.caught_up:
                    # A long backlog: let other requests run between pages.
                    await asyncio.sleep(0)
                    changed = notifier.next_change(self._topic)
                    result = self._read(cursor, epoch)
                    continue
            woke = await notifier.wait(self._topic, self._heartbeat_s, disconnected, changed)
            if disconnected.done() or notifier.closing:
                return
            if woke:
                changed = notifier.next_change(self._topic)
                result = self._read(cursor, epoch)
            else:
                result = None
                await send({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})

    def _read(self, cursor: int, epoch: int) -> DiffResult | None:
        try:
            return self._engine.diff(
                self._topic,
                cursor,
                limit=self._batch,
                nodes=self._nodes,
                epoch=epoch,
                per_record=True,
            )
        except TopicError as error:
            if error.code is not ErrorCode.TOPIC_NOT_FOUND:
                raise
            # Deleted while watched: keep the cursor and its epoch, so that if the
            # topic is recreated the reader gets the `recreated` tombstone
            # (docs/semantics/topics.md §5.5).
            return None
