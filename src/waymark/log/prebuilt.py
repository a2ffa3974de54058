"""A large append's bytes built ahead, off the event loop (docs/security.md, Limits).

Storing a 50 MB append copies it twice: into a chunk buffer (fresh memory, so most of
the time is page faults) and into its journal frame's checksum. Both depend only on
the seq and ts the engine hands out, so :meth:`Engine.lay_out` proposes them without
changing anything, :func:`build` lays the bytes out on a worker thread, and
:meth:`Engine.append_encoded` adopts them if the proposal still holds — nothing was
appended to the topic meanwhile, and the same records are fresh. Otherwise it builds
them itself, as for any append: a prebuilt append is never a different append.

The engine stays the one that decides seqs and the order of appends; the frame is the
same bytes either way (:func:`~waymark.log.journal.records_frame_parts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import chunk as chunk_module
from .chunk import Chunk, lay_out_plain
from .journal import BodyRun, records_frame_parts
from .origin import Published
from .records import PlainRecords, Records, binary_column
from .topic import AppendPlan


@dataclass(frozen=True, slots=True)
class Layout:
    """Where an append would go if it were made now: what :func:`build` needs."""

    name: str
    epoch: int
    first_seq: int
    ts: int
    now: int
    records: Records  # the fresh records, in order
    fresh_bytes: int  # their data and meta bytes
    journaled: bool  # whether the append writes a records frame
    publish: Published | None = None  # a sink batch's mark, in the same frame
    runs: list[BodyRun] | None = None  # the records' bodies already joined, in order


@dataclass(frozen=True, slots=True)
class Prebuilt:
    """The chunks and the journal frame of a :class:`Layout`, ready to adopt."""

    layout: Layout
    chunks: list[Chunk]  # new chunks holding exactly the layout's records
    frame: list[bytes] | None  # the records frame's parts, when journaled

    def fits(self, epoch: int, plan: AppendPlan, last_ts: int) -> bool:
        """Whether the append the engine is making now is the one laid out: same topic
        instance, same first seq, same fresh records, and a ts that does not go back."""
        layout = self.layout
        return (
            layout.epoch == epoch
            and layout.first_seq == plan.first_seq
            and layout.ts >= last_ts
            and layout.records == plan.fresh  # the same objects (plain: the same bytes)
        )


def build(layout: Layout) -> Prebuilt:
    """Lay ``layout``'s records out as new chunks and its journal frame. Pure and touches
    no engine state, so it runs on a worker thread; each of its copies is one chunk's
    bytes at most and its pyarrow kernels release the GIL, so the event loop is not held
    up for the whole batch. A sink's batch is laid out from its staged chunks' own
    buffers, never joined whole (:meth:`PlainRecords.column`, :meth:`PlainRecords.parts`).

    One thread: its chunks built side by side on two (a pool) took the same CPU or more
    and, on two cores busy with other work, more wall time, not less — a chunk's copy
    into its fresh buffer holds the GIL (docs/spark.md, "Sink speed")."""
    records, first, ts, runs = layout.records, layout.first_seq, layout.ts, layout.runs
    if isinstance(records, PlainRecords):  # a sink's batch: its staged chunks' buffers
        bodies, sizes = records.column(), records.sizes()
    else:
        bodies = None if runs is None else bodies_array(runs)
    chunks = []
    size = chunk_module.CHUNK_RECORDS  # (read now: tests shrink it to cross many chunks)
    for lo in range(0, len(records), size):
        laid = None if bodies is None else bodies.slice(lo, size)  # (one chunk's)
        if isinstance(records, PlainRecords):  # (a full one is laid out when first read)
            chunk = lay_out_plain(first + lo, ts, sizes[lo : lo + size], laid)
        else:
            chunk = Chunk(first + lo)
            chunk.extend(first + lo, ts, records[lo : lo + size], laid)
        chunks.append(chunk)
    frame = None
    if layout.journaled:
        frame = records_frame_parts(
            layout.name, layout.epoch, first, ts, records, layout.publish, now=layout.now,
            runs=runs,
        )  # fmt: skip
    return Prebuilt(layout, chunks, frame)


def bodies_array(runs: list[BodyRun]) -> Any:
    """The runs' bodies as a pyarrow ``large_binary`` chunked array over the runs' own
    buffers (no copy, no step per record: a cumulative sum of each run's lengths)."""
    import pyarrow as pa  # (as the chunk layout does: the engine's import stays light)

    arrays = []
    for run in runs:
        bounds = np.zeros(len(run.lengths) + 1, np.int64)
        np.cumsum(run.lengths, out=bounds[1:])
        arrays.append(binary_column(run.bodies, bounds))
    return pa.chunked_array(arrays, pa.large_binary())
