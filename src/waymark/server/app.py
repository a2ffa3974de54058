"""The ASGI application: routes every /v0 request to its handler over one engine.

The routes are the protocol's endpoint table; :attr:`App.handlers` names the handler
of each operation id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from time import perf_counter

import msgspec

from ..clock import Clock
from ..log import CHANGES_TOPIC, Engine, ErrorCode, TopicError
from ..log.storage.store import Store
from ..protocol import ENDPOINTS, Endpoint
from ..protocol.openapi import document
from ..protocol.scopes import ALL_SCOPES, ScopeKind, WhoAmI, allows
from .audit import AuditLog
from .auth import TOKEN, Token, Tokens
from .browser import allow_origin
from .changes import ChangesApi
from .config import ServerConfig
from .console import Console
from .delivery import Deliveries
from .errors import as_topic_error, error_response, internal_error, method_not_allowed, not_found
from .handlers import TopicApi
from .history import AppendHistory
from .http import Handler, Receive, Request, Response, Scope, Send
from .metrics import CONTENT_TYPE, Metrics
from .notify import Notifier
from .queues import QueueApi
from .ratelimit import RateLimits
from .reports import ReportsApi
from .routers import Forwarder, RouterApi
from .routing import PathTable
from .sse import EventStream
from .writers import WritersApi

# Refusals that a handler raises, counted on /metrics by code and audited
# (docs/security.md, Limits, "Browsers" and "Audit log").
LIMIT_CODES = frozenset((ErrorCode.BODY_TOO_LARGE, ErrorCode.TOO_MANY_TOPICS,
                         ErrorCode.STAGING_FULL, ErrorCode.UNSUPPORTED_MEDIA_TYPE))  # fmt: skip

# How long a clean stop waits for its last change checkpoint to be durable.
LAST_CHECKPOINT_S = 5.0
log = logging.getLogger("waymark.server")


class App:
    """The waymark HTTP server as an ASGI callable.

    It owns its :class:`~waymark.log.Engine`; every engine call happens on the
    event-loop thread, which is what keeps the engine single-threaded.
    """

    def __init__(
        self,
        config: ServerConfig | None = None,
        *,
        engine: Engine | None = None,
        store: Store | None = None,
        clock: Clock | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        """Serve ``engine`` (a recovered durable one, opened with ``config``'s engine
        sections), or a new in-memory engine on ``clock`` with them.

        ``config`` is everything ``waymark serve`` is told (:mod:`.config`); the
        keywords are what is built from it or injected: the engine, its ``store`` (whose
        tail is then sealed every ``storage.seal_interval_s`` seconds in which anything
        was written), and the opened ``audit`` log, which gets a line per refused request
        and per admin action (docs/security.md, "Audit log"). Every
        ``changes.checkpoint_interval_s`` seconds that committed anything one change
        checkpoint is written (docs/semantics/recovery.md §1). With ``auth.tokens`` every
        route but the open ones needs a bearer token with its scope; ``http.browser``
        refuses requests by their Host and Origin (docs/security.md, "Browsers").
        """
        self.config = config = config or ServerConfig()
        self.browser = config.http.browser
        self.audit = audit
        self.tokens_path = config.auth.tokens
        self.tokens = Tokens.load(self.tokens_path) if self.tokens_path is not None else None
        self.store = store
        self._seals: asyncio.Task[None] | None = None
        self._checkpoints: asyncio.Task[None] | None = None
        # Every topic that handed out no seq for this long gets its seq ceiling trimmed to
        # its exact head (Engine.trim_ceilings), so a crash while it is idle reports no gap.
        self._trims: asyncio.Task[None] | None = None
        self.engine = engine or Engine(config.engine, clock=clock)
        self.limits = self.engine.limits
        # Token expiry and rate limits read the engine's clock (tests drive it).
        self.rate_limits = RateLimits(self.engine.clock)
        # Readers' wakeups, forwarding and recovery steps run by topic priority
        # (docs/topics.md, Priority).
        self.deliveries = Deliveries(self.engine, config.streams.delivery_budget)
        self.notifier = Notifier(self.deliveries)
        self.engine.add_listener(self.notifier.notify)
        # routers (docs/semantics/topics.md §8.1): off every append's ack path
        self.forwarder = Forwarder(self.engine, self.deliveries)
        self.engine.add_listener(self.forwarder.poke)
        self.metrics = Metrics(
            lambda: self.engine.topic_count, self.engine.replay_backlog, self._dead_letters
        )
        # Append-rate history for the console's charts (docs/console.md, "Rate history").
        self.history = AppendHistory(max(1, int(config.console.history_interval_s * 1000)))
        self.engine.add_listener(self.history.changed)
        self._history_ticks: asyncio.Task[None] | None = None
        api = TopicApi(
            self.engine,
            self.limits,
            self.notifier,
            self.metrics,
            config.streams,
            self.history,
            self._durable,
        )
        writers = WritersApi(self.engine, self.limits, self.metrics)
        queues = QueueApi(
            self.engine, self.limits, self.notifier, self.metrics, config.streams.heartbeat_s
        )
        routers = RouterApi(self.engine, self.limits)
        if config.changes.tracked:
            self.engine.track_changes(config.changes.window_ms)
        changes = ChangesApi(self.engine, self.notifier, self.metrics, config.streams.heartbeat_s)
        reports = ReportsApi(self.engine, self.limits)  # folds, recovery clients, pipelines
        self.metrics.collectors.append(reports.collect)
        if store is not None:
            self.metrics.wal_writer_failures = store.wal.writer_failures
        # The handler of every operation id of the endpoint table.
        self.handlers: dict[str, Handler] = {
            "health": api.health,
            "whoami": self._whoami,
            "listTopics": api.list_topics,
            "putTopic": api.put_topic,
            "getTopic": api.get_topic,
            "deleteTopic": api.delete_topic,
            "getTopicHistory": api.get_topic_history,
            "append": api.append,
            "diff": api.diff,
            "watch": api.watch,
            "deleteRecords": api.delete,
            "openWriter": writers.open_writer,
            "listWriters": writers.list_writers,
            "stage": writers.stage,
            "publish": writers.publish,
            "claimJobs": queues.claim,
            "ackJobs": queues.ack,
            "nackJobs": queues.nack,
            "extendLeases": queues.extend,
            "redrive": queues.redrive,
            "work": queues.work,
            "listRouters": routers.list_routers,
            "putRouter": routers.put_router,
            "getRouter": routers.get_router,
            "deleteRouter": routers.delete_router,
            "listCheckpoints": changes.list_checkpoints,
            "watchCheckpoints": changes.watch,
            "reportFold": reports.report_fold,
            "listFolds": reports.list_folds,
            "getFold": reports.get_fold,
            "reportRecovery": reports.report_recovery,
            "listRecoveryClients": reports.list_recovery_clients,
            "forgetFold": reports.forget_fold,
            "forgetRecoveryClient": reports.forget_recovery_client,
            "reportPipeline": reports.report_pipeline,
            "listPipelines": reports.list_pipelines,
            "forgetPipeline": reports.forget_pipeline,
            "openapi": self._openapi_json,
            "metrics": self._metrics,
        }
        endpoints = [
            dataclasses.replace(e, scope=ScopeKind.OPEN)
            if config.auth.open_metrics and e.operation_id == "metrics" else e
            for e in ENDPOINTS
        ]  # fmt: skip
        self.paths = PathTable.build(endpoints, self.handlers)
        self._openapi = msgspec.json.encode(
            document(auth=self.tokens is not None, endpoints=endpoints)
        )
        # The web console's files at /ui: outside the endpoint table, which is the API.
        self.console = Console()

    def reload_tokens(self) -> None:
        """Re-read the tokens file (SIGHUP); a file that does not load keeps the old
        tokens, and says why."""
        if self.tokens_path is None:
            return
        try:
            self.tokens = Tokens.load(self.tokens_path)
        except ValueError as exc:
            log.error("tokens not reloaded, the previous ones stay: %s", exc)
            if self.audit is not None:
                self.audit.write("tokens_not_reloaded", reason=str(exc))
            return
        self.rate_limits.forget_except(set(self.tokens.by_id))
        if self.audit is not None:
            names = sorted(t.name for t in self.tokens.by_id.values())
            self.audit.write("tokens_reloaded", tokens=names)
        # Open streams re-check their token now: a revoked or narrowed one ends them.
        self.notifier.wake_all()

    def _durable(self, topic: str) -> None:
        """An fsync append's sync landed: its records are readable only now, after the
        commit that woke readers and routers, so wake both again (and sample its new
        head in the rate history)."""
        self.notifier.notify(topic)
        self.forwarder.poke(topic)
        self.history.changed(topic)

    def _admit(self, scope: Scope, endpoint: Endpoint, params: dict[str, str]) -> TopicError | None:
        """The refusal of a request before its handler runs: no or an unknown token
        (401), a token without the endpoint's scope (403), or an SSE stream past the
        server's limit (429). None admits it."""
        if self.tokens is not None and endpoint.scope is not ScopeKind.OPEN:
            refusal = self._authorize(scope, endpoint, params)
            if refusal is None:
                refusal = self.rate_limits.take(scope[TOKEN])  # admitted ones only
            if refusal is not None:
                return refusal
        if endpoint.stream is not None and endpoint.stream[0] == "text/event-stream":
            limit = self.config.streams.max_streams
            # The stream counts itself before its first await, and no handler of a
            # stream awaits: no two requests pass this check for one free slot.
            if self.metrics.watchers >= limit:
                return TopicError(ErrorCode.TOO_MANY_STREAMS,
                                  f"the server holds its limit of {limit} SSE streams",
                                  {"max_streams": limit})  # fmt: skip
        return None

    def _authorize(
        self, scope: Scope, endpoint: Endpoint, params: dict[str, str]
    ) -> TopicError | None:
        """401 or 403 for the request's token under the tokens loaded now; an open
        stream asks again before each send (docs/security.md, "Reloading tokens")."""
        if self.tokens is None:
            return None
        authorization = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value
                break
        token = self.tokens.verify(authorization)
        if token is None:
            return TopicError(
                ErrorCode.UNAUTHORIZED,
                "a valid bearer token is needed (Authorization: Bearer …)",
            )
        scope[TOKEN] = token
        if (expired := self._expired(token)) is not None:
            return expired
        if not allows(token.grants, endpoint.scope, params.get("topic")):
            detail = {"token": token.name, "needs": endpoint.scope.value}
            if "topic" in params:
                detail["topic"] = params["topic"]
            return TopicError(ErrorCode.FORBIDDEN,
                              f"token {token.name!r} lacks the {endpoint.scope} scope "
                              "this needs", detail)  # fmt: skip
        return None

    def _expired(self, token: Token) -> TopicError | None:
        if token.expires_ms is None or not token.expired(self.engine.clock.now_ms()):
            return None
        return TopicError(ErrorCode.TOKEN_EXPIRED,
                          f"token {token.name!r} has expired; make a new one "
                          "(waymark token new)",
                          {"token": token.name, "expires_ms": token.expires_ms})  # fmt: skip

    def _stream_admission(
        self, scope: Scope, endpoint: Endpoint, params: dict[str, str]
    ) -> Callable[[], TopicError | None]:
        """The check an open stream makes before each read. The decision made when it
        opened holds until the tokens file is reloaded, which wakes every stream to
        decide again (a revoked or narrowed token ends it); expiry is a clock
        comparison, made every time. Verifying the token again before every read cost
        a salted SHA-256 per stream per commit (docs/security.md, Tokens)."""
        decided = self.tokens

        def admitted() -> TopicError | None:
            nonlocal decided
            if self.tokens is not decided:
                decided = self.tokens
                return self._authorize(scope, endpoint, params)  # also sets scope[TOKEN]
            return self._expired(scope[TOKEN])

        return admitted

    async def _whoami(self, request: Request) -> Response:
        token: Token | None = request.scope.get(TOKEN)
        if token is None:  # auth is off: anyone may do anything
            return Response(msgspec.json.encode(WhoAmI(None, list(ALL_SCOPES), False)))
        scopes = [str(g) for g in token.grants]
        return Response(msgspec.json.encode(WhoAmI(token.name, scopes, True)))

    def close(self) -> None:
        """Begin shutdown: long-polls return and SSE streams end, so connections drain."""
        self.notifier.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The request path is inline, not a method: one coroutine less per request.
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(receive, send)
            return
        start = perf_counter()
        cors = None
        if self.browser is not None:
            refusal, cors = self.browser.check(scope)
            if refusal is not None or (cors is not None and scope["method"] == "OPTIONS"):
                await self._answer_browser(scope, refusal, cors, send)
                return
        found = self.paths.resolve(scope.get("raw_path") or scope["path"])
        if found is None:
            if Console.owns(scope["path"]):
                label, response = "/ui", self.console.serve(scope["method"], scope["path"])
            else:
                label, response = "unmatched", not_found(scope["path"])
        else:
            route, params = found
            label = route.template
            endpoint = route.endpoints.get(scope["method"])
            if "$" in params.get("topic", ""):
                # Internal logs (a queue's leases) are named so no request can reach them.
                response = error_response(TopicError(
                    ErrorCode.INVALID_TOPIC_NAME, "topic names are [A-Za-z0-9._:-]",
                    {"topic": params["topic"]}))  # fmt: skip
            elif endpoint is None:
                response = method_not_allowed(scope["method"], tuple(route.methods))
            elif (self.tokens is not None or endpoint.stream is not None) and (
                refusal := self._admit(scope, endpoint, params)
            ) is not None:
                self.metrics.refused(refusal.code)
                self._audit_refusal(scope, refusal)
                response = error_response(refusal)
                if refusal.status == 401:  # RFC 6750
                    response.headers = ((b"www-authenticate", b'Bearer realm="waymark"'),)
                elif refusal.code is ErrorCode.RATE_LIMITED:
                    retry = b"%d" % refusal.detail["retry_after_s"]
                    response.headers = ((b"retry-after", retry),)
            else:
                try:
                    response = await route.methods[scope["method"]](Request(scope, receive, params))
                    if (
                        isinstance(response, EventStream)
                        and self.tokens is not None
                        and (endpoint.scope is not ScopeKind.OPEN)
                    ):
                        response.admitted = self._stream_admission(scope, endpoint, params)
                except Exception as exc:
                    error = as_topic_error(exc)
                    if error is None:
                        response = internal_error(exc)
                    else:
                        if error.code in LIMIT_CODES:
                            self.metrics.refused(error.code)
                            self._audit_refusal(scope, error)
                        response = error_response(error)
                if (
                    self.audit is not None
                    and endpoint.scope is ScopeKind.ADMIN
                    and scope["method"] != "GET"
                ):
                    self._audit_admin(scope, endpoint, response.status)
        self.metrics.observe(label, response.status, perf_counter() - start)
        if cors is not None:
            allow_origin(response, cors)
        if type(response) is Response:  # complete: sent here, one coroutine less per request
            await send(response.start())
            await send({"type": "http.response.body", "body": response.body})
        else:
            await response(send, receive)

    def _audit_refusal(self, scope: Scope, refusal: TopicError) -> None:
        if self.audit is None:
            return
        token: Token | None = scope.get(TOKEN)
        client = scope.get("client")
        self.audit.refused(
            refusal.code, refusal.status, client[0] if client else None,
            method=scope["method"], path=scope["path"],
            token=None if token is None else token.name, detail=refusal.detail,
        )  # fmt: skip

    def _audit_admin(self, scope: Scope, endpoint: Endpoint, status: int) -> None:
        assert self.audit is not None
        token: Token | None = scope.get(TOKEN)
        client = scope.get("client")
        self.audit.write(
            "admin", operation=endpoint.operation_id, method=scope["method"],
            path=scope["path"], status=status, client=client[0] if client else None,
            token=None if token is None else token.name,
        )  # fmt: skip

    async def _answer_browser(
        self, scope: Scope, refusal: TopicError | None, cors: bytes | None, send: Send
    ) -> None:
        """A refusal by Host or Origin, or an allowed origin's CORS preflight."""
        if refusal is not None:
            self.metrics.refused(refusal.code)
            self._audit_refusal(scope, refusal)
            response = error_response(refusal)
        else:
            assert self.browser is not None and cors is not None
            response = self.browser.preflight(cors)
        self.metrics.observe("browser", response.status, 0.0)
        await send(response.start())
        await send({"type": "http.response.body", "body": response.body})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.forwarder.resume()
                # The server is ready before memory topics are replayed
                # (docs/durability.md, memory topics recover in the background).
                for name in self.engine.replay_pending():
                    self.deliveries.add(self._replay_step, name)
                if self.store is not None:
                    self._seals = asyncio.create_task(self._seal_loop(self.store))
                    self._trims = asyncio.create_task(self._trim_loop())
                if self.engine.tracks_changes:
                    self._checkpoints = asyncio.create_task(self._checkpoint_loop())
                self._history_ticks = asyncio.create_task(self._history_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.close()
                if self._seals is not None:
                    self._seals.cancel()
                if self._trims is not None:
                    self._trims.cancel()
                if self._history_ticks is not None:
                    self._history_ticks.cancel()
                if self._checkpoints is not None:
                    self._checkpoints.cancel()
                    await self._last_checkpoint()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _seal_loop(self, store: Store) -> None:
        """Seal and trim in the background: the engine thread only takes the quick steps."""
        sealer = store.sealer
        written = store.wal.submitted()
        while True:
            await asyncio.sleep(self.config.storage.seal_interval_s)
            if self.engine.replay_pending():
                continue  # a seal now would apply the whole rest of the replay at once
            if store.wal.writer_failures():
                continue  # refused until a restart (docs/durability.md, "A failed WAL writer")
            if store.wal.submitted() == written or not sealer.running.acquire(False):
                continue
            try:
                written = await self._seal(store)
            except Exception:
                # A full disk, say. Nothing is lost: the WAL is trimmed only once a
                # catalog naming the segments is durable, and the next seal plans again
                # what this one did not finish (docs/durability.md, "Segments and seals").
                # Ending the loop instead would leave the WAL growing for good.
                self.metrics.seal_failures += 1
                written = -1  # sealed nothing: the next interval seals even if idle
                log.exception(
                    "seal failed; trying again in %s s", self.config.storage.seal_interval_s
                )
            finally:
                sealer.running.release()

    async def _seal(self, store: Store) -> int:
        """One seal; returns the WAL's count of submitted writes it covers. Its plan holds
        every chunk it sealed, with the chunk's laid-out bytes: a local of the loop, it
        kept them all in memory until the next seal's plan replaced it — for good on an
        idle server — when they are to leave memory once swapped for their segments
        (docs/durability.md, "Segments and seals", step 3)."""
        sealer = store.sealer
        plan = sealer.begin(self.engine)
        written = store.wal.submitted()
        await asyncio.to_thread(sealer.write, plan)
        sealer.finish(self.engine, plan)
        self.metrics.seals += 1
        return written

    async def _history_loop(self) -> None:
        """Sample the topics that changed, every history interval."""
        history, engine = self.history, self.engine

        def read(topic: str) -> tuple[int, int, int] | None:
            try:
                state = engine.get_topic(topic, touch=False)
            except TopicError:  # deleted meanwhile, or an internal log
                return None
            return state.epoch, state.head_seq, state.bytes

        while True:
            await asyncio.sleep(history.interval_ms / 1000)
            history.tick(engine.clock.now_ms(), read)

    async def _checkpoint_loop(self) -> None:
        """One change checkpoint per interval that committed anything
        (docs/semantics/recovery.md §1.2); readers see it once its sync lands."""
        while True:
            await asyncio.sleep(self.config.changes.checkpoint_interval_s)
            try:
                result = self.engine.emit_checkpoint()
            except TopicError:
                continue  # its WAL shard cannot write now: the changes wait for the next one
            if result is not None and result.commit is not None:
                synced = asyncio.ensure_future(result.commit.wait())
                synced.add_done_callback(lambda _: self.notifier.notify(CHANGES_TOPIC))

    async def _last_checkpoint(self) -> None:
        """On a clean stop, one change checkpoint of everything committed so far, once
        it is durable (docs/semantics/recovery.md §1.6). Should it fail, nothing is
        lost: the seal keeps the changes and the next start names them."""
        try:
            async with asyncio.timeout(LAST_CHECKPOINT_S):
                for name in self.engine.unsynced_change_topics():
                    if (commit := self.engine.commit_point(name)) is not None:
                        await commit.wait()
                result = self.engine.emit_checkpoint()
                if result is not None and result.commit is not None:
                    await result.commit.wait()
        except (TopicError, OSError, TimeoutError):
            pass

    async def _trim_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.engine.ceiling_trim_s)
            self.engine.trim_ceilings()

    def _replay_step(self, name: str) -> int | None:
        """Apply a step of the WAL frames gradual replay set aside for memory topic
        ``name``; the rest is another step, in a later round. A step is milliseconds of
        work: it takes the whole round."""
        if self.notifier.closing:
            return None
        if self.engine.replay_step(name):
            self.deliveries.add(self._replay_step, name)
        return self.deliveries.budget

    def _dead_letters(self) -> tuple[int, int]:
        return self.engine.dead_letter_counts()

    async def _openapi_json(self, request: Request) -> Response:
        return Response(self._openapi)

    async def _metrics(self, request: Request) -> Response:
        return Response(self.metrics.render(), content_type=CONTENT_TYPE)
