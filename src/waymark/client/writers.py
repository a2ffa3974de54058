"""Request building for the exactly-once sink's writer routes, shared by the sync and
async clients.

A stage takes either :class:`~waymark.protocol.RecordIn` values or records already
encoded as RecordIn JSON objects, or — for records that carry data alone — their data
values already encoded with their lengths (the Spark sink builds both from Arrow
columns): the encoded ones are sent as they are, never decoded on the way.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Any

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
    body: StageRequest[Any, None] = StageRequest(writer, epoch, batch_id, partition, attempt,
                                                 array, chunk)  # fmt: skip
    return call("stage", _staged, _encode(body), topic=topic)


def stage_data(
    topic: str,
    writer: str,
    epoch: int,
    batch_id: int,
    partition: int,
    attempt: int,
    data: bytes | memoryview,
    lengths: Sequence[int] | bytes,
    chunk: int,
) -> Call[StageResponse]:
    """``data``: records that carry data alone, as their data values (JSON text) joined
    by commas into one buffer, sent byte for byte; ``lengths``: each value's length in
    bytes, as ints or already packed as little-endian uint32s (the Spark sink takes both
    from an Arrow column's buffers)."""
    packed = lengths if isinstance(lengths, bytes) else struct.pack(f"<{len(lengths)}I", *lengths)
    head: StageRequest[None, None] = StageRequest(writer, epoch, batch_id, partition, attempt,
                                                  chunk=chunk)  # fmt: skip
    # The body joined around the values: one copy of them (encoding them as a Raw field
    # of the request would take two more).
    body = b"".join((_encode(head)[:-1], b',"data":[', data, b'],"lengths":"',
                     base64.b64encode(packed), b'"}'))  # fmt: skip
    return call("stage", _staged, body, topic=topic)


def publish(
    topic: str, writer: str, epoch: int, batch_id: int, parts: Sequence[StagedPart]
) -> Call[PublishResponse]:
    body = PublishRequest(writer, epoch, batch_id, list(parts))
    return call("publish", _published, _encode(body), topic=topic)
