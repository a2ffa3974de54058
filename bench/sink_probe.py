"""Where the exactly-once topic sink's time goes, without Spark (issue #27, "Sink speed").

    .venv/bin/python bench/sink_probe.py [--rows 300000] [--rounds 3] [--profile STEP]

One process, a real engine on a temporary data dir (the server's own steps, called as
its routes call them, without HTTP): the task side (an Arrow batch of click events ->
its data values with ``waymark.spark.encoding``, cut into the sink's stage chunks, each
encoded as the client sends it), the server's stage (decode of the request body, then
``Engine.stage``, which hands the chunk's stage frame to the WAL: docs/durability.md,
"Staged chunks") and its publish (``lay_out_publish`` + ``build`` on what would be a
worker thread, then ``Engine.publish`` on the event loop, then the WAL's sync of its
frame, which names the staged chunks, and of any stage frame still queued) and the
next seal's segments of the batch's chunks (a background thread of the server). Prints
CPU seconds per step, the best of ``--rounds``, and µs per record. ``--profile STEP``
prints a cProfile of one step (stage or publish) instead.

Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import pstats
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from waymark.client.writers import stage_data
from waymark.clock import ManualClock
from waymark.log.config import StorageConfig
from waymark.log.prebuilt import build
from waymark.log.storage.fileio import FileIO
from waymark.log.storage.restore import open_engine
from waymark.log.storage.segment import write_segment
from waymark.log.writers import PartKey
from waymark.server.writers import decode_stage
from waymark.spark.encoding import encode_values, joined_values, value_lengths
from waymark.spark.sink import CHUNK_BYTES, CHUNK_RECORDS, chunk_cuts

PARTITIONS = 2  # the bench's local[2]: two tasks stage, one commit publishes


def events(rows: int) -> pa.RecordBatch:
    """Click events like the demo's, ``data`` as JSON text and no tag (the bench's)."""
    data = [
        b'{"user":"user-%06d","action":"view","page":"/product/%d","ts":%d}'
        % (i % 50_000, i % 5_000, 1_790_000_000_000 + 3 * i)
        for i in range(rows)
    ]
    return pa.record_batch([pa.array(data, pa.string()), pa.nulls(rows, pa.string())],
                           names=["data", "tag"])  # fmt: skip


def task_bodies(batch: pa.RecordBatch) -> list[bytes]:
    """What the sink's tasks send: stage request bodies cut as the sink cuts them
    (``chunk_cuts``), each the rows' data values with their lengths (the ``data`` form
    of a stage)."""
    (values,) = encode_values(batch, "out").values()
    cuts = chunk_cuts(values)
    bodies = []
    for lo, hi in itertools.pairwise([*cuts, len(values)] if cuts[-1] < len(values) else cuts):
        chunk = values.slice(lo, hi - lo)
        call = stage_data("out", "w", 1, 0, 0, 0, joined_values(chunk, trim=1),
                          value_lengths(chunk), 0)  # fmt: skip
        assert call.content is not None
        bodies.append(call.content)
    return bodies


def one_round(rows: int, batch_id: int, engine: object, store: object, epoch: int,
              profile: str | None) -> dict[str, float]:  # fmt: skip
    batch = events(rows)
    steps: dict[str, float] = {}
    began = time.process_time()
    bodies = task_bodies(batch)
    steps["task: encode + bodies"] = time.process_time() - began
    per_part = len(bodies) // PARTITIONS or 1
    parts: list[tuple[PartKey, int]] = []
    prof = cProfile.Profile() if profile else None
    decode_s = stage_s = 0.0
    for p in range(PARTITIONS):
        mine = bodies[p * per_part : (p + 1) * per_part] if p < PARTITIONS - 1 else (
            bodies[p * per_part :])  # fmt: skip
        for chunk, body in enumerate(mine):
            if prof and profile == "stage":
                prof.enable()
            t0 = time.process_time()
            _, records = decode_stage(body, engine.limits)  # type: ignore[attr-defined]
            t1 = time.process_time()
            engine.stage("out", "w", epoch, batch_id, PartKey(p, 0), records,  # type: ignore[attr-defined]
                         chunk=chunk)  # fmt: skip
            t2 = time.process_time()
            if prof and profile == "stage":
                prof.disable()
            decode_s += t1 - t0
            stage_s += t2 - t1
        parts.append((PartKey(p, 0), len(mine)))
    steps["server: stage decode"] = decode_s
    steps["server: Engine.stage"] = stage_s
    if prof and profile == "publish":
        prof.enable()
    w0, t0 = time.perf_counter(), time.process_time()
    layout = engine.lay_out_publish("out", "w", epoch, batch_id, parts)  # type: ignore[attr-defined]
    w1, t1 = time.perf_counter(), time.process_time()
    built = build(layout) if layout is not None else None
    w2, t2 = time.perf_counter(), time.process_time()
    result = engine.publish("out", "w", epoch, batch_id, parts, built)  # type: ignore[attr-defined]
    w3, t3 = time.perf_counter(), time.process_time()
    store.sync_blocking()  # type: ignore[attr-defined]
    w4, t4 = time.perf_counter(), time.process_time()
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    assert result.count == rows and not result.replayed, result
    steps["server: publish lay_out"] = t1 - t0
    steps["server: publish build (worker thread)"] = t2 - t1
    steps["server: Engine.publish (event loop)"] = t3 - t2
    steps["server: WAL sync"] = t4 - t3
    # Wall clock of the serial commit's steps (the driver waits for all of them); CPU
    # above counts every thread of the process, so a parallel build shows here.
    steps["wall: publish lay_out"] = w1 - w0
    steps["wall: publish build"] = w2 - w1
    steps["wall: Engine.publish"] = w3 - w2
    steps["wall: WAL write + sync"] = w4 - w3
    steps["wall: the serial commit, all told"] = w4 - w0
    # The next seal writes the batch's chunks as segments (a background thread, the same
    # cores): what it costs per record, written to a scratch directory.
    topic = engine.kernel.existing("out")  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory(prefix="waymark-sink-probe-seal-") as scratch:
        t0 = time.process_time()
        for chunk in topic.chunks:
            if chunk.base_seq >= result.first_seq and chunk.n:
                write_segment(Path(scratch), chunk, bytes(chunk.n), FileIO(), chunk.buf)
        steps["server: seal, its segments (background)"] = time.process_time() - t0
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", choices=["stage", "publish"], default=None)
    a = parser.parse_args()
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="waymark-sink-probe-") as tmp:
        engine, store, _ = open_engine(StorageConfig(Path(tmp)), clock=ManualClock(1_000))
        epoch = engine.open_writer("w")
        for i in range(1 if a.profile else a.rounds):
            for step, s in one_round(a.rows, i, engine, store, epoch, a.profile).items():
                best[step] = min(best.get(step, s), s)
        engine.close()
        store.sync_blocking()
        store.close()
    if a.profile:
        return
    print(f"{a.rows:,} rows, {PARTITIONS} parts of chunks of {CHUNK_RECORDS:,} records and "
          f"{CHUNK_BYTES >> 20} MiB at the most; "
          f"CPU s, best of {a.rounds}")  # fmt: skip
    for step, s in best.items():
        print(f"  {step:<40} {s:7.3f} s  {s * 1e6 / a.rows:6.2f} µs/record")
    server = sum(s for k, s in best.items() if k.startswith("server"))
    commit = sum(s for k, s in best.items() if k.startswith("server") and (
        "publish" in k or "WAL" in k))  # fmt: skip
    print(f"  {'server, the publish (serial commit)':<40} {commit:7.3f} s  "
          f"{commit * 1e6 / a.rows:6.2f} µs/record")  # fmt: skip
    print(f"  {'server, all told':<40} {server:7.3f} s  {server * 1e6 / a.rows:6.2f} µs/record")


if __name__ == "__main__":
    main()
