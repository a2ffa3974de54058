"""The handle on one data directory: its WAL and its seals."""

from __future__ import annotations

from ..engine import Engine
from .seal import Sealer, SealReport
from .wal import Wal


class Store:
    def __init__(self, wal: Wal, sealer: Sealer) -> None:
        self.wal = wal
        self.sealer = sealer

    def seal(self, engine: Engine) -> SealReport:
        """Seal the tail into segments and trim the WAL, all on this thread."""
        return self.sealer.run_blocking(engine)

    def sync_blocking(self) -> None:
        self.wal.sync_blocking()

    def close(self) -> None:
        self.wal.close()
