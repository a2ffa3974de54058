"""Records on the way in: the request shape, the §1.2 limits, and the wire encoding.

A committed record is kept only as its encoded wire JSON (followed by a comma,
so a run of consecutive records is one contiguous slice of a chunk buffer);
see :mod:`waymark.log.chunk`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec
import orjson

from .errors import ErrorCode, TopicError

TOPIC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}")


def check_topic_name(name: str) -> None:
    if not TOPIC_NAME.fullmatch(name):
        raise TopicError(
            ErrorCode.INVALID_TOPIC_NAME,
            "topic names are 1-255 characters of [A-Za-z0-9._:-], starting alphanumeric",
            {"topic": name},
        )


@dataclass(frozen=True)
class Limits:
    """Hard write limits (§1.2). Violations are 400s with a specific code."""

    max_record_bytes: int = 1 << 20  # data + meta, canonical bytes
    max_tag_bytes: int = 256
    max_node_bytes: int = 128
    max_meta_bytes: int = 16 << 10
    max_meta_keys: int = 64
    max_records_per_write: int = 10_000
    max_body_bytes: int = 64 << 20


class RecordIn(msgspec.Struct, forbid_unknown_fields=True):
    """One record as a producer sends it. ``data`` stays raw JSON bytes end to end."""

    data: msgspec.Raw
    tag: str | None = None
    node: str | None = None
    meta: dict[str, str] | None = None
    id: str | None = None

    @classmethod
    def of(
        cls,
        data: object,
        *,
        tag: str | None = None,
        node: str | None = None,
        meta: dict[str, str] | None = None,
        id: str | None = None,
    ) -> RecordIn:
        """Build a record from a Python value (for embedding the engine)."""
        return cls(msgspec.Raw(orjson.dumps(data)), tag, node, meta, id)


class EncodedRecord(msgspec.Struct, frozen=True):
    """A validated record, ready to be stamped with seq and ts."""

    body: bytes  # the wire keys after $seq/$ts: ',"$node":..,"$tag":..,"meta":..,"data":..}'
    size: int  # data + meta canonical bytes: what cap_bytes and topic bytes count
    node: str | None
    tag: str | None
    id: str | None


def encode(record: RecordIn, limits: Limits) -> EncodedRecord:
    """Validate ``record`` against ``limits`` and encode its wire body once."""
    data = bytes(record.data)
    meta = b""
    if record.meta is not None:
        if len(record.meta) > limits.max_meta_keys:
            raise TopicError(
                ErrorCode.META_TOO_LARGE,
                f"meta has {len(record.meta)} keys; at most {limits.max_meta_keys} are allowed",
                {"keys": len(record.meta), "max_keys": limits.max_meta_keys},
            )
        meta = orjson.dumps(record.meta)
        if len(meta) > limits.max_meta_bytes:
            raise TopicError(
                ErrorCode.META_TOO_LARGE,
                f"meta is {len(meta)} bytes; at most {limits.max_meta_bytes} are allowed",
                {"bytes": len(meta), "max_bytes": limits.max_meta_bytes},
            )
    if len(data) + len(meta) > limits.max_record_bytes:
        # The limit is on canonical bytes: only pay for re-encoding when the raw form is over.
        data = orjson.dumps(orjson.loads(data))
        if len(data) + len(meta) > limits.max_record_bytes:
            raise TopicError(
                ErrorCode.RECORD_TOO_LARGE,
                f"data+meta is {len(data) + len(meta)} bytes; at most "
                f"{limits.max_record_bytes} are allowed",
                {"bytes": len(data) + len(meta), "max_bytes": limits.max_record_bytes},
            )
    parts = []
    if record.node is not None:
        if len(record.node.encode()) > limits.max_node_bytes:
            raise TopicError(
                ErrorCode.NODE_TOO_LONG,
                f"node is longer than {limits.max_node_bytes} bytes",
                {"max_bytes": limits.max_node_bytes},
            )
        parts.append(b',"$node":' + orjson.dumps(record.node))
    if record.tag is not None:
        if len(record.tag.encode()) > limits.max_tag_bytes:
            raise TopicError(
                ErrorCode.TAG_TOO_LONG,
                f"tag is longer than {limits.max_tag_bytes} bytes",
                {"max_bytes": limits.max_tag_bytes},
            )
        parts.append(b',"$tag":' + orjson.dumps(record.tag))
    if meta:
        parts.append(b',"meta":' + meta)
    parts.append(b',"data":' + data + b"}")
    return EncodedRecord(b"".join(parts), len(data) + len(meta), record.node, record.tag, record.id)
