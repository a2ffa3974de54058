"""Mutations as typed journal frames, and the journal they are handed to.

Each frame kind is a msgspec Struct; the union of them is tagged by the frame's kind
byte (:class:`~waymark.log.storage.frames.FrameKind`), not by a field, so the bytes
on disk are those the engine always wrote. :func:`decode` turns a stored frame into
its Struct once; replay matches on the type (docs/architecture.md#the-engine-kernel).

Pure: this module only encodes and decodes. Writing frames somewhere durable is
a :class:`Journal`'s job (the WAL in :mod:`waymark.log.storage.wal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any, ClassVar, Protocol

import msgspec
import numpy as np
from msgspec import UNSET, Struct, UnsetType

from ..protocol import TopicConfig, TopicType
from ..protocol.globs import escape
from .chunk import decimal_column
from .deletion import TagMatch
from .origin import Published
from .records import EncodedRecord, PlainRecords, Records, constant_column
from .storage.frames import Frame, FrameKind, encode, frame_parts


class Commit(Protocol):
    @property
    def durable(self) -> bool: ...

    async def wait(self) -> None: ...


class Journal(Protocol):
    def write(self, topic: str, frame: bytes | list[bytes]) -> Commit:
        """Journal one frame, whole or as parts to write one after the other."""
        ...

    def check_available(self, topic: str) -> None:
        """Raise 503 storage_unavailable if ``topic``'s frames cannot be written now."""
        ...

    def admit(self, topic: str) -> AbstractContextManager[None]:
        """:meth:`check_available`, then take every frame written for ``topic`` inside,
        so a mutation of several frames is journaled whole or, refused, not at all."""
        ...

    def latest(self, topic: str) -> Commit:
        """The commit of the last frame written for ``topic``'s shard."""
        ...

    def file(self, topic: str) -> int:
        """The file of ``topic``'s shard that its next frame goes to: frames written for
        it until this changes are in one file, which no seal trims meanwhile."""
        ...

    def sync_ms(self, topic: str) -> int:
        """How long making ``topic``'s frames durable takes lately, in ms (the fsync_ms of
        docs/semantics/topics.md §2.2)."""
        ...


# --- frames -----------------------------------------------------------------------------
# Field order is the order of the keys on disk: do not reorder.


class _Json(Struct):
    """A frame whose payload is one JSON object."""

    KIND: ClassVar[FrameKind]

    def encode(self) -> bytes:
        return encode(self.KIND, _encoder.encode(self))


class TopicFrame(_Json):
    """Create or reconfigure a topic instance. ``now``: when the config took effect;
    replay applies it at that time, so what expired under which TTL comes back exactly
    as it was."""

    KIND = FrameKind.TOPIC
    name: str
    type: TopicType
    epoch: int
    created_ts: int
    config: TopicConfig
    now: int | None = None

    @classmethod
    def of(
        cls,
        name: str,
        topic_type: TopicType,
        epoch: int,
        config: TopicConfig,
        created: int,
        *,
        now: int | None = None,
    ) -> TopicFrame:
        return cls(name, topic_type, epoch, created, config, now)


class DropFrame(_Json):
    """Delete a topic instance. ``next_seq``: the seq it would have handed out next,
    the version its drop is named at (docs/semantics/recovery.md §1.3); replay cannot
    tell it from the records alone, as a restart after a crash moves it past the
    ceiling's lead without a frame. Absent from frames written before it was kept."""

    KIND = FrameKind.DROP
    name: str
    epoch: int
    next_seq: int | UnsetType = UNSET


class HeadFrame(_Json):
    """The seq ceiling a topic instance may hand out. ``next_seq``: the seq it hands
    out next, when a restart moved it past a lead without a loss (an ``fsync`` topic,
    docs/durability.md): replay then moves there too, rather than take the skipped
    seqs for lost ones when later records follow. Absent from every other HEAD frame."""

    KIND = FrameKind.HEAD
    name: str
    epoch: int
    ceiling: int
    next_seq: int | UnsetType = UNSET


class WriterFrame(_Json):
    """A sink writer's new epoch (fences its older runs)."""

    KIND = FrameKind.WRITER
    writer: str
    epoch: int


class RouterDefinition(Struct):
    """A router as its frame records it: :class:`~.router.Router`'s fields in its order
    (the keys on disk). ``trimmed`` and ``filter`` are absent from frames older than
    them (UNSET), and a frame re-encodes to its own bytes."""

    name: str
    source: str
    dest: str
    preserve_node: bool
    preserve_tag: bool
    allow_cycle: bool
    guarantee: str
    created_ts: int
    source_epoch: int
    dest_epoch: int
    cursor: int
    trimmed: int | UnsetType = UNSET
    filter: dict[str, Any] | UnsetType | None = UNSET

    def fields(self) -> dict[str, Any]:
        """The fields the frame holds, as :class:`~.router.Router`'s keywords."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not UNSET}


class RouterFrame(_Json, rename={"definition": "def"}):
    """A router's definition with its starting cursor (docs/semantics/topics.md §8), or
    (None) its deletion."""

    KIND = FrameKind.ROUTER
    router: str
    definition: RouterDefinition | None


class DeleteFrame(_Json):
    """A delete (docs/semantics/topics.md §7) of the seqs below ``bound`` (those matching
    ``match``, a ``[exact, value]`` pair, if given); ``seqs`` (a queue's acks) deletes
    exactly those seqs instead. ``now``: when it happened, for replay at that time.
    ``slot``: the seq the deletion took for itself, born deleted, when it removed
    anything (docs/semantics/topics.md §7.1)."""

    KIND = FrameKind.DELETE
    name: str
    epoch: int
    before_seq: int | None
    match: tuple[bool, str] | None
    bound: int
    now: int | None = None
    seqs: list[int] | UnsetType = UNSET  # absent from the JSON unless given
    slot: int | UnsetType = UNSET  # likewise: frames of deletions that took no seq are unchanged
    # A tag Glob's pattern (docs/globs.md) when it is not a literal prefix and one
    # trailing "*"; such a Glob is written as before (match [false, prefix], the v1
    # bytes), and a frame without this field whose match is not exact means a prefix.
    # (Read by an older version, a glob frame's match names the pattern as a literal
    # prefix: it deletes less, never more.)
    glob: str | UnsetType = UNSET

    @classmethod
    def of(
        cls,
        name: str,
        epoch: int,
        before_seq: int | None,
        match: TagMatch | None,
        bound: int,
        seqs: list[int] | None = None,
        *,
        now: int | None = None,
        slot: int | None = None,
    ) -> DeleteFrame:
        pair = None if match is None else (match.exact, match.value)
        glob: str | UnsetType = UNSET
        if match is not None and not match.exact:
            if match.value == escape(match.prefix) + "*":
                pair = (False, match.prefix)
            else:
                glob = match.value
        return cls(name, epoch, before_seq, pair, bound, now, UNSET if seqs is None else seqs,
                   UNSET if slot is None else slot, glob)  # fmt: skip

    @property
    def selector(self) -> TagMatch | None:
        if self.match is None:
            return None
        exact, value = self.match
        if exact:
            return TagMatch(True, value)
        if isinstance(self.glob, str):
            return TagMatch(False, self.glob)
        return TagMatch(False, escape(value) + "*")  # a frame of the prefix-only Glob


class RecordsHeader(Struct):
    """The JSON line that opens a records frame; the records' bodies follow it."""

    name: str
    epoch: int
    first_seq: int
    ts: int
    now: int | None
    lens: list[int]
    sizes: list[int]
    nodes: list[str | None]
    tags: list[str | None]
    ids: list[str | None] | None
    extra: RecordsExtra | None


class RecordsExtra(Struct, omit_defaults=True):
    """What a records frame carries besides its records: on disk
    ``{"publish": [writer, batch_id]}`` for a sink's publish, else the frame's ``extra``
    is null. A new mark is a field here, last, with a default."""

    publish: Published | None = None


class StageHeader(Struct):
    """The JSON line that opens a stage frame (a sink's staged chunk, journaled as it is
    staged: docs/durability.md, "Staged chunks"); the chunk's stored bodies follow it,
    ``lens`` long each. It is no mutation: only a later :class:`PublishFrame` in the same
    WAL file makes its records part of the topic."""

    name: str
    writer: str
    batch_id: int
    partition: int
    attempt: int
    chunk: int
    lens: list[int]

    def key(self) -> StageKey:
        return (self.name, self.writer, self.batch_id, self.partition, self.attempt, self.chunk)


StageKey = tuple[str, str, int, int, int, int]
"""A staged chunk: (topic, writer, batch id, partition, attempt, chunk). Staging a key
again replaces it, so the latest stage frame of a key is the one a publish names."""


def stage_frame_parts(key: StageKey, records: PlainRecords) -> list[bytes]:
    """The stage frame of staged chunk ``key``: its header, then its bodies as they are
    (one buffer, not joined again)."""
    header = StageHeader(*key, records.lengths().tolist())
    return frame_parts(FrameKind.STAGE, [_encoder.encode(header) + b"\n", records.joined()],
                       join=False)  # fmt: skip


class PublishFrame(_Json):
    """A sink's publish whose records its stage frames hold, earlier in the same WAL file
    (docs/durability.md, "Staged chunks"): the atomic append of those chunks, in
    ``chunks`` order (each ``[partition, attempt, chunk]`` of ``writer``'s batch
    ``batch_id``) at seqs from ``first_seq``, with its publish mark. Recovery turns it
    into the records frame it stands for (:mod:`waymark.log.staged`)."""

    KIND = FrameKind.PUBLISH
    name: str
    epoch: int
    first_seq: int
    ts: int
    now: int
    writer: str
    batch_id: int
    chunks: list[tuple[int, int, int]]


def records_frame(
    name: str,
    epoch: int,
    first_seq: int,
    ts: int,
    records: list[EncodedRecord],
    publish: Published | None = None,
    *,
    now: int | None = None,
) -> bytes:
    """One atomic append: a JSON header line, then the records' encoded bodies.
    ``now``: when it happened (``ts`` never decreases, the clock might)."""
    return b"".join(records_frame_parts(name, epoch, first_seq, ts, records, publish, now=now))


def records_frame_parts(
    name: str,
    epoch: int,
    first_seq: int,
    ts: int,
    records: Records,
    publish: Published | None = None,
    *,
    now: int | None = None,
    runs: Sequence[BodyRun] | None = None,
) -> list[bytes]:
    """:func:`records_frame` unjoined, as the WAL takes it (``frames.frame_parts``).
    ``runs``: the records' bodies already joined, in order (a sink's staged chunks,
    :mod:`waymark.log.prebuilt`): the same frame, without a step per record for them."""
    extra = None if publish is None else RecordsExtra(publish)
    if isinstance(records, PlainRecords):  # the same frame, from its columns
        # Its lists as the JSON text msgspec writes for them, in place (a Raw is written
        # as it is, whatever the field's type): the four lists of a 300,000-record
        # publish built and encoded cost ~25 ms, the pyarrow kernels and repeat ~15 ms.
        nulls: Any = _json_nulls(len(records))
        header = RecordsHeader(
            name, epoch, first_seq, ts, now, _json_ints(records.lengths()),
            _json_ints(records.sizes()), nulls, nulls, None, extra,
        )  # fmt: skip
        # (a publish's staged chunks as they are: no join of the batch's bodies)
        return frame_parts(FrameKind.RECORDS, [_encoder.encode(header) + b"\n", *records.parts()])
    # Each list one C call over the records: a sink's publish holds a million of them.
    ids = list(map(_id_of, records))
    if runs is None:
        bodies = list(map(_body_of, records))
        lengths = list(map(len, bodies))
    else:
        bodies = [run.bodies for run in runs]
        lengths = list(chain.from_iterable(run.lengths for run in runs))
    header = RecordsHeader(
        name, epoch, first_seq, ts, now,
        lengths, list(map(_size_of, records)),
        list(map(_node_of, records)), list(map(_tag_of, records)),
        ids if ids.count(None) != len(ids) else None,
        extra,
    )  # fmt: skip
    return frame_parts(FrameKind.RECORDS, [_encoder.encode(header) + b"\n", *bodies])


def _json_ints(values: np.ndarray) -> Any:
    """``values`` (ints) as the JSON array msgspec writes for their list, ``[1,2,3]``:
    one cast of their digits and one element-wise join with a comma column, both
    pyarrow kernels over the array. Every argument is an array: a Python scalar
    argument (``pc.binary_join(x, ",")``) makes pyarrow import pandas on its first use,
    which stalled the event loop ~1.5 s at a server's first publish that could not name
    its stage frames (docs/spark.md, "Sink speed")."""
    import pyarrow.compute as pc  # (as the chunk layout: the engine's import stays light)

    n = len(values)
    if not n:
        return msgspec.Raw(b"[]")
    joined = pc.binary_join_element_wise(  # type: ignore[call-overload]
        decimal_column(values), constant_column(b",", n), constant_column(b"", n)
    )
    _, offsets, text = joined.buffers()
    bounds = np.frombuffer(offsets, np.int64, n + 1, joined.offset * 8)  # type: ignore[call-overload]
    body = memoryview(text)[int(bounds[0]) : int(bounds[-1]) - 1]  # (the last comma)
    return msgspec.Raw(b"[" + bytes(body) + b"]")


def _json_nulls(n: int) -> Any:
    """``[null,null,...]``, ``n`` of them: msgspec's text for ``[None] * n``."""
    return msgspec.Raw(b"[" + b"null," * (n - 1) + b"null]" if n else b"[]")


@dataclass(frozen=True, slots=True)
class BodyRun:
    """Consecutive records' stored bodies joined into one buffer, and each one's length:
    what a sink's staged chunk keeps beside its records, so that its publish frames and
    lays them out without a step per record (docs/semantics/topics.md §12)."""

    bodies: bytes
    lengths: list[int]

    @classmethod
    def of(cls, records: Sequence[EncodedRecord]) -> BodyRun:
        bodies = list(map(_body_of, records))
        return cls(b"".join(bodies), list(map(len, bodies)))


@dataclass(frozen=True, slots=True)
class RecordsFrame:
    """A decoded records frame: one atomic append."""

    name: str
    epoch: int
    first_seq: int
    ts: int
    records: list[EncodedRecord]
    publish: Published | None  # a sink's publish: its ledger entry
    now: int  # when the append happened


JournalFrame = TopicFrame | DropFrame | HeadFrame | WriterFrame | RouterFrame | DeleteFrame
"""Every frame but records, each a JSON object; the frame kind byte is the tag."""

_encoder = msgspec.json.Encoder()
_id_of, _body_of, _size_of = attrgetter("id"), attrgetter("body"), attrgetter("size")
_node_of, _tag_of = attrgetter("node"), attrgetter("tag")
_decoders: dict[FrameKind, msgspec.json.Decoder[Any]] = {
    kind.KIND: msgspec.json.Decoder(kind)
    for kind in (TopicFrame, DropFrame, HeadFrame, WriterFrame, RouterFrame, DeleteFrame)
}
_header = msgspec.json.Decoder(RecordsHeader)


def decode(frame: Frame) -> JournalFrame | RecordsFrame:
    """The typed form of a journal frame (any kind but the catalog's)."""
    if frame.kind is FrameKind.RECORDS:
        return decode_records(frame.payload)
    return _decoders[frame.kind].decode(frame.payload)


def decode_records(payload: memoryview) -> RecordsFrame:
    data = bytes(payload)
    newline = data.index(b"\n")
    header = _header.decode(data[:newline])
    ids = header.ids or [None] * len(header.lens)
    records = []
    offset = newline + 1
    for length, size, node, tag, ident in zip(
        header.lens, header.sizes, header.nodes, header.tags, ids, strict=True
    ):
        records.append(EncodedRecord(data[offset : offset + length], size, node, tag, ident))
        offset += length
    return RecordsFrame(
        header.name, header.epoch, header.first_seq, header.ts, records,
        header.extra.publish if header.extra is not None else None, header.now or header.ts,
    )  # fmt: skip


class _Instance(Struct):
    name: str
    epoch: int


_instance = msgspec.json.Decoder(_Instance)


def frame_topic(frame: Frame) -> tuple[str, int] | None:
    """The topic instance (name, epoch) a frame was written for, decoding no records;
    None for a writer or router frame, which belong to no topic."""
    if frame.kind is FrameKind.RECORDS:
        data = bytes(frame.payload)
        header = _instance.decode(data[: data.index(b"\n")])
    elif frame.kind in (FrameKind.WRITER, FrameKind.ROUTER):
        return None
    else:
        header = _instance.decode(frame.payload)
    return header.name, header.epoch
