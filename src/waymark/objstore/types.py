"""Backend-neutral value types and errors of the conditional-write object store."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from waymark.protocol.errors import WaymarkError

PART_SIZE = 8 * 1024 * 1024
"""Multipart upload part size, and the chunk size of streaming downloads."""

UPLOAD_CONCURRENCY = 8
"""Parts of one multipart upload in flight at once."""


@dataclass(frozen=True, slots=True)
class ObjectVersion:
    """What identifies one stored version of an object, for conditional writes.

    ``etag`` is what If-Match compares; ``version`` is the store's version id
    where it keeps one (S3 with versioning), else None.
    """

    etag: str | None
    version: str | None = None


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    key: str
    size: int
    last_modified_ms: int
    etag: str | None
    version: str | None = None

    @property
    def object_version(self) -> ObjectVersion:
        return ObjectVersion(self.etag, self.version)


@dataclass(frozen=True, slots=True)
class GetResult:
    data: bytes
    meta: ObjectMeta


@dataclass(frozen=True, slots=True)
class Overwrite:
    """Write whatever is there (last writer wins)."""


@dataclass(frozen=True, slots=True)
class Create:
    """Write only if no object exists under the key, else :class:`ObjectExists`."""


@dataclass(frozen=True, slots=True)
class IfMatch:
    """Write only if the object is still at ``version``, else :class:`PreconditionFailed`."""

    version: ObjectVersion


PutMode = Overwrite | Create | IfMatch
OVERWRITE = Overwrite()
CREATE = Create()


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Which conditional operations the store really performs atomically.

    A caller whose correctness rests on compare-and-swap checks these and
    fails closed instead of degrading to read-then-write.
    """

    conditional_put: bool
    conditional_delete: bool


class ObjectStream(io.RawIOBase):
    """A streaming download: ``meta`` of the version being read, its bytes as chunks.

    Also a readable raw file (``read``/``readinto``), so a streaming reader such
    as ``tarfile`` in ``r|`` mode consumes it without the whole object in memory.
    """

    def __init__(
        self, meta: ObjectMeta, chunks: Iterator[bytes], on_close: Callable[[], None] | None = None
    ) -> None:
        super().__init__()
        self.meta = meta
        self._chunks = chunks
        self._on_close = on_close
        self._buf = memoryview(b"")

    def __iter__(self) -> Iterator[bytes]:  # type: ignore[override]
        if self._buf:
            yield bytes(self._buf)
            self._buf = memoryview(b"")
        yield from self._chunks

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._buf:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buf = memoryview(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        if not self.closed and self._on_close is not None:
            self._on_close()
        super().close()


class ObjectStoreError(WaymarkError):
    """Base of every error raised by an object store."""


class ObjectNotFound(ObjectStoreError):
    """No object under the key."""


class ObjectExists(ObjectStoreError):
    """A create-only put found an object under the key."""


class PreconditionFailed(ObjectStoreError):
    """A conditional put or delete found the object absent or at another version."""


class ConditionalWriteUnsupported(ObjectStoreError):
    """The store cannot perform this conditional operation atomically."""


class InvalidKey(ObjectStoreError, ValueError):
    """A key the store refuses (empty segment, ``..``, a reserved name)."""
