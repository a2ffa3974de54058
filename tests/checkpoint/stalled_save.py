"""Fault injector (named as such): a checkpoint disk that stalls one save.

``StallingStore`` holds its first ``save`` (an fsync on a loaded machine) until
``release`` is set. The shipper's saver takes its snapshot before that save, so
what is committed while it stalls reaches the disk only if the saver saves again
once the run is over (docs/checkpoint.md, "Shipper": the final checkpoint is
saved). A slow disk cannot be produced reliably from outside the process.

Run as a script, it is ``waymark ship`` (the shipped CLI entry point, same
arguments) whose first save is held until the shipper's tracker has drained,
i.e. until the run is over and only the final save is left; at exit it prints,
as JSON, the checkpoints that stalled save held.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from waymark.checkpoint import CheckpointStore, Committed, Tracker


class StallingStore(CheckpointStore):
    """Fault injector: the first save blocks (in the saver's thread) until ``release``."""

    def __init__(self, path: Path, release: threading.Event) -> None:
        super().__init__(path)
        self.release = release
        self.entered = threading.Event()  # the first save has begun and is held
        self.stalled: dict[str, Any] | None = None  # what that save wrote

    def save(self, committed: Mapping[str, Committed[Any]]) -> None:
        if not self.entered.is_set():
            self.stalled = {name: c.checkpoint for name, c in committed.items()}
            self.entered.set()
            if not self.release.wait(60):
                raise RuntimeError("fault injector: the stalled save was never released")
        super().save(committed)


def main() -> None:
    from waymark.checkpoint import shipper
    from waymark.cli import main as waymark

    drained = threading.Event()
    stores: list[StallingStore] = []

    def store(path: Path) -> StallingStore:
        stores.append(StallingStore(path, drained))
        return stores[-1]

    class ReleasingTracker(Tracker[Any]):
        """The production tracker; once ``drain()`` returns, the held save goes on."""

        async def drain(self) -> dict[str, Committed[Any]]:
            final = await super().drain()
            drained.set()
            return final

    shipper.CheckpointStore = store  # type: ignore[misc,assignment]
    shipper.Tracker = ReleasingTracker  # type: ignore[misc]
    sys.argv = ["waymark", *sys.argv[1:]]
    try:
        waymark()
    finally:
        held = stores[0].stalled if stores else None
        print(f"fault injector: the stalled save held {orjson.dumps(held).decode()}", flush=True)


if __name__ == "__main__":
    main()
