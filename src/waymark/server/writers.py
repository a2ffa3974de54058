"""The /v0 routes of the exactly-once sink protocol (:mod:`waymark.log.writers`); their
bodies are :mod:`waymark.protocol.writers`."""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import functools
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from ..log import Engine, ErrorCode, Limits, TopicError
from ..log.prebuilt import build
from ..log.records import PLAIN_MAX_BYTES, PlainRecords, data_records, plain_records
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
_stage = BodyDecoder(StageRequest[list[RecordIn], list[msgspec.Raw]], lambda b: _check_stage(b))
_stage_plain = msgspec.json.Decoder(StageRequest[list[PlainRecordIn], list[msgspec.Raw]])
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
) -> tuple[StageRequest[Any, Any], Sequence[RecordIn] | PlainRecords]:
    """A stage body and its records. Records that carry data alone (the Spark sink's),
    sent as ``records`` or as ``data`` values with their ``lengths``, are read and
    checked in bulk, as :class:`PlainRecords` (docs/http-api.md, "Sink stages"); any
    other body — or one the bulk checks cannot prove — is decoded record by record,
    which refuses what is wrong with the error naming the record."""
    plain = _decode_plain(raw)
    if plain is not None:
        _check_forms(plain)
        if plain.data is not None:
            return plain, _data_records(raw, plain.data, plain.lengths, limits)
        datas = list(map(_data_of, plain.records or ()))
        array = _records_array(raw, datas, _ARRAY_HEAD, _ARRAY_TAIL)
        records = None
        if array is not None:
            with contextlib.suppress(UnicodeDecodeError, RecursionError):
                records = plain_records(array, datas, limits)
        if records is not None:
            return plain, records
    body = _stage.decode(raw)
    if body.data is not None:
        return body, _data_records(raw, body.data, body.lengths, limits)
    return body, body.records or []


def _decode_plain(raw: bytes) -> StageRequest[list[PlainRecordIn], list[msgspec.Raw]] | None:
    """The body decoded with records that carry data alone (``{"data":..}`` objects or
    ``data`` values); None if it is not so, or too large to check in one step."""
    if len(raw) > PLAIN_MAX_BYTES:  # (a larger one goes record by record, a slice at a time)
        return None
    try:
        return _stage_plain.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None


def _check_forms(body: StageRequest[Any, Any]) -> None:
    """Refuse (400 ``invalid_request``) a body with both forms of records, or neither, or
    ``data`` and ``lengths`` apart."""
    if (body.records is None) == (body.data is None):
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            "a stage carries its records as 'records', or as 'data' with 'lengths': exactly "
            "one of the two",
        )
    if (body.data is None) != (body.lengths is None):
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            "'lengths' goes with 'data': each data value's length in bytes, base64 of "
            "little-endian uint32s",
        )


def _check_stage(body: StageRequest[list[RecordIn], list[msgspec.Raw]]) -> None:
    _check_forms(body)
    if body.records is not None:
        refuse_server_meta(body.records)


def _data_records(
    raw: bytes, datas: list[msgspec.Raw], lengths: str | None, limits: Limits
) -> Sequence[RecordIn] | PlainRecords:
    """The records of a stage's ``data`` values, once their lengths as parsed are the
    ``lengths`` sent: in bulk when :func:`data_records` proves them, else one by one."""
    measured = np.fromiter(map(len, datas), np.int64, len(datas))
    _check_split(measured, lengths or "")
    array = _records_array(raw, datas, b"[", b"]")
    if array is not None:
        with contextlib.suppress(UnicodeDecodeError, RecursionError):
            records = data_records(array, measured, limits)
            if records is not None:
                return records
    return [RecordIn(data) for data in datas]


def _check_split(measured: np.ndarray, lengths: str) -> None:
    """Refuse (400 ``invalid_request``) a stage whose data values, as parsed, are not
    the ``lengths`` sent (base64 of little-endian uint32s): the array the sender joined
    holds a row that is not exactly one JSON value, or two rows that make one."""
    try:  # (strictly: b64decode's validate is a regular expression over the text)
        packed = binascii.a2b_base64(lengths, strict_mode=True)
    except (binascii.Error, ValueError):  # (ValueError: not ASCII)
        packed = b"?"
    if len(packed) % 4:
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            "'lengths' is not base64 of little-endian uint32s: each data value's length",
        )
    if len(packed) != 4 * len(measured):
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            f"the data array holds {len(measured)} values where 'lengths' gives "
            f"{len(packed) // 4}: it does not split into the values that were joined",
            {"parsed_values": len(measured), "sent_values": len(packed) // 4},
        )
    sent = np.frombuffer(packed, "<u4").astype(np.int64)
    if not np.array_equal(measured, sent):
        at = int(np.flatnonzero(measured != sent)[0])
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            f"data value {at} is {measured[at]} bytes as parsed, where 'lengths' says "
            f"{sent[at]}: the array does not split into the values that were joined",
            {"index": at, "parsed_bytes": int(measured[at]), "sent_bytes": int(sent[at])},
        )


def _records_array(raw: bytes, datas: list[msgspec.Raw], head: bytes, tail: bytes) -> bytes | None:
    """The records' JSON array as sent, cut out of ``raw`` from the ``head`` before the
    first record's data to the ``tail`` after the last's (``[{"data":`` and ``}]`` for
    records, ``[`` and ``]`` for data values): one decode of the body finds both, for
    a decoded ``Raw`` is a view of the body where its value lies (a second decode of the
    body, to find the array, cost the stage ~15% of its CPU). None unless the array
    starts and ends so there — a whitespace or an escaped key in between is then told
    by the bulk checks — or if the data are not views of ``raw`` (another decoder's
    behaviour): the record-by-record way then decides."""
    if not datas:
        return None
    base = _address(raw)
    first = _address(datas[0]) - base
    end = _address(datas[-1]) - base + len(datas[-1])
    if not (len(head) <= first and end + len(tail) <= len(raw)):
        return None
    if raw[first - len(head) : first] != head or raw[end : end + len(tail)] != tail:
        return None
    return raw[first - len(head) : end + len(tail)]


def _address(value: bytes | msgspec.Raw) -> int:
    return int(np.frombuffer(value, np.uint8).ctypes.data)


_ARRAY_HEAD = b'[{"data":'
_ARRAY_TAIL = b"}]"
