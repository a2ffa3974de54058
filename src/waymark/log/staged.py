"""Recovery's view of a sink's journaled stages: a publish by reference becomes the
records frame it stands for (docs/durability.md, "Staged chunks").

A sink's staged chunk is written to its topic's WAL shard as a stage frame while the
tasks run; its publish then writes a small publish frame naming the chunks, in the same
WAL file (the engine writes the whole records frame instead whenever a chunk's stage
frame lies in an older file, which a seal may trim). Replaying a WAL file, a stage
frame is only remembered (the latest of each key: staging a key again replaces it) and
never applies; a publish frame is replaced by the records frame the same publish would
have written without stages, byte for byte, so replay, gradual replay and the publish
ledger take it as any other append. A stage no publish frame names is dropped with its
file's replay: it never appears.

Pure: frames in, frames out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np

from .journal import PublishFrame, StageHeader, StageKey, records_frame_parts
from .origin import Published
from .records import PlainRecords
from .storage.frames import PAYLOAD_AT, CorruptFrame, Frame, FrameKind, frame_at

_stage = msgspec.json.Decoder(StageHeader)
_publish = msgspec.json.Decoder(PublishFrame)


def resolve(path: Path, data: bytes, frames: list[Frame]) -> Iterator[tuple[bytes, Frame]]:
    """``frames`` (one WAL file's, read from ``data``) as replay applies them, each with
    the bytes it lies in: stage frames left out, each publish frame replaced by its
    records frame (in bytes of its own). A publish naming a stage its file does not hold
    is damage: the engine never writes one."""
    stages: dict[StageKey, PlainRecords] = {}
    for frame in frames:
        if frame.kind is FrameKind.STAGE:
            header, records = stage_records(data, frame)
            stages[header.key()] = records
        elif frame.kind is FrameKind.PUBLISH:
            entry = _publish.decode(frame.payload)
            chunks = []
            for partition, attempt, chunk in entry.chunks:
                staged = stages.pop(
                    (entry.name, entry.writer, entry.batch_id, partition, attempt, chunk), None
                )
                if staged is None:
                    raise CorruptFrame(
                        path, frame.offset,
                        f"publish of {entry.writer!r} batch {entry.batch_id} names chunk "
                        f"{[partition, attempt, chunk]}, which no stage frame before it holds",
                    )  # fmt: skip
                chunks.append(staged)
            whole = b"".join(records_frame_parts(
                entry.name, entry.epoch, entry.first_seq, entry.ts, PlainRecords.concat(chunks),
                Published(entry.writer, entry.batch_id), now=entry.now,
            ))  # fmt: skip
            yield whole, frame_at(whole, 0)
        else:
            yield data, frame


def stage_records(data: bytes, frame: Frame) -> tuple[StageHeader, PlainRecords]:
    """A stage frame's header and the chunk it holds, as it was staged."""
    begin = frame.offset + PAYLOAD_AT
    newline = data.index(b"\n", begin)  # the header is JSON text: its first newline ends it
    header = _stage.decode(data[begin:newline])
    bounds = np.zeros(len(header.lens) + 1, np.int64)
    np.cumsum(header.lens, out=bounds[1:])
    bodies = data[newline + 1 : newline + 1 + int(bounds[-1])]
    return header, PlainRecords(bodies, bounds)
