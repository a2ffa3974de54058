"""``file://`` object store with real compare-and-swap.

obstore's LocalStore can create-only but has no update-CAS, so this store does
its own. Objects are plain files under the root (a key's ``/`` are directory
separators); every write lands in a temp file first and is renamed into place,
so a reader sees the old object or the new one, never a mix. Every write and
delete runs its compare and its rename under one ``flock`` on
``<root>/.objstore/lock``, which makes create-only, If-Match put and If-Match
delete atomic among all processes of the host that share that file system
(``flock`` is not reliable over network file systems).

The ETag is ``inode-mtime_ns-size`` of the file. Under the lock each write
stamps its temp file with an mtime strictly greater than every mtime the store
issued before (a counter kept in the lock file), so two versions of a key never
share an ETag: a compare cannot be fooled by an inode reused within the same
timer tick.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from waymark.clock import Clock, SystemClock
from waymark.objstore.types import (
    OVERWRITE,
    PART_SIZE,
    UPLOAD_CONCURRENCY,
    Capabilities,
    ConditionalWriteUnsupported,
    Create,
    GetResult,
    IfMatch,
    InvalidKey,
    ObjectExists,
    ObjectMeta,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStream,
    ObjectVersion,
    PreconditionFailed,
    PutMode,
)

PATHS_CACHED = 4096
"""Keys whose paths a store keeps made (the cache starts over past this many)."""

INTERNAL = ".objstore"
"""The root's reserved directory: the lock (and mtime counter) and temp files."""

NETWORK_FILE_SYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre",
     "gpfs", "ncpfs", "fuse"}
)  # fmt: skip
"""File systems whose ``flock`` does not exclude other hosts (NFS emulates it with
byte-range locks, or not at all; FUSE file systems may ignore it): the compare-and-swap
of this store is not atomic there (docs/kv.md, "Object stores")."""


def file_system_type(path: Path) -> str | None:
    """The type of the file system holding ``path`` (Linux ``/proc/self/mountinfo``:
    the longest mount point containing it); None where that cannot be told."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target = str(path.resolve())
    best, found = -1, None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > best:
            best, found = len(mount), right.split()[0]
    return found


def cas_is_atomic(fs_type: str | None) -> bool:
    """Whether this store's ``flock``-based compare-and-swap is atomic on ``fs_type``.
    An unknown type (not Linux) is trusted: a local disk is the common case."""
    if fs_type is None:
        return True
    return fs_type not in NETWORK_FILE_SYSTEMS and not fs_type.startswith("fuse.")


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalObjectStore:
    """Objects as files under ``root``; compare-and-swap by rename under an ``flock``.

    ``capabilities`` says whether that is atomic: not on a network or FUSE file
    system (:func:`cas_is_atomic`), where a transport then fails closed.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, clock: Clock | None = None, fsync: bool = True
    ) -> None:
        self.root = Path(root).absolute()
        self.url = self.root.as_uri()
        self._clock = clock or SystemClock()
        self._fsync = fsync
        self._tmp = self.root / INTERNAL / "tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)
        self.file_system = file_system_type(self.root)
        atomic = cas_is_atomic(self.file_system)
        self.capabilities = Capabilities(conditional_put=atomic, conditional_delete=atomic)
        self._lock_path = self.root / INTERNAL / "lock"
        self._paths: dict[str, Path] = {}  # key -> its file, as _path made it

    # -- keys and files -------------------------------------------------------

    def _path(self, key: str) -> Path:
        # A pipeline's stages read the same few keys (states, handoff records) every
        # step: each key's path is checked and built once (pathlib's joins cost more
        # than the read), in a cache bounded for stores of many keys.
        path = self._paths.get(key)
        if path is not None:
            return path
        parts = key.split("/")
        if (
            not key
            or "\0" in key
            or parts[0] == INTERNAL
            or any(p in ("", ".", "..") for p in parts)
        ):
            raise InvalidKey(f"invalid object key {key!r}")
        if len(self._paths) >= PATHS_CACHED:
            self._paths.clear()
        path = self._paths[key] = self.root.joinpath(*parts)
        return path

    def _meta(self, key: str, st: os.stat_result) -> ObjectMeta:
        return ObjectMeta(key, st.st_size, st.st_mtime_ns // 1_000_000, _etag(st))

    def _stat(self, path: Path) -> os.stat_result | None:
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not path.is_file():
            raise ObjectStoreError(f"{path} is not a regular file")
        return st

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    @contextlib.contextmanager
    def _write_temp(self, chunks: Iterable[bytes]) -> Iterator[Path]:
        """The object's bytes in a temp file, flocked until it is committed or removed:
        :meth:`clean_abandoned_temp` removes only temp files nobody holds."""
        tmp = self._tmp / uuid.uuid4().hex
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                if self._fsync:
                    os.fsync(f.fileno())
            yield tmp
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()  # only still there if the commit was refused or failed
            os.close(fd)

    def clean_abandoned_temp(self, min_age_s: float | None = None) -> Sequence[tuple[str, int]]:
        """Remove temp files a killed writer left (name, bytes): those older than
        ``min_age_s`` (default a minute) that no live writer holds (docs/kv.md, "Crash
        leftovers")."""
        min_age_s = 60.0 if min_age_s is None else min_age_s
        removed: list[tuple[str, int]] = []
        now_ns = self._clock.now_ms() * 1_000_000
        for p in self._tmp.iterdir():
            try:
                st = p.stat()
                if now_ns - st.st_mtime_ns < min_age_s * 1e9:
                    continue
                fd = os.open(p, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live writer's
            else:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                    removed.append((p.name, st.st_size))
            finally:
                os.close(fd)
        return removed

    def _stamp(self, lock_fd: int, tmp: Path, current: os.stat_result | None) -> None:
        """Give ``tmp`` an mtime above every one issued so far (caller holds the lock)."""
        raw = os.pread(lock_fd, 8, 0)
        last = int.from_bytes(raw, "big") if len(raw) == 8 else 0
        if current is not None:
            last = max(last, current.st_mtime_ns)  # survives a counter lost in a crash
        stamp = max(self._clock.now_ms() * 1_000_000, last + 1)
        os.utime(tmp, ns=(stamp, stamp))
        if tmp.stat().st_mtime_ns != stamp:
            raise ConditionalWriteUnsupported(
                f"{self.root}: the file system does not keep nanosecond mtimes, "
                "so versions cannot be told apart"
            )
        os.pwrite(lock_fd, stamp.to_bytes(8, "big"), 0)

    def _commit(self, key: str, tmp: Path, mode: PutMode) -> ObjectVersion:
        path = self._path(key)
        with self._locked() as lock_fd:
            current = self._stat(path)
            if isinstance(mode, Create) and current is not None:
                raise ObjectExists(key)
            if isinstance(mode, IfMatch) and (
                current is None or _etag(current) != mode.version.etag
            ):
                raise PreconditionFailed(f"{key} is not at version {mode.version.etag}")
            self._stamp(lock_fd, tmp, current)
            st = tmp.stat()
            path.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, path)
            if self._fsync:
                _fsync_dir(path.parent)
        return ObjectVersion(_etag(st))

    # -- the ObjectStore API ---------------------------------------------------

    def put(self, key: str, data: bytes, *, mode: PutMode = OVERWRITE) -> ObjectVersion:
        self._path(key)  # refuse a bad key before writing anything
        with self._write_temp((data,)) as tmp:
            return self._commit(key, tmp, mode)

    def upload(
        self,
        key: str,
        chunks: Iterable[bytes],
        *,
        part_size: int = PART_SIZE,
        concurrency: int = UPLOAD_CONCURRENCY,
    ) -> ObjectVersion:
        """Stream ``chunks`` into the object (overwrite); there are no parts on a local disk."""
        self._path(key)
        with self._write_temp(chunks) as tmp:
            return self._commit(key, tmp, OVERWRITE)

    def get(self, key: str) -> GetResult:
        with self._open(key) as f:
            meta = self._meta(key, os.fstat(f.fileno()))
            return GetResult(f.read(), meta)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self._open(key) as f:
            return os.pread(f.fileno(), max(0, end - start), start)

    def head(self, key: str) -> ObjectMeta:
        st = self._stat(self._path(key))
        if st is None:
            raise ObjectNotFound(key)
        return self._meta(key, st)

    def stream(self, key: str, *, chunk_size: int = PART_SIZE) -> ObjectStream:
        f = self._open(key)
        meta = self._meta(key, os.fstat(f.fileno()))

        def chunks() -> Iterator[bytes]:
            while chunk := f.read(chunk_size):
                yield chunk

        return ObjectStream(meta, chunks(), f.close)

    def _open(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            return open(path, "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key) from None

    def delete(self, key: str, *, if_match: ObjectVersion | None = None) -> None:
        """Delete the object; without ``if_match`` a missing object is not an error."""
        path = self._path(key)
        with self._locked():
            current = self._stat(path)
            if if_match is not None and (current is None or _etag(current) != if_match.etag):
                raise PreconditionFailed(f"{key} is not at version {if_match.etag}")
            if current is None:
                return
            path.unlink()
            if self._fsync:
                _fsync_dir(path.parent)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Objects whose key starts with ``prefix``, in key order."""
        head, _, _ = prefix.rpartition("/")
        start = self.root.joinpath(*head.split("/")) if head else self.root
        found: list[tuple[str, os.stat_result]] = []
        for dirpath, dirnames, filenames in os.walk(start):
            rel = os.path.relpath(dirpath, self.root)
            base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            if not base:
                dirnames[:] = [d for d in dirnames if d != INTERNAL]
            for name in filenames:
                key = base + name
                if key.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):
                        found.append((key, os.stat(os.path.join(dirpath, name))))
        found.sort(key=lambda kv: kv[0])
        for key, st in found:
            yield self._meta(key, st)
