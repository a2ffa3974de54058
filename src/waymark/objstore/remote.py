"""Object stores reached through obstore (``s3://`` and the stores obstore speaks).

Create-only and If-Match puts are obstore's ``PutMode``s (S3 sends
``If-None-Match: *`` / ``If-Match``). obstore has no conditional delete, so an
If-Match delete on S3 is a presigned DELETE sent with an ``If-Match`` header
(S3 honours it since 2024). A store that cannot do an operation atomically
says so in ``capabilities`` and raises :class:`ConditionalWriteUnsupported`
when asked, never falling back to read-then-write.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import httpx
import obstore
from obstore import exceptions as obx

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
    ObjectExists,
    ObjectMeta,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStream,
    ObjectVersion,
    PreconditionFailed,
    PutMode,
)

_SIGNED_URL_TTL = datetime.timedelta(minutes=5)


def _meta(m: Any) -> ObjectMeta:
    return ObjectMeta(
        m["path"],
        m["size"],
        int(m["last_modified"].timestamp() * 1000),
        m.get("e_tag"),
        m.get("version"),
    )


def _version(r: Any) -> ObjectVersion:
    return ObjectVersion(r.get("e_tag"), r.get("version"))


@contextlib.contextmanager
def _mapped(key: str, *, missing_is_precondition: bool = False) -> Iterator[None]:
    """obstore's exceptions as this package's, so callers branch on one set."""
    try:
        yield
    except obx.AlreadyExistsError as e:
        raise ObjectExists(key) from e
    except obx.PreconditionError as e:
        raise PreconditionFailed(f"{key}: {e}") from e
    except (obx.NotFoundError, FileNotFoundError) as e:  # obstore raises the builtin
        if missing_is_precondition:
            raise PreconditionFailed(f"{key} does not exist") from e
        raise ObjectNotFound(key) from e
    except (obx.NotSupportedError, NotImplementedError) as e:
        raise ConditionalWriteUnsupported(f"{key}: {e}") from e
    except (obx.BaseError, OSError) as e:
        raise ObjectStoreError(f"{key}: {e}") from e


class ObstoreObjectStore:
    def __init__(
        self,
        store: Any,
        url: str,
        *,
        conditional_put: bool,
        conditional_delete: bool,
        clock: Clock | None = None,
    ) -> None:
        """``clock``: what the age of an abandoned upload is measured against (the
        store stamps its own times)."""
        self._store = store
        self.url = url
        self._clock = clock or SystemClock()
        self.capabilities = Capabilities(conditional_put, conditional_delete)

    def put(self, key: str, data: bytes, *, mode: PutMode = OVERWRITE) -> ObjectVersion:
        obs_mode: Any
        if isinstance(mode, Create):
            obs_mode = "create"
        elif isinstance(mode, IfMatch):
            if not self.capabilities.conditional_put:
                raise ConditionalWriteUnsupported(f"{self.url} has no If-Match put")
            v = mode.version
            obs_mode = {k: x for k, x in (("e_tag", v.etag), ("version", v.version)) if x}
        else:
            obs_mode = "overwrite"
        with _mapped(key, missing_is_precondition=isinstance(mode, IfMatch)):
            return _version(obstore.put(self._store, key, data, mode=obs_mode, use_multipart=False))

    def upload(
        self,
        key: str,
        chunks: Iterable[bytes],
        *,
        part_size: int = PART_SIZE,
        concurrency: int = UPLOAD_CONCURRENCY,
    ) -> ObjectVersion:
        """Multipart upload of ``chunks`` (overwrite: multipart puts cannot be conditional)."""
        with _mapped(key):
            return _version(
                obstore.put(
                    self._store,
                    key,
                    iter(chunks),
                    use_multipart=True,
                    chunk_size=part_size,
                    max_concurrency=concurrency,
                )
            )

    def get(self, key: str) -> GetResult:
        with _mapped(key):
            r = obstore.get(self._store, key)
            return GetResult(bytes(r.bytes()), _meta(r.meta))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with _mapped(key):
            return bytes(obstore.get_range(self._store, key, start=start, end=end))

    def head(self, key: str) -> ObjectMeta:
        with _mapped(key):
            return _meta(obstore.head(self._store, key))

    def stream(self, key: str, *, chunk_size: int = PART_SIZE) -> ObjectStream:
        with _mapped(key):
            r = obstore.get(self._store, key)
        chunks = r.stream(min_chunk_size=chunk_size)

        def mapped() -> Iterator[bytes]:
            with _mapped(key):
                yield from chunks

        return ObjectStream(_meta(r.meta), mapped())

    def delete(self, key: str, *, if_match: ObjectVersion | None = None) -> None:
        if if_match is None:
            with _mapped(key):
                obstore.delete(self._store, key)
            return
        if not self.capabilities.conditional_delete:
            raise ConditionalWriteUnsupported(f"{self.url} has no If-Match delete")
        with _mapped(key):
            url = obstore.sign(self._store, "DELETE", key, _SIGNED_URL_TTL)
        try:
            response = httpx.delete(url, headers={"If-Match": if_match.etag or ""}, timeout=30)
        except httpx.HTTPError as e:
            raise ObjectStoreError(f"delete {key}: {e}") from e
        if response.status_code in (412, 404):
            raise PreconditionFailed(f"{key} is not at version {if_match.etag}")
        if response.status_code == 501:
            raise ConditionalWriteUnsupported(f"{self.url} refused an If-Match delete")
        if response.status_code >= 300:
            raise ObjectStoreError(f"delete {key}: HTTP {response.status_code}")

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Objects whose key starts with ``prefix``, in key order.

        obstore lists by whole path segments, so it is asked for the prefix's
        directory and the rest of the prefix is matched here.
        """
        directory = prefix.rpartition("/")[0]
        with _mapped(prefix):
            for batch in obstore.list(self._store, directory or None):
                for m in batch:
                    if m["path"].startswith(prefix):
                        yield _meta(m)

    def clean_abandoned_temp(self, min_age_s: float | None = None) -> Sequence[tuple[str, int]]:
        """Abort the incomplete multipart uploads under this store's prefix that were
        started more than ``min_age_s`` ago (default :data:`ABANDONED_UPLOAD_S`): (key,
        bytes of their parts) of each. S3 does not say whether a live process still
        sends parts, so age is the only sign of an upload killed midway: the default is
        far above the longest upload (docs/kv.md, "Crash leftovers"). obstore has no
        call for this, so it goes through boto3, with the same ``AWS_*`` settings."""
        if not self.url.startswith("s3://"):
            return []
        age_s = ABANDONED_UPLOAD_S if min_age_s is None else min_age_s
        bucket, _, prefix = self.url.removeprefix("s3://").partition("/")
        prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

        client = _s3_client()
        now = datetime.datetime.fromtimestamp(self._clock.now_ms() / 1000, datetime.UTC)
        cutoff = now - datetime.timedelta(seconds=age_s)
        aborted: list[tuple[str, int]] = []
        try:
            uploads = client.get_paginator("list_multipart_uploads").paginate(
                Bucket=bucket, Prefix=prefix
            )
            for listed in uploads:
                for upload in listed.get("Uploads", []):
                    if upload["Initiated"] > cutoff:
                        continue  # maybe a live writer's
                    key, upload_id = upload["Key"], upload["UploadId"]
                    parts = client.get_paginator("list_parts").paginate(
                        Bucket=bucket, Key=key, UploadId=upload_id
                    )
                    size = sum(p["Size"] for page in parts for p in page.get("Parts", []))
                    client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
                    aborted.append((key, size))
        except (BotoCoreError, ClientError) as e:  # as this package's, like obstore's
            raise ObjectStoreError(f"abort abandoned uploads in {self.url}: {e}") from e
        return aborted


# An incomplete multipart upload started this long ago is one a killed writer left: an
# artifact upload takes minutes at most, a payload stream at most an hour per request.
ABANDONED_UPLOAD_S = 6 * 3600.0


def _s3_client() -> Any:
    """A boto3 S3 client configured from the environment obstore reads (its
    ``AWS_ENDPOINT`` alias and ``AWS_REGION`` too, which boto3 alone does not)."""
    import boto3  # type: ignore[import-untyped]  # (for this housekeeping only)

    return boto3.client(
        "s3",
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT"),
        region_name=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
    )
