"""The /v0 queue routes (docs/semantics/topics.md §10) over :mod:`waymark.log.queue`; their
bodies are :mod:`waymark.protocol.queues`.

A claim's answer is assembled from each job's stored wire JSON plus its lease
(:meth:`~waymark.log.queue.ClaimedJob.to_json`), not re-encoded; the other answers
are protocol structs. ``GET /v0/topics/{q}/work`` pushes one SSE ``job`` event per
lease, at most ``max`` held at once.

A log topic answers every one of them with 409 ``not_a_queue``. With
``claim_jitter_ms`` > 0 a claim (or a /work stream wanting more) joins the queue's
open cohort; when the window closes the engine serves the whole cohort in one pass.
"""

from __future__ import annotations

import asyncio
import contextlib

import msgspec

from ..log import Engine, ErrorCode, Limits, TopicError
from ..log.queue import ClaimedJob, ClaimRequest
from ..protocol import (
    AckBody,
    AckResponse,
    ClaimBody,
    ExtendBody,
    ExtendResponse,
    NackBody,
    NackResponse,
    RedriveBody,
    RedriveResponse,
)
from ..protocol.limits import MAX_BATCH
from .http import BodyDecoder, Request, Response
from .metrics import Metrics
from .notify import Notifier
from .sse import EventStream, one_line

_encode = msgspec.json.encode
_claim = BodyDecoder(ClaimBody)
_ack = BodyDecoder(AckBody)
_nack = BodyDecoder(NackBody)
_extend = BodyDecoder(ExtendBody)
_redrive = BodyDecoder(RedriveBody)


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
        jitter_ms = self.engine.claim_jitter_ms(name)
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
        return Response(_encode(AckResponse(settled.done, settled.skipped)))

    async def nack(self, request: Request) -> Response:
        name = request.params["topic"]
        body = _nack.decode(await request.body(self.max_body))
        settled = self.engine.nack(name, body.node, body.seqs, body.lease_ids, body.delay_ms)
        self.metrics.jobs_released += len(settled.done)
        return Response(_encode(NackResponse(settled.done, settled.skipped)))

    async def extend(self, request: Request) -> Response:
        name = request.params["topic"]
        body = _extend.decode(await request.body(self.max_body))
        settled = self.engine.extend(name, body.node, body.seqs, body.lease_ids, body.lease_ms)
        return Response(
            _encode(ExtendResponse(settled.done, settled.deadlines or [], settled.skipped))
        )

    async def redrive(self, request: Request) -> Response:
        name = request.params["topic"]
        raw = await request.body(self.max_body)
        body = _redrive.decode(raw) if raw else RedriveBody()
        result = self.engine.redrive(name, body.max)
        if result.must_sync and result.commit is not None:
            await result.commit.wait()
        self.metrics.jobs_redriven += len(result.seqs)
        return Response(_encode(RedriveResponse(len(result.seqs), result.seqs)))

    async def work(self, request: Request) -> Response:
        name = request.params["topic"]
        node = _query(request, "node")
        if not node:
            raise TopicError(ErrorCode.INVALID_REQUEST, "node is required: /work?node=<id>")
        most = _query_int(request, "max", 1)
        lease_ms = _query_int(request, "lease_ms", 0) or None
        if not 1 <= most <= MAX_BATCH:
            raise TopicError(ErrorCode.INVALID_REQUEST, f"max is 1..{MAX_BATCH}", {"max": most})
        self.engine.claim_jitter_ms(name)  # 404 / 409 not_a_queue before the stream starts
        feed = WorkFeed(self, name, ClaimRequest(node, most, lease_ms))
        return EventStream(feed, self.notifier, self.metrics, self.heartbeat_s)


def _query(request: Request, name: str) -> str | None:
    values = request.query.get(name)
    return values[-1] if values else None


def _query_int(request: Request, name: str, default: int) -> int:
    value = _query(request, name)
    if value is None:
        return default
    if not (value.isascii() and value.isdigit()):  # int() refuses "³"
        raise TopicError(ErrorCode.INVALID_REQUEST, f"{name} is a non-negative integer")
    return int(value)


class WorkFeed:
    """Pushed delivery, the feed of a /work :class:`~waymark.server.sse.EventStream`: it
    claims for its worker whenever it holds fewer than ``max`` live leases, as a member
    of the claim cohort. Leases it still holds when the stream ends are released at once
    rather than left to expire."""

    def __init__(self, api: QueueApi, name: str, want: ClaimRequest) -> None:
        self.api, self.topic, self.want = api, name, want
        self.held: dict[int, str] = {}  # seq -> lease_id delivered on this stream

    async def next(self) -> tuple[bytes, bool]:
        api, engine, node = self.api, self.api.engine, self.want.node
        self.held = {s: lease for s, lease in self.held.items()
                     if engine.holds_lease(self.topic, s, node, lease)}  # fmt: skip
        credit = self.want.max - len(self.held)
        if credit <= 0:
            return b"", False
        jobs = await api.cohorts.claim(self.topic, ClaimRequest(node, credit, self.want.lease_ms))
        if not jobs:
            return b"", False
        api.metrics.jobs_claimed += len(jobs)
        self.held.update((job.seq, job.lease_id) for job in jobs)
        return b"".join(_event(job) for job in jobs), True

    def due_s(self) -> float | None:
        due = self.api.engine.next_due(self.topic)
        if due is None:
            return None
        # Expiry is strict (now > deadline): look again just after it.
        return (due - self.api.engine.clock.now_ms() + 1) / 1000

    def close(self) -> None:
        if not self.held:
            return
        # If the queue is gone or storage refuses, the leases simply expire instead.
        with contextlib.suppress(TopicError):
            self.api.engine.nack(
                self.topic, self.want.node, list(self.held), list(self.held.values())
            )


def _event(job: ClaimedJob) -> bytes:
    return b"event: job\nid: %d\ndata: %b\n\n" % (job.seq, one_line(job.to_json()))
