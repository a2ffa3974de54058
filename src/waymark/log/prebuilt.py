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

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .chunk import CHUNK_RECORDS, Chunk
from .journal import BodyRun, records_frame_parts
from .origin import Published
from .records import EncodedRecord, PlainRecords, Records, binary_column
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


# A publish's chunks and its journal frame are independent of each other and most of
# their work (pyarrow joins and casts, xxhash, large copies) releases the GIL: built on
# two threads side by side, a sink's serial commit waits about half as long
# (docs/spark.md, "Sink speed"). One pool for the process, as many threads as the
# machine the project targets has cores.
_BUILDERS = ThreadPoolExecutor(2, thread_name_prefix="waymark-build")


def build(layout: Layout) -> Prebuilt:
    """Lay ``layout``'s records out as new chunks and its journal frame. Pure and touches
    no engine state, so it runs on a worker thread; each of its copies is one chunk's
    bytes at most and its pyarrow kernels release the GIL, so the event loop is not held
    up for the whole batch. The chunks and the frame are built by ``_BUILDERS``, each
    job one chunk or the frame, and gathered in order: the same bytes as one by one."""
    jobs = _chunk_jobs(layout)
    if layout.journaled:
        jobs.insert(0, partial(_frame, layout))  # (the longest job: started first)
    if len(jobs) == 1:
        results = [jobs[0]()]
    else:
        results = [future.result() for future in [_BUILDERS.submit(job) for job in jobs]]
    frame = results.pop(0) if layout.journaled else None
    return Prebuilt(layout, results, frame)


def _chunk_jobs(layout: Layout) -> list[Callable[[], Any]]:
    """One job per new chunk of the layout, each making that chunk."""
    records, first, ts, runs = layout.records, layout.first_seq, layout.ts, layout.runs
    starts = range(0, len(records), CHUNK_RECORDS)
    if isinstance(records, PlainRecords):  # a sink's batch: its staged chunks' buffers
        column, sizes = records.column(), records.sizes()
        return [
            partial(
                _plain_chunk,
                first + lo,
                ts,
                sizes[lo : lo + CHUNK_RECORDS],
                column.slice(lo, CHUNK_RECORDS),
            )
            for lo in starts
        ]
    bodies = None if runs is None else bodies_array(runs)
    return [
        partial(
            _chunk,
            first + lo,
            ts,
            records[lo : lo + CHUNK_RECORDS],
            None if bodies is None else bodies.slice(lo, CHUNK_RECORDS),
        )
        for lo in starts
    ]


def _plain_chunk(seq: int, ts: int, sizes: np.ndarray, bodies: Any) -> Chunk:
    chunk = Chunk(seq)
    chunk.extend_plain(seq, ts, sizes, bodies)
    return chunk


def _chunk(seq: int, ts: int, records: list[EncodedRecord], bodies: Any) -> Chunk:
    chunk = Chunk(seq)
    chunk.extend(seq, ts, records, bodies)
    return chunk


def _frame(layout: Layout) -> list[bytes]:
    return records_frame_parts(
        layout.name, layout.epoch, layout.first_seq, layout.ts, layout.records, layout.publish,
        now=layout.now, runs=layout.runs,
    )  # fmt: skip


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
