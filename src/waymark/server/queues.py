"""The /v0 queue routes (docs/semantics/topics.md §10) over :mod:`waymark.log.queue`.

* ``POST /v0/topics/{q}/claim`` ``{node, max, lease_ms?}`` -> ``{"jobs": [...]}``: each
  job is the wire record plus ``lease_id``, ``deadline`` and ``delivery``.
* ``POST /v0/topics/{q}/ack`` | ``/nack`` (``delay_ms``) | ``/extend`` (``lease_ms``)
  ``{node, seqs, lease_ids?}``: seqs this node no longer holds are skipped, not refused.
* ``GET /v0/topics/{q}/work?node=&max=&lease_ms=``: pushed workers, one SSE ``job``
  event per lease, at most ``max`` held at once.
* ``POST /v0/topics/{q}/redrive`` ``{max?}``: dead letters back into the queue.

A log topic answers every one of them with 409 ``not_a_queue``. With
``claim_jitter_ms`` > 0 a claim (or a /work stream wanting more) joins the queue's
open cohort; when the window closes the engine serves the whole cohort in one pass.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

import msgspec
import orjson
from msgspec import Meta, Struct

from ..log import Engine, ErrorCode, Limits, TopicError
from ..log.queue import ClaimedJob, ClaimRequest
from .http import Receive, Request, Response, Send
from .metrics import Metrics
from .notify import Notifier
from .openapi import Operation
from .schemas import Record, Seq

Node = Annotated[str, Meta(min_length=1, max_length=128)]
Max = Annotated[int, Meta(ge=1, le=10_000)]
Millis = Annotated[int, Meta(ge=1, le=2**53)]
HEARTBEAT = b": heartbeat\n\n"


# --- wire ------------------------------------------------------------------------------


class ClaimBody(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{q}/claim``: lease up to ``max`` jobs to ``node``."""

    node: Node
    max: Max = 1
    lease_ms: Millis | None = None


class AckBody(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{q}/ack``: done; the jobs are permanently deleted."""

    node: Node
    seqs: Annotated[list[Seq], Meta(min_length=1, max_length=10_000)]
    lease_ids: list[str] | None = None


class NackBody(AckBody, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{q}/nack``: release now; claimable again after ``delay_ms``."""

    delay_ms: Annotated[int, Meta(ge=0, le=2**53)] = 0


class ExtendBody(AckBody, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{q}/extend``: new deadline ``now + lease_ms`` (the queue's default
    when absent)."""

    lease_ms: Millis | None = None


class RedriveBody(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{q}/redrive``: move up to ``max`` dead letters back."""

    max: Max = 1000


class Job(Record, kw_only=True, omit_defaults=True):
    """A leased job: the stored record plus its lease."""

    lease_id: str
    deadline: int
    delivery: int


class ClaimResponse(Struct):
    jobs: list[Job]


class AckResponse(Struct):
    acked: list[int]
    skipped: list[int]


class NackResponse(Struct):
    released: list[int]
    skipped: list[int]


class ExtendResponse(Struct):
    extended: list[int]
    deadlines: list[int]
    skipped: list[int]


class RedriveResponse(Struct):
    redriven: int
    seqs: list[int]


_claim = msgspec.json.Decoder(ClaimBody)
_ack = msgspec.json.Decoder(AckBody)
_nack = msgspec.json.Decoder(NackBody)
_extend = msgspec.json.Decoder(ExtendBody)
_redrive = msgspec.json.Decoder(RedriveBody)


def _jobs_json(jobs: list[ClaimedJob]) -> bytes:
    return b'{"jobs":[' + b",".join(job.to_json() for job in jobs) + b"]}"


# --- the coalescing window ---------------------------------------------------------------


class Cohorts:
    """Per queue, the claims waiting for the current window to close
    (docs/semantics/topics.md §10.3)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._open: dict[str, list[tuple[ClaimRequest, asyncio.Future[list[ClaimedJob]]]]] = {}

    async def claim(self, name: str, request: ClaimRequest) -> list[ClaimedJob]:
        jitter_ms = self.engine.queues.jitter_ms(name)
        if not jitter_ms:
            return self.engine.claim_cohort(name, [request])[0]
        loop = asyncio.get_running_loop()
        cohort = self._open.get(name)
        if cohort is None:
            cohort = self._open[name] = []
            loop.call_later(jitter_ms / 1000, self._serve, name)
        future: asyncio.Future[list[ClaimedJob]] = loop.create_future()
        cohort.append((request, future))
        return await future

    def _serve(self, name: str) -> None:
        cohort = self._open.pop(name)
        try:
            grants = self.engine.claim_cohort(name, [request for request, _ in cohort])
        except TopicError as error:
            for _, future in cohort:
                if not future.done():
                    future.set_exception(error)
            return
        for (request, future), jobs in zip(cohort, grants, strict=True):
            if not future.done():
                future.set_result(jobs)
            elif jobs:
                # The claimer went away while it waited: hand its jobs straight back.
                seqs = [job.seq for job in jobs]
                self.engine.nack(name, request.node, seqs, [job.lease_id for job in jobs])


# --- routes --------------------------------------------------------------------------------


class QueueApi:
    def __init__(
        self, engine: Engine, limits: Limits, notifier: Notifier, metrics: Metrics,
        heartbeat_s: float,
    ) -> None:  # fmt: skip
        self.engine = engine
        self.max_body = limits.max_body_bytes
        self.notifier = notifier
        self.metrics = metrics
        self.heartbeat_s = heartbeat_s
        self.cohorts = Cohorts(engine)

    async def claim(self, request: Request) -> Response:
        name = request.params["topic"]
        body = _claim.decode(await request.body(self.max_body))
        jobs = await self.cohorts.claim(name, ClaimRequest(body.node, body.max, body.lease_ms))
        self.metrics.jobs_claimed += len(jobs)
        return Response(_jobs_json(jobs))

    async def ack(self, request: Request) -> Response:
        name = request.params["topic"]
        body = _ack.decode(await request.body(self.max_body))
        settled = self.engine.ack(name, body.node, body.seqs, body.lease_ids)
        if settled.must_sync and settled.commit is not None:
            await settled.commit.wait()  # an fsync queue's ack is durable when answered
        self.metrics.jobs_acked += len(settled.done)
        return Response(orjson.dumps({"acked": settled.done, "skipped": settled.skipped}))

    async def nack(self, request: Request) -> Response:
        name = request.params["topic"]
        body = _nack.decode(await request.body(self.max_body))
        settled = self.engine.nack(name, body.node, body.seqs, body.lease_ids, body.delay_ms)
        self.metrics.jobs_released += len(settled.done)
        return Response(orjson.dumps({"released": settled.done, "skipped": settled.skipped}))

    async def extend(self, request: Request) -> Response:
        name = request.params["topic"]
        body = _extend.decode(await request.body(self.max_body))
        settled = self.engine.extend(name, body.node, body.seqs, body.lease_ids, body.lease_ms)
        return Response(
            orjson.dumps(
                {
                    "extended": settled.done,
                    "deadlines": settled.deadlines or [],
                    "skipped": settled.skipped,
                }
            )
        )

    async def redrive(self, request: Request) -> Response:
        name = request.params["topic"]
        raw = await request.body(self.max_body)
        body = _redrive.decode(raw) if raw else RedriveBody()
        result = self.engine.redrive(name, body.max)
        if result.must_sync and result.commit is not None:
            await result.commit.wait()
        self.metrics.jobs_redriven += len(result.seqs)
        return Response(orjson.dumps({"redriven": len(result.seqs), "seqs": result.seqs}))

    async def work(self, request: Request) -> Response:
        name = request.params["topic"]
        node = _query(request, "node")
        if not node:
            raise TopicError(ErrorCode.INVALID_REQUEST, "node is required: /work?node=<id>")
        most = _query_int(request, "max", 1)
        lease_ms = _query_int(request, "lease_ms", 0) or None
        if not 1 <= most <= 10_000:
            raise TopicError(ErrorCode.INVALID_REQUEST, "max is 1..10000", {"max": most})
        self.engine.queues.jitter_ms(name)  # 404 / 409 not_a_queue before the stream starts
        return WorkStream(self, name, ClaimRequest(node, most, lease_ms))


def _query(request: Request, name: str) -> str | None:
    values = request.query.get(name)
    return values[-1] if values else None


def _query_int(request: Request, name: str, default: int) -> int:
    value = _query(request, name)
    if value is None:
        return default
    if not value.isdigit():
        raise TopicError(ErrorCode.INVALID_REQUEST, f"{name} is a non-negative integer")
    return int(value)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class WorkStream(Response):
    """Pushed delivery: the stream claims for its worker whenever it holds fewer than
    ``max`` live leases, as a member of the claim cohort. Leases it still holds when the
    worker disconnects are released at once rather than left to expire."""

    def __init__(self, api: QueueApi, name: str, want: ClaimRequest) -> None:
        super().__init__(
            b"", 200, b"text/event-stream",
            ((b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")),
        )  # fmt: skip
        self.api, self.name, self.want = api, name, want
        self.held: dict[int, str] = {}  # seq -> lease_id delivered on this stream

    async def __call__(self, send: Send, receive: Receive) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", self.content_type), *self.headers]})  # fmt: skip
        disconnected = asyncio.ensure_future(_disconnected(receive))
        self.api.metrics.watchers += 1
        try:
            await self._pump(send, disconnected)
        except TopicError as error:
            body = b"event: error\ndata: " + orjson.dumps(error.to_wire()) + b"\n\n"
            await send({"type": "http.response.body", "body": body, "more_body": True})
        finally:
            self.api.metrics.watchers -= 1
            disconnected.cancel()
            self._release()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send, disconnected: asyncio.Future[None]) -> None:
        api, engine = self.api, self.api.engine
        loop = asyncio.get_running_loop()
        last_sent = loop.time()
        while not (disconnected.done() or api.notifier.closing):
            node = self.want.node
            self.held = {s: lease for s, lease in self.held.items()
                         if engine.queues.holds(self.name, s, node, lease)}  # fmt: skip
            credit = self.want.max - len(self.held)
            # Taken before the claim: a commit while a cohort claim waits still wakes us.
            changed = api.notifier.next_change(self.name)
            if credit > 0:
                want = ClaimRequest(node, credit, self.want.lease_ms)
                jobs = await api.cohorts.claim(self.name, want)
                if jobs:
                    api.metrics.jobs_claimed += len(jobs)
                    self.held.update((job.seq, job.lease_id) for job in jobs)
                    chunk = b"".join(_event(job) for job in jobs)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    last_sent = loop.time()
                    continue
            timeout = api.heartbeat_s - (loop.time() - last_sent)
            due = engine.queues.next_due(self.name)
            if due is not None:
                # Expiry is strict (now > deadline): look again just after it.
                timeout = min(timeout, (due - engine.clock.now_ms() + 1) / 1000)
            await api.notifier.wait(self.name, max(timeout, 0.001), disconnected, changed)
            if loop.time() - last_sent >= api.heartbeat_s:
                await send({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})
                last_sent = loop.time()

    def _release(self) -> None:
        if not self.held:
            return
        # If the queue is gone or storage refuses, the leases simply expire instead.
        with contextlib.suppress(TopicError):
            self.api.engine.nack(
                self.name, self.want.node, list(self.held), list(self.held.values())
            )


def _event(job: ClaimedJob) -> bytes:
    data = job.to_json()
    if b"\n" in data or b"\r" in data:
        # SSE data may not hold line breaks; a producer's JSON verbatim may.
        data = orjson.dumps(orjson.loads(data))
    return b"event: job\nid: %d\ndata: %b\n\n" % (job.seq, data)


_Q = "/v0/topics/{topic}"
_CONFLICT = (400, 404, 409)

OPERATIONS = (
    Operation("post", f"{_Q}/claim", "claimJobs",
              "Lease up to max jobs (reclaimed first, then fresh); 409 not_a_queue on a log",
              ok_type=ClaimResponse, body=ClaimBody, errors=_CONFLICT),
    Operation("post", f"{_Q}/ack", "ackJobs",
              "Done: permanently delete jobs this node holds; others are skipped",
              ok_type=AckResponse, body=AckBody, errors=_CONFLICT),
    Operation("post", f"{_Q}/nack", "nackJobs",
              "Release leases early; the jobs are claimable again after delay_ms",
              ok_type=NackResponse, body=NackBody, errors=_CONFLICT),
    Operation("post", f"{_Q}/extend", "extendLeases",
              "Heartbeat: new deadline now + lease_ms; delivery counter unchanged",
              ok_type=ExtendResponse, body=ExtendBody, errors=_CONFLICT),
    Operation("post", f"{_Q}/redrive", "redrive",
              "Move dead letters of this queue from its dead_letter topic back into it",
              ok_type=RedriveResponse, body=RedriveBody, body_required=False, errors=_CONFLICT),
    Operation("get", f"{_Q}/work", "work",
              "Server-Sent Events for pushed workers: `event: job` per lease, at most max "
              "held at once; the stream joins the claim cohort",
              raw_ok=("text/event-stream", "An endless stream of leased jobs"), errors=_CONFLICT,
              query=({"name": "node", "in": "query", "required": True,
                      "schema": {"type": "string"}, "description": "the worker's node id"},
                     {"name": "max", "in": "query", "required": False,
                      "schema": {"type": "integer", "minimum": 1, "maximum": 10_000},
                      "description": "leases held at once (default 1)"},
                     {"name": "lease_ms", "in": "query", "required": False,
                      "schema": {"type": "integer", "minimum": 1},
                      "description": "lease length (default: the queue's lease_ms)"})),
)  # fmt: skip
