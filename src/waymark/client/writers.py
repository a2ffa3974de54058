"""Request building for the exactly-once sink's writer routes, shared by the sync and
async clients.

A stage takes either :class:`~waymark.protocol.RecordIn` values or records already
encoded as RecordIn JSON objects (the Spark sink builds those from Arrow columns):
the encoded ones are sent as they are, never decoded on the way.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..protocol import (
    OpenWriterRequest,
    OpenWriterResponse,
    PublishRequest,
    PublishResponse,
    RecordIn,
    StagedPart,
    StageRequest,
    StageResponse,
    WriterList,
    WriterState,
)
from .calls import Call, call, typed

_encode = msgspec.json.Encoder().encode
_opened = typed(OpenWriterResponse)
_staged = typed(StageResponse)
_published = typed(PublishResponse)
_writers = typed(WriterList)


def list_writers() -> Call[list[WriterState]]:
    return call("listWriters", lambda r: _writers(r).writers)


def open_writer(writer: str) -> Call[OpenWriterResponse]:
    return call("openWriter", _opened, _encode(OpenWriterRequest(writer)))


def stage(
    topic: str,
    writer: str,
    epoch: int,
    batch_id: int,
    partition: int,
    attempt: int,
    records: Sequence[RecordIn] | bytes,
    chunk: int,
) -> Call[StageResponse]:
    """``records``: RecordIn values, or RecordIn JSON objects already encoded and joined by
    commas into one byte string, sent byte for byte (the Spark sink cuts them out of an
    Arrow column)."""
    # (one copy of a chunk's bytes: ``b"[" + records + b"]"`` makes two)
    array = msgspec.Raw(b"".join((b"[", records, b"]"))) if isinstance(records, bytes) else (
        list(records))  # fmt: skip
    body = StageRequest(writer, epoch, batch_id, partition, attempt, array, chunk)
    return call("stage", _staged, _encode(body), topic=topic)


def publish(
    topic: str, writer: str, epoch: int, batch_id: int, parts: Sequence[StagedPart]
) -> Call[PublishResponse]:
    body = PublishRequest(writer, epoch, batch_id, list(parts))
    return call("publish", _published, _encode(body), topic=topic)
