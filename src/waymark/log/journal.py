"""Mutations as frame bytes, and the journal they are handed to.

Pure: this module only encodes and decodes. Writing frames somewhere durable is
a :class:`Journal`'s job (the WAL in :mod:`waymark.log.storage.wal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import orjson

from .config import TopicConfig, TopicType
from .deletion import TagMatch
from .records import EncodedRecord
from .storage.frames import FrameKind, encode


class Commit(Protocol):
    @property
    def durable(self) -> bool: ...

    async def wait(self) -> None: ...


class Journal(Protocol):
    def write(self, topic: str, frame: bytes) -> Commit: ...

    def check_available(self, topic: str) -> None:
        """Raise 503 storage_unavailable if ``topic``'s frames cannot be written now."""
        ...

    def latest(self, topic: str) -> Commit:
        """The commit of the last frame written for ``topic``'s shard."""
        ...

    def sync_ms(self, topic: str) -> int:
        """How long making ``topic``'s frames durable takes lately, in ms (§2.2 fsync_ms)."""
        ...


# --- encoding ---------------------------------------------------------------------------


def topic_frame(
    name: str,
    type: TopicType,
    epoch: int,
    config: TopicConfig,
    created: int,
    *,
    now: int | None = None,
) -> bytes:
    """``now``: when the config took effect. Replay applies it at that time, so what
    expired under which TTL comes back exactly as it was."""
    body = {
        "name": name,
        "type": str(type),
        "epoch": epoch,
        "created_ts": created,
        "config": msgspec.structs.asdict(config),
        "now": now,
    }
    return encode(FrameKind.TOPIC, orjson.dumps(body))


def drop_frame(name: str, epoch: int) -> bytes:
    return encode(FrameKind.DROP, orjson.dumps({"name": name, "epoch": epoch}))


def head_frame(name: str, epoch: int, ceiling: int) -> bytes:
    return encode(FrameKind.HEAD, orjson.dumps({"name": name, "epoch": epoch, "ceiling": ceiling}))


def writer_frame(writer: str, epoch: int) -> bytes:
    return encode(FrameKind.WRITER, orjson.dumps({"writer": writer, "epoch": epoch}))


def router_frame(name: str, definition: dict[str, Any] | None) -> bytes:
    """A router's definition with its starting cursor (§8), or (None) its deletion."""
    return encode(FrameKind.ROUTER, orjson.dumps({"router": name, "def": definition}))


def delete_frame(
    name: str,
    epoch: int,
    before_seq: int | None,
    match: TagMatch | None,
    bound: int,
    seqs: list[int] | None = None,
    *,
    now: int | None = None,
) -> bytes:
    """A §7 delete; ``seqs`` (a queue's acks) deletes exactly those seqs instead.
    ``now``: when it happened, for replay at that time."""
    body: dict[str, Any] = {
        "name": name,
        "epoch": epoch,
        "before_seq": before_seq,
        "match": None if match is None else [match.exact, match.value],
        "bound": bound,
        "now": now,
    }
    if seqs is not None:
        body["seqs"] = seqs
    return encode(FrameKind.DELETE, orjson.dumps(body))


def records_frame(
    name: str,
    epoch: int,
    first_seq: int,
    ts: int,
    records: list[EncodedRecord],
    extra: dict[str, Any] | None = None,
    *,
    now: int | None = None,
) -> bytes:
    """One atomic append: a JSON header line, then the records' encoded bodies.
    ``now``: when it happened (``ts`` never decreases, the clock might)."""
    ids = [r.id for r in records]
    header = {
        "name": name,
        "epoch": epoch,
        "first_seq": first_seq,
        "ts": ts,
        "now": now,
        "lens": [len(r.body) for r in records],
        "sizes": [r.size for r in records],
        "nodes": [r.node for r in records],
        "tags": [r.tag for r in records],
        "ids": ids if any(i is not None for i in ids) else None,
        "extra": extra,
    }
    return encode(
        FrameKind.RECORDS, orjson.dumps(header) + b"\n" + b"".join(r.body for r in records)
    )


# --- decoding ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordsFrame:
    name: str
    epoch: int
    first_seq: int
    ts: int
    records: list[EncodedRecord]
    extra: dict[str, Any] | None
    now: int  # when the append happened


def decode_json(payload: memoryview) -> dict[str, Any]:
    return orjson.loads(payload)


def decode_records(payload: memoryview) -> RecordsFrame:
    data = bytes(payload)
    newline = data.index(b"\n")
    header = orjson.loads(data[:newline])
    ids = header["ids"] or [None] * len(header["lens"])
    records = []
    offset = newline + 1
    for length, size, node, tag, ident in zip(
        header["lens"], header["sizes"], header["nodes"], header["tags"], ids, strict=True
    ):
        records.append(EncodedRecord(data[offset : offset + length], size, node, tag, ident))
        offset += length
    return RecordsFrame(
        header["name"], header["epoch"], header["first_seq"], header["ts"], records,
        header["extra"], header.get("now") or header["ts"],
    )  # fmt: skip


def records_topic(payload: memoryview) -> tuple[str, int]:
    """The topic instance (name, epoch) a records frame was written for; its records
    stay undecoded."""
    data = bytes(payload)
    header = orjson.loads(data[: data.index(b"\n")])
    return header["name"], header["epoch"]


def decode_config(body: dict[str, Any]) -> TopicConfig:
    return msgspec.convert(body, TopicConfig)
