"""The clock-jump fault: the file a server's injected clock adds to the wall clock
(``waymark serve --clock-offset-file``, :class:`waymark.clock.OffsetClock`), rewritten
to jump the clock ahead and back (docs/faults.md, "Faults").

A jump ahead expires what a TTL would expire that much later (and leases, and
tokens); the jump back at the lift steps the wall clock back under the records
written meanwhile, whose timestamps must still never decrease along seqs.
"""

from __future__ import annotations

import os
from pathlib import Path


class ClockFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.set(0)

    def set(self, offset_ms: int) -> None:
        """Make the server's clock the wall clock plus ``offset_ms`` (written whole: the
        server reads it every 0.1 s)."""
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(f"{offset_ms}\n")
        os.replace(temporary, self.path)
