"""What the rebuild of change checkpoints costs a restart (docs/recovery.md, "Costs and
figures"; docs/semantics/recovery.md §1.6).

Run: ``.venv/bin/python bench/restart_rebuild.py [--records 1000000] [--rounds 3]``.
Not a test: it prints figures and ratios.

A data directory holds ``--records`` records (batches of 1 000, 10 000 keys) appended
since the last change checkpoint, all in the WAL (a SIGKILL before any seal). The
restart is ``open_engine`` on it with change tracking (the rebuild notes every replayed
append) against the same restart without it (the anchor: ``--checkpoint-interval-s
0``). Each restart opens a fresh copy of the directory; the modes alternate and the best
of the rounds counts. Then the first checkpoint after the restart: the per-key merge of
everything rebuilt, which runs once, off the restart path.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from waymark.log import RecordIn
from waymark.log.config import StorageConfig
from waymark.log.storage.restore import open_engine

BATCH = 1_000
KEYS = 10_000


def build(data: Path, records: int) -> None:
    """``records`` appended since the last checkpoint, in the WAL only."""
    engine, store, _ = open_engine(StorageConfig(data), track_changes=True)
    engine.track_changes(86_400_000)
    payload = {"order": 1, "amount": 12.5, "note": "x" * 40}
    for start in range(0, records, BATCH):
        batch = [RecordIn.of(payload, tag=f"k{(start + i) % KEYS}") for i in range(BATCH)]
        engine.append("orders", batch)
    store.sync_blocking()
    store.close()  # no seal, no exact heads: as a SIGKILL leaves it


def restart(source: Path, work: Path, track: bool) -> tuple[float, float]:
    """Seconds to open a fresh copy of ``source``, and of its first checkpoint's merge."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, work)
    started = time.perf_counter()
    engine, store, _ = open_engine(StorageConfig(work), track_changes=track)
    opened = time.perf_counter() - started
    merge = 0.0
    if engine.changes is not None:
        started = time.perf_counter()
        changes, _ = engine.changes.take()
        merge = time.perf_counter() - started
        assert len(changes) == KEYS, len(changes)
    store.close()
    return opened, merge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="waymark-rebuild-"))
    try:
        started = time.perf_counter()
        build(root / "source", args.records)
        built = time.perf_counter() - started
        on: list[float] = []
        off: list[float] = []
        merges: list[float] = []
        for _ in range(args.rounds):
            opened, merge = restart(root / "source", root / "work", True)
            on.append(opened)
            merges.append(merge)
            off.append(restart(root / "source", root / "work", False)[0])
        table = Table("measure", "change tracking on", "anchor: off", "ratio",
                      title=f"restart with {args.records:,} records since the last checkpoint "
                      f"(built in {built:.1f} s; best of {args.rounds})")  # fmt: skip
        table.add_row("restart (open_engine)", f"{min(on):.2f} s", f"{min(off):.2f} s",
                      f"{min(on) / min(off):.2f}x")  # fmt: skip
        table.add_row("first checkpoint's merge", f"{min(merges):.2f} s", "-", "-")
        Console().print(table)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
