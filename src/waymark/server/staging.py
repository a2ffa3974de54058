"""The /v0 routes of the exactly-once sink protocol (:mod:`waymark.log.staging`).

* ``POST /v0/writers`` ``{writer}`` -> ``{writer, epoch}``: a new run
  of a writer; its epoch fences every earlier run (409 ``fenced``).
* ``POST /v0/topics/{topic}/stage`` one chunk of one task attempt's rows, invisible
  to readers until published.
* ``POST /v0/topics/{topic}/publish`` the named parts as one atomic append;
  idempotent per ``(writer, batch_id)``.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
import orjson
from msgspec import Meta, Struct

from ..log import Engine, Limits, RecordIn
from ..log.staging import PartKey
from .http import Request, Response
from .metrics import Metrics
from .openapi import Operation

NonNegative = Annotated[int, Meta(ge=0, le=2**63 - 1)]
WriterId = Annotated[str, Meta(min_length=1, max_length=255)]


class OpenWriterRequest(Struct, forbid_unknown_fields=True):
    """``POST /v0/writers``: start a new run of ``writer`` (one epoch for all its topics)."""

    writer: WriterId


class OpenWriterResponse(Struct):
    writer: str
    epoch: int


class StageRequest(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{topic}/stage``: chunk ``chunk`` of one task attempt's rows."""

    writer: WriterId
    epoch: NonNegative
    batch_id: NonNegative
    partition: NonNegative
    attempt: NonNegative
    records: list[RecordIn]
    chunk: NonNegative = 0


class StageResponse(Struct):
    staged: int
    # False when the batch was already published: nothing was stored, nothing need be.
    accepted: bool


class StagedPart(Struct, forbid_unknown_fields=True):
    partition: NonNegative
    attempt: NonNegative
    chunks: NonNegative


class PublishRequest(Struct, forbid_unknown_fields=True):
    """``POST /v0/topics/{topic}/publish``: the successful attempts' parts of a batch."""

    writer: WriterId
    epoch: NonNegative
    batch_id: NonNegative
    parts: list[StagedPart]


class PublishResponse(Struct):
    """Seqs ``first_seq .. first_seq+count-1``; ``replayed`` when published before."""

    first_seq: int
    count: int
    head_seq: int
    replayed: bool


_open = msgspec.json.Decoder(OpenWriterRequest)
_stage = msgspec.json.Decoder(StageRequest)
_publish = msgspec.json.Decoder(PublishRequest)


class StagingApi:
    def __init__(self, engine: Engine, limits: Limits, metrics: Metrics) -> None:
        self.engine = engine
        self.staging = engine.staging
        self.max_body = limits.max_body_bytes
        self.metrics = metrics

    async def open_writer(self, request: Request) -> Response:
        body = _open.decode(await request.body(self.max_body))
        epoch = self.staging.open_writer(body.writer)
        await self._durable(body.writer)  # an epoch is handed out only once it is durable
        return Response(orjson.dumps({"writer": body.writer, "epoch": epoch}))

    async def stage(self, request: Request) -> Response:
        body = _stage.decode(await request.body(self.max_body))
        accepted = self.staging.stage(
            request.params["topic"],
            body.writer,
            body.epoch,
            body.batch_id,
            PartKey(body.partition, body.attempt),
            body.records,
            chunk=body.chunk,
        )
        staged = len(body.records) if accepted else 0
        return Response(orjson.dumps({"staged": staged, "accepted": accepted}))

    async def publish(self, request: Request) -> Response:
        body = _publish.decode(await request.body(self.max_body))
        parts = [(PartKey(p.partition, p.attempt), p.chunks) for p in body.parts]
        result = self.staging.publish(
            request.params["topic"], body.writer, body.epoch, body.batch_id, parts
        )
        # A publish is acknowledged durable whatever the topic's class: Spark records the
        # batch as done once this returns, so the ledger entry must not be lost.
        await self._durable(request.params["topic"])
        if not result.replayed:
            self.metrics.records_appended += result.count
        return Response(orjson.dumps(result.to_wire()))

    async def _durable(self, name: str) -> None:
        commit = self.engine.commit_point(name)
        if commit is not None:
            await commit.wait()


_TOPIC = "/v0/topics/{topic}"

OPERATIONS = (
    Operation(
        "post",
        "/v0/writers",
        "openWriter",
        "Start a new run of an exactly-once writer: returns its new epoch, which fences "
        "(409 fenced) every stage and publish of earlier runs",
        ok_type=OpenWriterResponse,
        body=OpenWriterRequest,
        errors=(400,),
    ),
    Operation(
        "post",
        f"{_TOPIC}/stage",
        "stage",
        "Stage one chunk of a task attempt's records under (writer, batch_id, partition, "
        "attempt); invisible to readers until published; unpublished stages expire",
        ok_type=StageResponse,
        body=StageRequest,
        errors=(400, 409),
    ),
    Operation(
        "post",
        f"{_TOPIC}/publish",
        "publish",
        "Publish the named staged parts of a batch as one atomic append (contiguous seqs); "
        "publishing an already published (writer, batch_id) returns its original seqs",
        ok_type=PublishResponse,
        body=PublishRequest,
        errors=(400, 404, 409, 422),
    ),
)

__all__ = ["OPERATIONS", "StagingApi"]
