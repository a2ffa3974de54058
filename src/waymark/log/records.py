"""Records on the way in: validation against the limits of docs/semantics/topics.md §1.2
(the contract's), and the wire encoding.

A committed record is kept only as its encoded wire JSON (followed by a comma,
so a run of consecutive records is one contiguous slice of a chunk buffer);
see :mod:`waymark.log.chunk`.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import orjson

from ..protocol import TOPIC_NAME, ErrorCode, Limits, RecordIn
from .errors import TopicError


def check_topic_name(name: str) -> None:
    if not TOPIC_NAME.fullmatch(name):
        raise TopicError(
            ErrorCode.INVALID_TOPIC_NAME,
            "topic names are 1-255 characters of [A-Za-z0-9._:-], starting alphanumeric",
            {"topic": name},
        )


class EncodedRecord(msgspec.Struct, frozen=True, gc=False):
    """A validated record, ready to be stamped with seq and ts."""

    body: bytes  # the wire keys after $seq/$ts: ',"$node":..,"$tag":..,"meta":..,"data":..}'
    size: int  # data + meta canonical bytes: what cap_bytes and topic bytes count
    node: str | None
    tag: str | None
    id: str | None


def encode_batch(records: Sequence[RecordIn], limits: Limits) -> list[EncodedRecord]:
    """Validate every record against ``limits`` and encode its wire body once.

    This is the hottest loop of a write, so the common shapes take short paths.
    """
    dumps = orjson.dumps
    max_record = limits.max_record_bytes
    out: list[EncodedRecord] = []
    append = out.append
    for record in records:
        data: msgspec.Raw | bytes = record.data  # measured and formatted without a copy
        node, tag, meta = record.node, record.tag, record.meta
        meta_json = _check_meta(meta, limits) if meta is not None else b""
        size = len(data) + len(meta_json)
        if size > max_record:
            data, size = _canonical_or_refuse(bytes(data), len(meta_json), max_record)
        head = b""
        if node is not None:
            _check_length(node, limits.max_node_bytes, ErrorCode.NODE_TOO_LONG, "node")
            head = b',"$node":' + dumps(node)
        if tag is not None:
            _check_length(tag, limits.max_tag_bytes, ErrorCode.TAG_TOO_LONG, "tag")
            head += b',"$tag":' + dumps(tag)
        if meta_json:
            head += b',"meta":' + meta_json
        append(EncodedRecord(b'%b,"data":%b}' % (head, data), size, node, tag, record.id))
    return out


def wire_body(data: bytes, node: str | None, tag: str | None, meta_json: bytes) -> bytes:
    """A record's wire body from parts already validated (a router's copy,
    docs/semantics/topics.md §8.3)."""
    head = b""
    if node is not None:
        head = b',"$node":' + orjson.dumps(node)
    if tag is not None:
        head += b',"$tag":' + orjson.dumps(tag)
    if meta_json:
        head += b',"meta":' + meta_json
    return b'%b,"data":%b}' % (head, data)


def _check_length(text: str, max_bytes: int, code: ErrorCode, what: str) -> None:
    # A UTF-8 character is at most 4 bytes: short strings need no encoding to check.
    if len(text) * 4 > max_bytes and len(text.encode()) > max_bytes:
        raise TopicError(code, f"{what} is longer than {max_bytes} bytes", {"max_bytes": max_bytes})


def _check_meta(meta: dict[str, str], limits: Limits) -> bytes:
    if len(meta) > limits.max_meta_keys:
        raise TopicError(
            ErrorCode.META_TOO_LARGE,
            f"meta has {len(meta)} keys; at most {limits.max_meta_keys} are allowed",
            {"keys": len(meta), "max_keys": limits.max_meta_keys},
        )
    meta_json = orjson.dumps(meta)
    if len(meta_json) > limits.max_meta_bytes:
        raise TopicError(
            ErrorCode.META_TOO_LARGE,
            f"meta is {len(meta_json)} bytes; at most {limits.max_meta_bytes} are allowed",
            {"bytes": len(meta_json), "max_bytes": limits.max_meta_bytes},
        )
    return meta_json


def _canonical_or_refuse(data: bytes, meta_bytes: int, max_record: int) -> tuple[bytes, int]:
    # The limit is on canonical bytes: only pay for re-encoding when the raw form is over.
    data = orjson.dumps(orjson.loads(data))
    size = len(data) + meta_bytes
    if size > max_record:
        raise TopicError(
            ErrorCode.RECORD_TOO_LARGE,
            f"data+meta is {size} bytes; at most {max_record} are allowed",
            {"bytes": size, "max_bytes": max_record},
        )
    return data, size
