"""What a killed fold node leaves beside its store, and the lock that lets a
restart remove it (docs/kv.md, "Crash leftovers").

A node's transient files live beside its store ``PATH`` (the same file system,
so exports hard-link): an export round's working copy under ``.NAME.exports/``,
a bootstrap's download (``.NAME.download-*``) and import stage
(``.NAME.import-*``), an append log's compaction temp (``NAME.compact.tmp``).
A SIGKILL leaves them there. They are the node's own, named after its store,
and only the process holding the store's lock (``.NAME.lock``, an ``flock``)
removes them: what a live node holds is its work in progress.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path

from waymark.kv.errors import StoreInUse


def exports_dir(store_path: Path) -> Path:
    """Where the node's export rounds make their transient artifacts."""
    return store_path.parent / f".{store_path.name}.exports"


def generation_path(store_path: Path) -> Path:
    """Where a fold node records the generation of the bucket its fold is of
    (``KvStore.generation``): a fold of a deleted bucket must not resume on its successor."""
    return store_path.parent / f".{store_path.name}.generation"


def download_prefix(store_path: Path) -> str:
    """The name prefix of a bootstrap's download directory beside the store."""
    return f".{store_path.name}.download-"


class StoreLock:
    """An exclusive ``flock`` on ``.NAME.lock`` beside the store, held until closed.

    Raises StoreInUse when another process holds it (the lock dies with its
    process, so a killed node never leaves it held).
    """

    def __init__(self, store_path: Path) -> None:
        store_path.parent.mkdir(parents=True, exist_ok=True)
        self.path = store_path.parent / f".{store_path.name}.lock"
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise StoreInUse(f"another process runs a fold on {store_path} ({self.path})") from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StoreLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).lstat().st_size
    return total


def leftovers(store_path: Path) -> list[Path]:
    """The store's transient files a killed run could have left (they may be none)."""
    name, parent = store_path.name, store_path.parent
    if not parent.is_dir():
        return []
    found = [
        p
        for p in parent.iterdir()
        if p.name.startswith((f".{name}.download-", f".{name}.import-"))
        or p.name == f"{name}.compact.tmp"
    ]
    work = exports_dir(store_path)
    if work.is_dir():
        found += list(work.iterdir())
    return sorted(found)


def clean_leftovers(store_path: Path, lock: StoreLock) -> list[tuple[Path, int]]:
    """Remove what a killed run left beside the store: (path, bytes) of each.

    ``lock`` is the proof that no live node is using them.
    """
    assert lock.path.parent == store_path.parent
    removed = []
    for p in leftovers(store_path):
        size = _size(p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        removed.append((p, size))
    return removed
