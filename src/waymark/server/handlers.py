"""The /v0 route handlers: decode the request, call the engine, encode its result.

Bodies are decoded by msgspec straight into the protocol's request structs (records
keep their ``data`` as raw JSON bytes); answers are protocol structs encoded by
msgspec, or on the append and diff paths the engine results' own wire JSON. No
per-record Python objects are built on the way in or out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

import msgspec
import orjson

from ..log import DiffResult, EncodedRecord, Engine, ErrorCode, Limits, TagMatch, TopicError, pages
from ..log.prebuilt import build
from ..protocol import (
    ARROW_STREAM,
    MAX_ARROW_DIFF_LIMIT,
    MAX_DIFF_LIMIT,
    AppendRequest,
    DeleteRequest,
    DiffRequest,
    Durability,
    Health,
    TopicDeleted,
    TopicList,
    TopicPut,
    parse_cursor,
)
from ..protocol.limits import DEFAULT_TOPIC_PAGE, MAX_TOPIC_PAGE
from ..protocol.scopes import ScopeKind, allows
from .auth import TOKEN, Token
from .config import StreamConfig
from .history import AppendHistory
from .http import BodyDecoder, Request, Response, is_large, off_loop, refuse_server_meta
from .metrics import Metrics
from .notify import Notifier
from .pieces import AppendDecoder
from .sse import EventStream, TopicFeed

# A large body a piece at a time (docs/security.md, Limits); server meta refused after.
_append = AppendDecoder(check=lambda body: refuse_server_meta(body.records))
_diff = BodyDecoder(DiffRequest)
_delete = BodyDecoder(DeleteRequest)
_put = BodyDecoder(TopicPut)
_encode = msgspec.json.encode
_HEALTH = _encode(Health("ok"))
_ARROW = ARROW_STREAM.encode()


def _readable(token: Token, topic: str) -> bool:
    return allows(token.grants, ScopeKind.READ, topic)


def _topic(request: Request) -> str:
    # The engine checks the name (400 invalid_topic_name) on every call that takes one.
    return request.params["topic"]


def _invalid(message: str, **detail: object) -> TopicError:
    return TopicError(ErrorCode.INVALID_REQUEST, message, dict(detail))


def _flag(request: Request, name: str, default: bool) -> bool:
    values = request.query.get(name)
    if not values:
        return default
    if values[-1] in ("true", "1"):
        return True
    if values[-1] in ("false", "0"):
        return False
    raise _invalid(f"{name} is true or false", **{name: values[-1]})


def _int(request: Request, name: str) -> int | None:
    values = request.query.get(name)
    if not values:
        return None
    if not (values[-1].isascii() and values[-1].isdigit()):  # int() refuses "³"
        raise _invalid(f"{name} is a non-negative integer", **{name: values[-1]})
    return int(values[-1])


def _nodes(node: str | list[str] | None) -> frozenset[str] | None:
    if node is None:
        return None
    nodes = frozenset((node,) if isinstance(node, str) else node)
    return nodes or None


class TopicApi:
    def __init__(
        self,
        engine: Engine,
        limits: Limits,
        notifier: Notifier,
        metrics: Metrics,
        streams: StreamConfig,
        history: AppendHistory,
        on_durable: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.history = history
        self.max_body = limits.max_body_bytes
        self.notifier = notifier
        # Who learns that a topic's synced records became readable: its readers, and
        # the routers reading it (docs/semantics/topics.md §8.1).
        self.on_durable = on_durable or notifier.notify
        self.metrics = metrics
        self.streams = streams

    async def health(self, request: Request) -> Response:
        return Response(_HEALTH)

    async def list_topics(self, request: Request) -> Response:
        after = request.query.get("after", [None])[-1]
        asked = _int(request, "limit")
        limit = DEFAULT_TOPIC_PAGE if asked is None else asked
        if not 1 <= limit <= MAX_TOPIC_PAGE:
            raise TopicError(ErrorCode.INVALID_REQUEST, f"limit is 1 to {MAX_TOPIC_PAGE}",
                             {"limit": limit})  # fmt: skip
        token: Token | None = request.scope.get(TOKEN)
        # Only the topics it may read (docs/security.md); a page at a time, so a server
        # with many topics answers without holding up other requests for long.
        visible = None if token is None else partial(_readable, token)
        topics = self.engine.list_topics(after=after, limit=limit + 1, visible=visible)
        more = len(topics) > limit
        del topics[limit:]
        return Response(_encode(TopicList(topics, topics[-1].name if more else None)))

    async def _control_durable(self, name: str) -> None:
        # Topic config and deletions are control frames: acknowledged once durable.
        commit = self.engine.commit_point(name)
        if commit is not None:
            await commit.wait()

    async def put_topic(self, request: Request) -> Response:
        name = _topic(request)
        body = await request.body(self.max_body)
        # An empty body creates the topic with the defaults.
        put = _put.decode(body) if body else TopicPut()
        state, created = self.engine.put_topic(name, put.patch(), put.type)
        await self._control_durable(name)
        if state.durability is Durability.FSYNC:
            # The figure as of this PUT's own sync, which has just landed.
            state = msgspec.structs.replace(state, fsync_ms=self.engine.sync_ms(name))
        return Response(_encode(state), 201 if created else 200)

    async def get_topic(self, request: Request) -> Response:
        name = _topic(request)
        return Response(_encode(self.engine.get_topic(name, touch=_flag(request, "touch", True))))

    async def get_topic_history(self, request: Request) -> Response:
        state = self.engine.get_topic(_topic(request), touch=False)
        now = self.engine.clock.now_ms()
        history = self.history.of(state.name, state.epoch, now, state.head_seq, state.bytes)
        return Response(_encode(history))

    async def delete_topic(self, request: Request) -> Response:
        name = _topic(request)
        self.engine.delete_topic(name)
        await self._control_durable(name)
        return Response(_encode(TopicDeleted(name, True)))

    def _validated(self, body: bytes) -> tuple[AppendRequest, list[EncodedRecord]]:
        """Decode and validate an append's body: pure, so a large one runs off the loop."""
        append = _append.decode(body)
        return append, self.engine.encode(append.records)

    async def append(self, request: Request) -> Response:
        name = _topic(request)
        parts = await request.body_parts(self.max_body)
        body, encoded = await off_loop(parts, self._validated)
        prebuilt = None
        if is_large(parts):
            # Its chunk and frame are copied and checksummed on a worker thread too; the
            # engine adopts them unless the topic moved on meanwhile (docs/security.md,
            # Limits).
            layout = self.engine.lay_out(name, encoded, create=body.create, config=body.config)
            prebuilt = await asyncio.to_thread(build, layout)
        result = self.engine.append_encoded(
            name, encoded, create=body.create, config=body.config, prebuilt=prebuilt
        )
        fsync_ms = 0
        if result.must_sync and result.commit is not None:
            # fsync class, or a new seq ceiling: ack once durable. Readers of an fsync
            # topic see the records only then, so wake them when the sync lands, even
            # if this producer has gone away meanwhile.
            clock = self.engine.clock
            started = clock.now_ms()
            synced = asyncio.ensure_future(result.commit.wait())
            synced.add_done_callback(lambda _: self.on_durable(name))
            await asyncio.shield(synced)
            if result.durability is Durability.FSYNC:
                # Only the fsync class is fsync-gated (docs/semantics/topics.md §2.2): a
                # disk write waiting for its seq ceiling still reports 0.
                fsync_ms = max(0, clock.now_ms() - started)
        self.metrics.records_appended += len(result.seqs)
        return Response(orjson.dumps(result.to_wire(fsync_ms)))

    async def diff(self, request: Request) -> Response:
        name = _topic(request)
        body = _diff.decode(await request.body(self.max_body))
        arrow = _wants_arrow(request)
        if not arrow and body.limit > MAX_DIFF_LIMIT:
            raise _invalid(
                f"a JSON diff page holds at most {MAX_DIFF_LIMIT} records; an Arrow page "
                f"(Accept: {ARROW_STREAM}) up to {MAX_ARROW_DIFF_LIMIT}",
                limit=body.limit,
            )
        nodes = _nodes(body.node)
        result = self.engine.diff(
            name, body.from_seq, limit=body.limit, nodes=nodes, epoch=body.epoch, columns=arrow
        )
        if body.wait_ms and _empty(result):
            result = await self._wait(name, result, body, nodes, arrow)
        self.metrics.records_read += result.count
        if arrow:
            return Response(pages.render(result), content_type=_ARROW)
        return Response(result.to_json())

    async def _wait(
        self,
        name: str,
        result: DiffResult,
        body: DiffRequest,
        nodes: frozenset[str] | None,
        columns: bool,
    ) -> DiffResult:
        """Long-poll: re-read after each commit to the topic until something is delivered
        or ``wait_ms`` runs out. Node-filtered commits advance the cursor silently."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + body.wait_ms / 1000
        # No await between this and the first wait taking its change future: once
        # /metrics counts this poll, the next commit wakes it (what tests wait for).
        self.metrics.long_polls += 1
        try:
            while _empty(result):
                remaining = deadline - loop.time()
                if remaining <= 0 or not await self.notifier.wait(name, remaining):
                    break
                result = self.engine.diff(
                    name, result.next_from_seq, limit=body.limit, nodes=nodes,
                    epoch=result.epoch, columns=columns,
                )  # fmt: skip
        finally:
            self.metrics.long_polls -= 1
        return result

    async def delete(self, request: Request) -> Response:
        name = _topic(request)
        body = _delete.decode(await request.body(self.max_body))
        if body.before_seq is None and body.match is None:
            raise _invalid("a delete needs before_seq, match, or both")
        match = None
        if body.match is not None:
            match = TagMatch.parse(body.match if isinstance(body.match, str) else list(body.match))
        result = self.engine.delete(name, before_seq=body.before_seq, match=match)
        if result.commit is not None:
            await result.commit.wait()  # a journaled delete is acknowledged once durable
        return Response(_encode(result.response))

    async def watch(self, request: Request) -> Response:
        name = _topic(request)
        epoch, cursor = None, _int(request, "from_seq") or 0
        if (epoch_param := _int(request, "epoch")) is not None:
            epoch = epoch_param
        # A reconnecting EventSource repeats the original URL: Last-Event-ID wins.
        if last_id := request.header(b"last-event-id"):
            epoch, cursor = _cursor(last_id.decode("latin-1"))
        nodes = _nodes(request.query.get("node"))
        first = self.engine.diff(
            name,
            cursor,
            limit=self.streams.sse_batch,
            nodes=nodes,
            epoch=epoch,
            per_record=True,
        )
        feed = TopicFeed(self.engine, self.metrics, name, first, nodes, self.streams.sse_batch)
        return EventStream(feed, self.notifier, self.metrics, self.streams.heartbeat_s)


def _cursor(value: str) -> tuple[int | None, int]:
    try:
        return parse_cursor(value)
    except ValueError as exc:
        raise _invalid(str(exc), cursor=value) from None


def _wants_arrow(request: Request) -> bool:
    """Content negotiation of the diff answer: an Arrow page when the Accept header
    names the Arrow stream type (docs/http-api.md, "Arrow pages"); JSON otherwise."""
    accept = request.header(b"accept")
    if accept is None:
        return False
    media = (part.split(b";", 1)[0].strip().lower() for part in accept.split(b","))
    return _ARROW in media


def _empty(result: DiffResult) -> bool:
    """Nothing to hand the reader yet, and nothing left to scan."""
    return result.count == 0 and result.tombstone is None and result.caught_up
