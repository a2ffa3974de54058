"""A producer's in-flight bookkeeping on a pipeline edge, without servers (docs/pipeline.md,
"In-flight records"): what a stage does per batch besides the HTTP calls.

Per batch of 500 records: add them to the unacknowledged window, encode the append
body, record the seqs the server gave, forget what a checkpoint two batches behind
acknowledges, find the oldest origin. Both sides do the same work on the same bytes:

* anchor: one Python object per record (a slotted dataclass), a list as the window,
  ``RecordIn`` structs encoded by msgspec — the edge as it was before ``InFlight``;
* waymark: ``waymark.pipeline.InFlight`` columns, one per push, held in a
  ``waymark.pipeline.window.Window`` as an edge holds them; the body joined from them.

Run: ``.venv/bin/python bench/inflight.py [--batches 400]``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import msgspec
from rich.console import Console
from rich.table import Table

from waymark.client import RecordIn
from waymark.pipeline import InFlight, Position
from waymark.pipeline.window import Window

BATCH = 500
LAG = 2  # batches between a write and its acknowledgement


@dataclass(slots=True)
class Item:
    event: str
    data: bytes
    origin: Position
    born_ms: int
    position: Position | None = None


class _Body(msgspec.Struct):
    records: list[RecordIn]


def objects(batches: int, payloads: list[bytes]) -> float:
    encode = msgspec.json.Encoder().encode
    unacked: list[Item] = []
    seq = 0
    began = time.perf_counter()
    for b in range(batches):
        new = [Item(f"produce:{b * BATCH + i}", payloads[i], Position(0, b * BATCH + i), 7)
               for i in range(BATCH)]  # fmt: skip
        unacked.extend(new)
        encode(_Body([
            RecordIn(msgspec.Raw(item.data), meta={"wm.gen": "1", "wm.event": item.event,
                     "wm.t0": str(item.born_ms)}, id=f"{item.event}@1")
            for item in new
        ]))  # fmt: skip
        for item in new:
            seq += 1
            item.position = Position(1, seq)
        acked = Position(1, (b - LAG + 1) * BATCH)
        unacked = [
            i for i in unacked
            if i.position is None or i.position.generation != acked.generation
            or i.position.seq > acked.seq
        ]  # fmt: skip
        min((item.origin for item in unacked), default=None)
    return time.perf_counter() - began


def columns(batches: int, payloads: list[bytes]) -> float:
    unacked = Window()
    began = time.perf_counter()
    for b in range(batches):
        lo = b * BATCH
        new = InFlight.build([b'"produce:%d"' % n for n in range(lo, lo + BATCH)], payloads,
                             origin_seq=range(lo, lo + BATCH), born_ms=7)  # fmt: skip
        start = len(unacked)
        unacked += new.packed()  # one pack a batch, as an edge holds it
        unacked.edge_packs(start, 1)
        unacked.place(start, 1, [b + 1])  # pack b at seq b + 1
        unacked.forget(Position(1, b - LAG + 1))
        unacked.oldest_origin()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    args = parser.parse_args()
    payloads = [msgspec.json.encode({"event_id": n, "user": f"u{n % 97}", "amount": n % 13})
                for n in range(BATCH)]  # fmt: skip
    records = args.batches * BATCH
    load = os.getloadavg()[0]
    runs = {
        "anchor: one object per record": min(objects(args.batches, payloads) for _ in range(3)),
        "waymark: InFlight columns": min(columns(args.batches, payloads) for _ in range(3)),
    }
    anchor = records / runs["anchor: one object per record"]
    table = Table(title=f"{records:,} records, batches of {BATCH}, best of 3, load {load:.1f}")
    for column in ("run", "seconds", "records/s", "vs anchor"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for name, took in runs.items():
        rate = records / took
        table.add_row(name, f"{took:.3f}", f"{rate:,.0f}", f"{rate / anchor:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
