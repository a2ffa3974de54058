"""The durable committed-checkpoint file.

One file holds every source's committed checkpoint. A save writes a temporary
file, fsyncs it, renames it over the real one and fsyncs the directory (the
Filebeat registrar lesson): a crash at any point leaves either the old file or
the new one, never a torn one. The payload carries a CRC32 so a file damaged
some other way is refused loudly instead of restarting from the beginning.

Saving costs an fsync (about 2 ms): call it when ``Tracker.version`` changed,
on a timer, not per ack. From asyncio, ``await asyncio.to_thread(store.save, snap)``.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from waymark.checkpoint.errors import CheckpointStoreCorrupt
from waymark.checkpoint.tracker import Committed

_MAGIC = b"waymark-checkpoints 1 "


class CheckpointStore:
    """Committed checkpoints of many sources in one file; one owner process at a time.

    Checkpoints must be JSON values (int, str, list, dict, ...); a tuple comes back
    as a list.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + ".tmp")

    def load(self) -> dict[str, Committed[Any]]:
        """The last saved checkpoints ({} if never saved)."""
        # A temp file is the remains of a save that crashed before its rename: its
        # content was never committed, so it is discarded, never read.
        self._tmp.unlink(missing_ok=True)
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        header, sep, payload = raw.partition(b"\n")
        if not sep or not header.startswith(_MAGIC):
            raise CheckpointStoreCorrupt(f"{self.path}: not a waymark checkpoint file")
        try:
            expected = int(header[len(_MAGIC) :], 16)
        except ValueError:
            raise CheckpointStoreCorrupt(f"{self.path}: unreadable header {header!r}") from None
        if zlib.crc32(payload) != expected:
            raise CheckpointStoreCorrupt(f"{self.path}: checksum mismatch, refusing to resume")
        sources = orjson.loads(payload)
        return {
            name: Committed(entry["batch_id"], entry["checkpoint"])
            for name, entry in sources.items()
        }

    def save(self, committed: Mapping[str, Committed[Any]]) -> None:
        """Durably replace the saved checkpoints with ``committed``."""
        payload = orjson.dumps(
            {
                name: {"batch_id": c.batch_id, "checkpoint": c.checkpoint}
                for name, c in committed.items()
            },
            option=orjson.OPT_SORT_KEYS,
        )
        data = b"%s%08x\n%s" % (_MAGIC, zlib.crc32(payload), payload)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self._tmp, self.path)
        # The rename lives in the directory: without this fsync a power cut can undo it.
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
