"""The /v0 routes of the exactly-once sink protocol (:mod:`waymark.log.writers`); their
bodies are :mod:`waymark.protocol.writers`."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from ..log import Engine, ErrorCode, Limits, TopicError
from ..log.prebuilt import build
from ..log.records import PLAIN_MAX_BYTES, PlainRecords, plain_records
from ..log.writers import PartKey
from ..protocol import (
    OpenWriterRequest,
    OpenWriterResponse,
    PlainRecordIn,
    PublishRequest,
    RecordIn,
    StageRequest,
    StageResponse,
    WriterList,
)
from ..protocol.scopes import ScopeKind, allows
from .auth import TOKEN, Token
from .http import OFF_LOOP_BYTES, BodyDecoder, Request, Response, off_loop, refuse_server_meta
from .metrics import Metrics

_open = BodyDecoder(OpenWriterRequest)
_stage = BodyDecoder(StageRequest[list[RecordIn]], lambda body: refuse_server_meta(body.records))
_stage_plain = msgspec.json.Decoder(StageRequest[list[PlainRecordIn]])
_publish = BodyDecoder(PublishRequest)
_encode = msgspec.json.encode
_data_of = attrgetter("data")


class WritersApi:
    def __init__(self, engine: Engine, limits: Limits, metrics: Metrics) -> None:
        self.engine = engine
        self.max_body = limits.max_body_bytes
        self.limits = limits
        self._decode_stage = functools.partial(decode_stage, limits=limits)
        self.metrics = metrics

    async def open_writer(self, request: Request) -> Response:
        body = _open.decode(await request.body(self.max_body))
        token: Token | None = request.scope.get(TOKEN)
        if token is not None:
            self._check_may_fence(token, body.writer)
        epoch = self.engine.open_writer(body.writer)
        await self._durable(body.writer)  # an epoch is handed out only once it is durable
        return Response(_encode(OpenWriterResponse(body.writer, epoch)))

    async def list_writers(self, request: Request) -> Response:
        states = self.engine.writer_states()
        token: Token | None = request.scope.get(TOKEN)
        if token is not None:  # only the topics it may read (docs/security.md)
            visible = []
            for state in states:
                topics = [t for t in state.topics
                          if allows(token.grants, ScopeKind.READ, t.topic)]  # fmt: skip
                if topics or not state.topics:  # one that wrote nothing yet shows bare
                    visible.append(msgspec.structs.replace(state, topics=topics))
            states = visible
        return Response(_encode(WriterList(states)))

    def _check_may_fence(self, token: Token, writer: str) -> None:
        """Opening a writer fences its running instance: a token may do so only if it
        may write every topic the writer writes (docs/security.md, Scopes)."""
        for topic in self.engine.writer_topics(writer):
            if not allows(token.grants, ScopeKind.WRITE, topic):
                raise TopicError(
                    ErrorCode.FORBIDDEN,
                    f"token {token.name!r} may not open writer {writer!r}: it writes "
                    f"{topic!r}, which the token may not write",
                    {"token": token.name, "writer": writer, "topic": topic, "needs": "write"},
                )

    async def stage(self, request: Request) -> Response:
        # Decoded on a worker thread when large, as an append is (docs/security.md, Limits).
        body, records = await off_loop(await request.body_parts(self.max_body), self._decode_stage)
        accepted = self.engine.stage(
            request.params["topic"],
            body.writer,
            body.epoch,
            body.batch_id,
            PartKey(body.partition, body.attempt),
            records,
            chunk=body.chunk,
        )
        staged = len(records) if accepted else 0
        return Response(_encode(StageResponse(staged, accepted)))

    async def publish(self, request: Request) -> Response:
        body = _publish.decode(await request.body(self.max_body))
        parts = [(PartKey(p.partition, p.attempt), p.chunks) for p in body.parts]
        topic = request.params["topic"]
        head = (topic, body.writer, body.epoch, body.batch_id, parts)
        prebuilt = None
        layout = self.engine.lay_out_publish(*head)
        if layout is not None and layout.fresh_bytes > OFF_LOOP_BYTES:
            # A sink's batch of a million records is laid into its chunks and framed on
            # a worker thread, as a large append is (docs/security.md, Limits).
            prebuilt = await asyncio.to_thread(build, layout)
        result = self.engine.publish(*head, prebuilt)
        # A publish is acknowledged durable whatever the topic's class: Spark records the
        # batch as done once this returns, so the ledger entry must not be lost.
        await self._durable(request.params["topic"])
        if not result.replayed:
            self.metrics.records_appended += result.count
        return Response(_encode(result))

    async def _durable(self, name: str) -> None:
        commit = self.engine.commit_point(name)
        if commit is not None:
            await commit.wait()


def decode_stage(
    raw: bytes, limits: Limits
) -> tuple[StageRequest[Any], Sequence[RecordIn] | PlainRecords]:
    """A stage body and its records: records that carry data alone (the Spark sink's)
    are read and checked in bulk, as :class:`PlainRecords` (docs/http-api.md, "Sink
    speed"); any other body — or one the bulk checks cannot prove — is decoded record
    by record, which refuses what is wrong with the error naming the record."""
    records = None
    if len(raw) <= PLAIN_MAX_BYTES:  # (a larger one goes record by record, a slice at a time)
        try:
            plain = _stage_plain.decode(raw)
            datas = list(map(_data_of, plain.records))
            array = _records_array(raw, datas)
            if array is not None:
                records = plain_records(array, datas, limits)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            records = None
    if records is not None:
        return plain, records
    body = _stage.decode(raw)
    return body, body.records


def _records_array(raw: bytes, datas: list[msgspec.Raw]) -> bytes | None:
    """The records' JSON array as sent, cut out of ``raw`` from the ``[`` before the
    first record's data to the ``]`` after the last's: one decode of the body finds
    both, for a decoded ``Raw`` is a view of the body where its value lies (a second
    decode of the body, to find the array, cost the stage ~15% of its CPU). None
    unless the array starts ``[{"data":`` and ends ``}]`` there — a whitespace or an
    escaped key in between is then told by :func:`plain_records`' checks — or if the
    data are not views of ``raw`` (another decoder's behaviour): the record-by-record
    way then decides."""
    if not datas:
        return None
    base = _address(raw)
    first = _address(datas[0]) - base
    end = _address(datas[-1]) - base + len(datas[-1])
    if not (len(_ARRAY_HEAD) <= first and end + len(_ARRAY_TAIL) <= len(raw)):
        return None
    if (raw[first - len(_ARRAY_HEAD) : first] != _ARRAY_HEAD
            or raw[end : end + len(_ARRAY_TAIL)] != _ARRAY_TAIL):  # fmt: skip
        return None
    return raw[first - len(_ARRAY_HEAD) : end + len(_ARRAY_TAIL)]


def _address(value: bytes | msgspec.Raw) -> int:
    return int(np.frombuffer(value, np.uint8).ctypes.data)


_ARRAY_HEAD = b'[{"data":'
_ARRAY_TAIL = b"}]"
