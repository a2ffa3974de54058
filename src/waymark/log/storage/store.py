"""The handle on one data directory: its WAL and its checkpoints."""

from __future__ import annotations

from ..engine import Engine
from .checkpoint import Checkpointer, CheckpointReport
from .wal import Wal


class Store:
    def __init__(self, wal: Wal, checkpointer: Checkpointer) -> None:
        self.wal = wal
        self.checkpointer = checkpointer

    def checkpoint(self, engine: Engine) -> CheckpointReport:
        """Seal the tail into segments and trim the WAL, all on this thread."""
        return self.checkpointer.run_blocking(engine)

    def sync_blocking(self) -> None:
        self.wal.sync_blocking()

    def close(self) -> None:
        self.wal.close()
