"""waymark.objstore: an object store with conditional writes, behind one typed API.

``get`` (with the ETag/version read), ``put`` create-only or If-Match,
``delete`` If-Match, ``list``, multipart ``upload`` and streaming ``stream``
work the same on every backend: ``file:///dir`` (a local directory with its own
real compare-and-swap) and ``s3://bucket/prefix`` (obstore, configured by the
standard ``AWS_*`` environment, e.g. ``AWS_ENDPOINT_URL`` and
``AWS_ALLOW_HTTP=true`` for a local S3). The package knows nothing about what
is stored. See docs/kv.md ("Object stores").
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable
from urllib.parse import unquote, urlparse

from waymark.clock import Clock
from waymark.objstore.local import LocalObjectStore
from waymark.objstore.remote import ObstoreObjectStore
from waymark.objstore.types import (
    CREATE,
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
    Overwrite,
    PreconditionFailed,
    PutMode,
)

if TYPE_CHECKING:
    from obstore.store import ClientConfig


@runtime_checkable
class ObjectStore(Protocol):
    """What every backend offers. Keys are ``/``-separated paths."""

    url: str
    capabilities: Capabilities

    def get(self, key: str) -> GetResult:
        """The object's bytes and the metadata (ETag, version) of exactly that version."""
        ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` up to ``end`` (exclusive)."""
        ...

    def head(self, key: str) -> ObjectMeta: ...

    def put(self, key: str, data: bytes, *, mode: PutMode = OVERWRITE) -> ObjectVersion:
        """Atomic put: ``OVERWRITE``, ``CREATE`` (else ObjectExists) or
        ``IfMatch(version)`` (else PreconditionFailed)."""
        ...

    def upload(
        self,
        key: str,
        chunks: Iterable[bytes],
        *,
        part_size: int = PART_SIZE,
        concurrency: int = UPLOAD_CONCURRENCY,
    ) -> ObjectVersion:
        """Multipart upload of a stream (overwrite); no reader sees a partial object."""
        ...

    def stream(self, key: str, *, chunk_size: int = PART_SIZE) -> ObjectStream:
        """A streaming download of the object's current version."""
        ...

    def delete(self, key: str, *, if_match: ObjectVersion | None = None) -> None:
        """Delete; with ``if_match`` only that version (else PreconditionFailed)."""
        ...

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Objects whose key starts with ``prefix``, in key order."""
        ...

    def clean_abandoned_temp(self, min_age_s: float | None = None) -> Sequence[tuple[str, int]]:
        """Remove what writers killed mid-upload left behind and no live writer holds,
        older than ``min_age_s`` (None: the backend's safe default): (name, bytes) of
        each. Startup housekeeping."""
        ...


def open_store(url: str, *, clock: Clock | None = None) -> ObjectStore:
    """The store at ``file:///dir`` or ``s3://bucket[/prefix]``.

    ``clock`` stamps the local store's modification times (S3 stamps its own) and
    tells the age of an abandoned upload.
    """
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{url}: a file:// URL names a local path (file:///dir)")
        return LocalObjectStore(Path(unquote(parsed.path)), clock=clock)
    if parsed.scheme == "s3":
        from obstore.store import S3Store

        # A payload download streams for as long as it takes (the client's
        # default timeout is 30 s per request). Passing client options replaces
        # the ones obstore reads from the environment, so AWS_ALLOW_HTTP is
        # carried over by hand.
        options: ClientConfig = {"timeout": "3600s"}
        if os.environ.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true"):
            options["allow_http"] = True
        store = S3Store.from_url(url, client_options=options)
        return ObstoreObjectStore(store, url, conditional_put=True, conditional_delete=True,
                                  clock=clock)  # fmt: skip
    raise ValueError(f"unsupported object store URL {url!r} (expected one of: file:///dir, s3://)")


__all__ = [
    "CREATE",
    "OVERWRITE",
    "PART_SIZE",
    "UPLOAD_CONCURRENCY",
    "Capabilities",
    "ConditionalWriteUnsupported",
    "Create",
    "GetResult",
    "IfMatch",
    "InvalidKey",
    "LocalObjectStore",
    "ObjectExists",
    "ObjectMeta",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStream",
    "ObjectVersion",
    "ObstoreObjectStore",
    "Overwrite",
    "PreconditionFailed",
    "PutMode",
    "open_store",
]
