"""The full-disk fault: the server's data directory on a small tmpfs, filled up and
emptied again (docs/faults.md, "Faults").

Mounting a tmpfs needs root (CAP_SYS_ADMIN); ``TmpfsDisk.mount`` says whether it
could, and a campaign without it leaves the fault out and says so in its report.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path

CHUNK = 1 << 20


class TmpfsDisk:
    def __init__(self, path: Path, size_mb: int = 256) -> None:
        self.path = path
        self.size_mb = size_mb
        self.mounted = False
        self.filler = path / "disk-full.filler"

    def mount(self) -> bool:
        """Mount a tmpfs of ``size_mb`` at ``path``; False if this process may not."""
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)],
            capture_output=True,
            check=False,
        )
        self.mounted = done.returncode == 0
        return self.mounted

    def fill(self) -> int:
        """Write the filler until the disk refuses (ENOSPC); the bytes written."""
        written = 0
        block = b"\0" * CHUNK
        with self.filler.open("wb", buffering=0) as f:
            while True:
                try:
                    written += f.write(block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    if len(block) == 1:
                        return written
                    block = block[: len(block) // 16 or 1]  # fill the last bytes too

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.filler)

    def unmount(self) -> None:
        if self.mounted:
            self.free()
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
            self.mounted = False
