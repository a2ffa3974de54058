"""The file operations durable storage performs, behind one small seam.

Production uses :class:`FileIO` (plain ``os`` calls). Tests that need a disk that
fills up or fails substitute a fault injector with the same methods.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

Buffer = bytes | bytearray | memoryview


class FileIO:
    def open_append(self, path: Path) -> int:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace_file(self, path: Path, data: Buffer | Sequence[Buffer]) -> None:
        """Make ``path`` hold ``data`` (one buffer, or several one after the other),
        atomically: a temporary file is written and synced, then renamed over ``path``,
        and the directory synced so the rename survives too."""
        temporary = path.with_name(path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for part in [data] if isinstance(data, Buffer) else data:
                view = memoryview(part)
                while view:
                    view = view[self.write(fd, view) :]
            self.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        self.fsync_dir(path.parent)

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
