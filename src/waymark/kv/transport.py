"""Fold artifacts on an object store: write-once payloads and a monotonic CAS pointer.

Layout under the store's URL, for an artifact key ``K``::

    K.payloads/<content address>.tar   the artifact as a tar, MANIFEST.json first;
                                       written once (content-addressed)
    K.manifest.json                    the pointer: the published manifest's bytes,
                                       written last, only by compare-and-swap

Publishing uploads the payload, then swaps the pointer: read it, ask
``pointer_publish_allowed`` (absent, corrupt, or the candidate's cursor at or
above the current one), and put it create-only or If-Match on the ETag read,
re-reading after a lost race. The pointer therefore never moves to an older
cursor, and a slow exporter gets ``SupersededByNewer`` instead of an error.
Readers derive the payload key from the pointer bytes themselves, so a pointer
and its payload always belong together. Pruning deletes only what
``payload_prunable`` allows: not the target, aged past the grace, and a rank
strictly below the pointer's, which can never become the pointer again. The
rules: docs/semantics/kv.md §11 (§11.2 publish, §11.3 fetch, §11.4 prune); usage:
docs/kv.md.
"""

from __future__ import annotations

import contextlib
import enum
import io
import logging
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from waymark.clock import Clock, SystemClock
from waymark.kv.artifact import (
    ADDRESS_BYTES,
    DATA_DIR,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    ExportManifest,
    Progress,
    content_address,
    read_manifest,
)
from waymark.kv.artifact_import import check_source, import_and_open, import_artifact
from waymark.kv.errors import ArtifactInvalid, ArtifactUnavailable, NothingPublished
from waymark.kv.guards import (
    POINTER_ABSENT,
    PointerState,
    kept_payloads,
    payload_prunable,
    pointer_publish_allowed,
)
from waymark.kv.leftovers import download_prefix
from waymark.objstore import (
    CREATE,
    OVERWRITE,
    PART_SIZE,
    ConditionalWriteUnsupported,
    IfMatch,
    ObjectExists,
    ObjectMeta,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectVersion,
    PreconditionFailed,
    PutMode,
)

if TYPE_CHECKING:
    from waymark.kv.stores.protocol import SnapshotStore

log = logging.getLogger("waymark.kv")

MAX_SWAP_RETRIES = 8
"""Re-reads of the pointer after a lost compare-and-swap before the swap gives up."""

POINTER_SUFFIX = ".manifest.json"
PAYLOADS_SUFFIX = ".payloads/"
RETIRED_SUFFIX = ".retired/"
"""``K.retired/<payload name>``: empty; its modification time bounds from above the last
moment a pointer read could name that payload (docs/semantics/kv.md §11.4)."""
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ARTIFACT_ID = re.compile(rf"^[0-9a-f]{{{2 * ADDRESS_BYTES}}}$")
_BLOCK = tarfile.BLOCKSIZE


class PublishOutcome(enum.Enum):
    """The result of a pointer swap; neither is an error."""

    Published = "published"
    """The pointer now names this artifact."""
    SupersededByNewer = "superseded-by-newer"
    """Refused: the pointer names a newer artifact (or the race was lost 1 + 8 times)."""


@dataclass(frozen=True)
class PointerObservation:
    """The pointer as read before a swap: its state for the guard, and its version for CAS."""

    state: PointerState
    version: ObjectVersion | None = None
    body: bytes | None = None
    manifest: ExportManifest | None = None
    invalid: str | None = None  # why ``body`` is not a manifest


@dataclass(frozen=True)
class UploadedPayload:
    key: str
    manifest_bytes: bytes
    manifest: ExportManifest
    payload_key: str


@dataclass
class PruneReport:
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"artifact key {key!r} must be letters, digits, '.', '_' or '-'")
    return key


def _pad(n: int) -> bytes:
    return b"\0" * (-n % _BLOCK)


def _tar_header(name: str, size: int) -> bytes:
    """A header with nothing but name and size: the same artifact always tars to the same bytes."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    # GNU headers carry sizes beyond ustar's 8 GiB and names beyond 100 bytes.
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def tar_stream(
    artifact_dir: Path,
    manifest_bytes: bytes,
    manifest: ExportManifest,
    prefixes: Container[str] = (),
    sent: Callable[[], None] | None = None,
) -> Iterator[bytes]:
    """The artifact as a tar, MANIFEST.json first, then the files in manifest order.

    Generated on the fly: a multi-gigabyte fold is never held in memory or
    written to disk twice. A file whose size no longer matches the manifest
    fails the upload (the artifact changed under it); one of ``prefixes`` (a hard
    link to a live file that is only appended to) may have grown, and only its
    first listed bytes are sent. ``sent()`` is called once the last byte was taken
    (the store then syncs or finishes its parts).
    """
    yield (
        _tar_header(MANIFEST_NAME, len(manifest_bytes)) + manifest_bytes + _pad(len(manifest_bytes))
    )
    for f in manifest.files:
        path = artifact_dir / f.path
        with open(path, "rb") as src:
            now = os.fstat(src.fileno()).st_size
            if now < f.size or (now != f.size and f.path not in prefixes):
                raise ArtifactInvalid(f"{f.path} changed size since it was exported")
            yield _tar_header(f.path, f.size)
            left = f.size
            while left:
                chunk = src.read(min(PART_SIZE, left))
                if not chunk:
                    raise ArtifactInvalid(f"{f.path} shrank while it was uploaded")
                left -= len(chunk)
                yield chunk
        yield _pad(f.size)
    yield b"\0" * (2 * _BLOCK)
    if sent is not None:
        sent()


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> bytes:
    if member.size > limit:
        raise ArtifactInvalid(f"{member.name} is {member.size} bytes, more than {limit}")
    f = tar.extractfile(member)
    assert f is not None
    return f.read()


def extract_payload(stream: IO[bytes] | io.RawIOBase, dest: Path, pointer_bytes: bytes) -> None:
    """Stream a payload tar into ``dest``: its manifest must be the pointer, byte for byte.

    Only regular files that the manifest lists are written (at most once, at
    the listed size); anything else refuses the payload. Digests are checked by
    the import that follows.
    """
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST_NAME or not first.isreg():
                raise ArtifactInvalid(f"payload does not start with {MANIFEST_NAME}")
            embedded = _read_member(tar, first, MAX_MANIFEST_BYTES)
            if embedded != pointer_bytes:
                raise ArtifactInvalid("the payload's embedded manifest is not the pointer's")
            manifest = ExportManifest.decode(embedded)
            sizes = {f.path: f.size for f in manifest.files}
            (dest / MANIFEST_NAME).write_bytes(embedded)
            (dest / DATA_DIR).mkdir()
            while (member := tar.next()) is not None:
                if not member.isreg() or sizes.pop(member.name, None) != member.size:
                    raise ArtifactInvalid(f"payload member {member.name!r} is not in the manifest")
                target = dest / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                with open(target, "wb") as out:
                    shutil.copyfileobj(src, out, PART_SIZE)
    except (tarfile.TarError, EOFError) as e:
        raise ArtifactInvalid(f"payload is not a complete tar: {e}") from e


_PROGRESS_STEP = 1 << 20
"""Bytes fetched between two download progress calls: tarfile reads 10 KiB at a time."""


class _Counted(io.RawIOBase):
    """A payload stream that reports the bytes read so far to ``progress("download")``,
    every ``_PROGRESS_STEP`` bytes and at the end."""

    def __init__(self, raw: io.RawIOBase, total: int, progress: Progress) -> None:
        self.raw, self.total, self.progress = raw, total, progress
        self.done = self.said = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = self.raw.readinto(b) or 0
        self.done += n
        if self.done - self.said >= _PROGRESS_STEP or self.said < self.total <= self.done:
            self.said = self.done
            self.progress("download", self.done, self.total)
        return n


class ObjectStoreTransport:
    """Publishes, fetches and prunes fold artifacts on an :class:`ObjectStore`.

    A store without conditional writes fails closed (ConditionalWriteUnsupported)
    unless ``allow_non_atomic_pointer`` is set (development only: two racing
    publishers could then move the pointer backwards). ``clock`` ages payloads
    for pruning.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        allow_non_atomic_pointer: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.allow_non_atomic_pointer = allow_non_atomic_pointer
        self.clock = clock or SystemClock()

    @property
    def atomic(self) -> bool:
        return self.store.capabilities.conditional_put

    def pointer_key(self, key: str) -> str:
        return check_key(key) + POINTER_SUFFIX

    def payload_key(self, key: str, address: str) -> str:
        return f"{check_key(key)}{PAYLOADS_SUFFIX}{address}.tar"

    def _check_atomic(self) -> None:
        # Fail closed without compare-and-swap: docs/semantics/kv.md §11.5.
        if not self.atomic and not self.allow_non_atomic_pointer:
            raise ConditionalWriteUnsupported(
                f"{self.store.url} has no conditional writes: the pointer swap fails closed "
                "(allow_non_atomic_pointer is for development only)"
            )

    # -- publish ---------------------------------------------------------------

    def upload_payload(self, key: str, artifact_dir: str | os.PathLike[str]) -> UploadedPayload:
        """Upload the artifact's payload (multipart, 8 MiB parts); the pointer is untouched."""
        artifact = Path(artifact_dir)
        raw, manifest = read_manifest(artifact)
        return self.upload_files(key, artifact, raw, manifest)

    def upload_files(
        self,
        key: str,
        root: Path,
        manifest_bytes: bytes,
        manifest: ExportManifest,
        prefixes: Container[str] = (),
        sent: Callable[[], None] | None = None,
    ) -> UploadedPayload:
        """Upload the payload of the files ``manifest`` lists under ``root`` (whose
        ``MANIFEST.json`` need not exist yet: the tar carries ``manifest_bytes``);
        ``prefixes`` and ``sent``: see :func:`tar_stream`."""
        self._check_atomic()
        payload = self.payload_key(key, content_address(manifest_bytes))
        stream = tar_stream(root, manifest_bytes, manifest, prefixes, sent)
        self.store.upload(payload, stream)
        return UploadedPayload(key, manifest_bytes, manifest, payload)

    def read_pointer(self, key: str) -> PointerObservation:
        try:
            got = self.store.get(self.pointer_key(key))
        except ObjectNotFound:
            return PointerObservation(POINTER_ABSENT)
        invalid = None
        try:
            manifest: ExportManifest | None = ExportManifest.decode(got.data)
        except ArtifactInvalid as e:
            manifest, invalid = None, e.reason
        rank = manifest.order if manifest is not None else None
        return PointerObservation(
            PointerState(True, rank), got.meta.object_version, got.data, manifest, invalid
        )

    def try_swap(
        self, observed: PointerObservation, uploaded: UploadedPayload
    ) -> PublishOutcome | None:
        """One compare-and-swap against what was ``observed``; None when the race was lost.

        Steps 2 to 4 of docs/semantics/kv.md §11.2.
        """
        if not pointer_publish_allowed(observed.state, uploaded.manifest.order):
            return PublishOutcome.SupersededByNewer
        if not self._still_fetchable(uploaded):
            return PublishOutcome.SupersededByNewer
        mode: PutMode
        if not self.atomic:
            mode = OVERWRITE  # allow_non_atomic_pointer: checked, but not atomically
        elif observed.version is None:
            mode = CREATE
        else:
            mode = IfMatch(observed.version)
        try:
            self.store.put(self.pointer_key(uploaded.key), uploaded.manifest_bytes, mode=mode)
        except (ObjectExists, PreconditionFailed):
            return None
        return PublishOutcome.Published

    def _still_fetchable(self, uploaded: UploadedPayload) -> bool:
        """Whether the candidate's payload can still be named by the pointer
        (docs/semantics/kv.md §11.2 step 3): it is looked up before every swap.

        Under a pointer that never left the order, the guards would guarantee it: a
        payload is pruned only below the pointer, and such a candidate is refused. But a
        corrupt pointer orders nothing and the order starts over after it: a pointer
        published over it may rank below payloads a prune under the earlier, newer
        pointer removed, and a stalled round's candidate then passes the guard although
        its payload is gone (found by tests/kv/test_model_pointer.py). A prune under the
        current pointer deletes only below it, so the answer cannot go stale before the
        swap.
        """
        try:
            self.store.head(uploaded.payload_key)
        except ObjectNotFound:
            return False
        return True

    def swap_pointer(
        self, uploaded: UploadedPayload, observed: PointerObservation | None = None
    ) -> PublishOutcome:
        """Make the pointer name ``uploaded`` unless a newer artifact is published.

        ``observed``, a read of the pointer made earlier (while something else
        went on), serves the first attempt: if it is stale, the compare-and-swap
        fails and the pointer is read again.
        """
        self._check_atomic()
        for _ in range(1 + MAX_SWAP_RETRIES):
            if observed is None:
                observed = self.read_pointer(uploaded.key)
            outcome = self.try_swap(observed, uploaded)
            observed = None
            if outcome is not None:
                return outcome
        log.warning(
            "pointer %s: lost the swap %d times in a row to concurrent publishers; giving up",
            self.pointer_key(uploaded.key),
            1 + MAX_SWAP_RETRIES,
        )
        return PublishOutcome.SupersededByNewer

    def upload(
        self, key: str, artifact_dir: str | os.PathLike[str]
    ) -> tuple[ExportManifest, PublishOutcome]:
        """Upload the payload, then swap the pointer (published last)."""
        uploaded = self.upload_payload(key, artifact_dir)
        return uploaded.manifest, self.swap_pointer(uploaded)

    # -- fetch -----------------------------------------------------------------

    def download(
        self,
        key: str,
        into: str | os.PathLike[str],
        *,
        pointer: PointerObservation | None = None,
        prefix: str = ".download-",
        progress: Progress | None = None,
    ) -> tuple[ExportManifest, Path]:
        """Fetch the pointer's artifact into a new directory under ``into``
        (docs/semantics/kv.md §11.3).

        The payload key is derived from the pointer bytes; the payload's
        embedded manifest must equal them. Returns the manifest and the
        artifact directory (the caller imports and removes it). Raises
        ArtifactUnavailable (no pointer, payload gone, the store failing) or
        ArtifactInvalid.
        """
        observed = pointer if pointer is not None else self.read_pointer(key)
        if observed.body is None:
            raise NothingPublished(f"no artifact published at {self.pointer_key(key)}")
        if observed.manifest is None:
            raise ArtifactInvalid(
                f"the pointer {self.pointer_key(key)} is not a valid manifest: {observed.invalid}"
            )
        payload = self.payload_key(key, content_address(observed.body))
        artifact = self._extract(
            payload, observed.body, into, prefix, progress,
            lambda: self._missing_target(key, observed, payload),
        )  # fmt: skip
        return observed.manifest, artifact

    def _extract(
        self,
        payload: str,
        manifest_bytes: bytes,
        into: str | os.PathLike[str],
        prefix: str,
        progress: Progress | None,
        missing: Callable[[], Exception],
    ) -> Path:
        """Stream ``payload`` into a new directory under ``into``; its embedded manifest
        must be ``manifest_bytes``. ``missing()`` is raised when the payload is absent."""
        Path(into).mkdir(parents=True, exist_ok=True)
        artifact = Path(tempfile.mkdtemp(prefix=prefix, dir=into))
        try:
            try:
                with self.store.stream(payload) as stream:
                    source: IO[bytes] | io.RawIOBase = stream
                    if progress is not None:
                        source = _Counted(stream, stream.meta.size, progress)
                    extract_payload(source, artifact, manifest_bytes)
            except ObjectNotFound:
                raise missing() from None
            except ObjectStoreError as e:  # the store failed mid-fetch: nothing was refused
                raise ArtifactUnavailable(f"fetching {payload} failed: {e}") from e
        except BaseException:
            shutil.rmtree(artifact, ignore_errors=True)
            raise
        return artifact

    def _missing_target(
        self, key: str, observed: PointerObservation, payload: str
    ) -> ArtifactUnavailable | ArtifactInvalid:
        """Why the payload ``observed`` names is absent. The pointer moved on since it
        was read: pruned after the grace, fetch again. It did not: the prune guard never
        deletes the pointer's target, so the pointer was edited (it addresses a payload
        that never was) or the payload removed by hand (docs/semantics/kv.md §11.3)."""
        try:
            now = self.read_pointer(key).body
        except ObjectStoreError as e:
            return ArtifactUnavailable(f"{payload} is gone; re-reading the pointer failed: {e}")
        if now != observed.body:
            return ArtifactUnavailable(
                f"{payload} was pruned after a newer artifact was published; fetch again"
            )
        return ArtifactInvalid(
            f"the pointer {self.pointer_key(key)} names {payload}, which does not exist: "
            "the pointer was edited or the payload removed by hand"
        )

    def artifact_manifest(self, key: str, artifact_id: str) -> tuple[bytes, ExportManifest]:
        """The manifest of the artifact ``artifact_id`` (its content address, as
        ``fold inspect`` lists it) under ``key``, read from its payload's head and
        checked against the id. ArtifactUnavailable when there is no such payload
        (an unknown id, or one pruned), ArtifactInvalid when it does not match."""
        if not _ARTIFACT_ID.match(artifact_id):
            raise ArtifactUnavailable(
                f"{artifact_id!r} is not an artifact id: {2 * ADDRESS_BYTES} hex digits, "
                "as `waymark fold inspect` lists the payloads"
            )
        payload = self.payload_key(key, artifact_id)
        try:
            raw = self._payload_manifest_bytes(payload)
        except ObjectNotFound:
            raise ArtifactUnavailable(
                f"no artifact {artifact_id} under {key}: unknown, or pruned"
            ) from None
        except ObjectStoreError as e:
            raise ArtifactUnavailable(f"reading {payload} failed: {e}") from e
        if raw is None or content_address(raw) != artifact_id:
            raise ArtifactInvalid(f"{payload} does not hold the artifact {artifact_id}")
        return raw, ExportManifest.decode(raw)

    def restore_open(
        self,
        key: str,
        artifact_id: str,
        store_spec: str,
        *,
        generation: int | None,
        bucket: str | None = None,
        scope: tuple[str, ...] | None = None,
        progress: Progress | None = None,
    ) -> tuple[ExportManifest, SnapshotStore]:
        """Import the artifact named ``artifact_id`` (not necessarily the pointer's) as the
        new store ``BACKEND:PATH`` and return it open (docs/semantics/kv.md §11.3).

        ``generation``: the bucket instance the store will fold (the pointer's, or the
        live bucket's); an artifact of another one is refused with ArtifactUnavailable
        before anything is fetched (its cursor means nothing on this bucket), as is an
        unknown or pruned id. One from before generations (0) is taken, as a bootstrap
        takes it. A tampered payload is ArtifactInvalid. Nothing is left at
        PATH on failure.
        """
        backend, _, path = store_spec.partition(":")
        raw, manifest = self.artifact_manifest(key, artifact_id)
        if generation and manifest.generation and manifest.generation != generation:
            raise ArtifactUnavailable(
                f"artifact {artifact_id} folds generation {manifest.generation} of the "
                f"bucket, not the current generation {generation} (the bucket was deleted "
                "and recreated since): its cursor means nothing on this bucket"
            )
        check_source(manifest, backend, bucket, scope)
        dest = Path(path)
        payload = self.payload_key(key, artifact_id)

        def pruned() -> ArtifactUnavailable:
            return ArtifactUnavailable(f"{payload} was pruned while it was fetched")

        artifact = self._extract(payload, raw, dest.parent, download_prefix(dest), progress, pruned)
        try:
            return import_and_open(
                artifact, store_spec, consume=True, bucket=bucket, scope=scope, progress=progress
            )
        finally:
            shutil.rmtree(artifact, ignore_errors=True)

    def bootstrap(
        self,
        key: str,
        store_spec: str,
        *,
        bucket: str | None = None,
        scope: tuple[str, ...] | None = None,
        generation: int | None = None,
    ) -> ExportManifest:
        """Download the pointer's artifact and import it as the new store ``BACKEND:PATH``.

        The download is staged beside PATH (same file system: the import
        moves it). Raises ArtifactInvalid / ArtifactUnavailable with nothing
        left at PATH, or FileExistsError if PATH is not empty. With ``generation``
        (the bucket instance's, ``KvStore.generation``) an artifact of another
        instance of the bucket is refused before anything is fetched.
        """
        artifact = self._fetch_for(key, store_spec, bucket, scope, generation)
        try:
            return import_artifact(artifact, store_spec, consume=True, bucket=bucket, scope=scope)
        finally:
            shutil.rmtree(artifact, ignore_errors=True)

    def bootstrap_open(
        self,
        key: str,
        store_spec: str,
        *,
        bucket: str | None = None,
        scope: tuple[str, ...] | None = None,
        generation: int | None = None,
        progress: Progress | None = None,
        pointer: PointerObservation | None = None,
    ) -> tuple[ExportManifest, SnapshotStore]:
        """:meth:`bootstrap`, returning the new store open (see ``import_and_open``):
        an append log is replayed once, by the verification, instead of twice.
        ``progress(phase, done, total)`` follows the download and the verification;
        ``pointer``, a read of the pointer made just before, saves reading it again."""
        artifact = self._fetch_for(key, store_spec, bucket, scope, generation, progress, pointer)
        try:
            return import_and_open(
                artifact, store_spec, consume=True, bucket=bucket, scope=scope, progress=progress
            )
        finally:
            shutil.rmtree(artifact, ignore_errors=True)

    def _fetch_for(
        self,
        key: str,
        store_spec: str,
        bucket: str | None,
        scope: tuple[str, ...] | None,
        generation: int | None,
        progress: Progress | None = None,
        pointer: PointerObservation | None = None,
    ) -> Path:
        backend, _, path = store_spec.partition(":")
        observed = pointer if pointer is not None else self.read_pointer(key)
        if observed.manifest is not None:  # refuse a mismatch before downloading anything
            check_source(observed.manifest, backend, bucket, scope, generation)
        dest = Path(path)
        _, artifact = self.download(
            key, dest.parent, pointer=observed, prefix=download_prefix(dest), progress=progress
        )
        return artifact

    def payload_rank(self, payload_key: str) -> int | None:
        """The order (generation, then cursor: ``ExportManifest.order``) a payload's
        embedded manifest names. None if it cannot be read: such a payload is never
        pruned."""
        manifest = self.payload_manifest(payload_key)
        return None if manifest is None else manifest.order

    def payload_manifest(self, payload_key: str) -> ExportManifest | None:
        """A payload's embedded manifest, read from its first bytes (None if unreadable)."""
        try:
            raw = self._payload_manifest_bytes(payload_key)
            return None if raw is None else ExportManifest.decode(raw)
        except (ArtifactInvalid, ObjectStoreError):
            return None

    def _payload_manifest_bytes(self, payload_key: str) -> bytes | None:
        """The bytes of a payload's first tar member if it is its manifest, else None;
        ObjectStoreError (ObjectNotFound) from the store."""
        try:
            header = tarfile.TarInfo.frombuf(
                self.store.get_range(payload_key, 0, _BLOCK), "utf-8", "surrogateescape"
            )
        except tarfile.TarError:
            return None
        if header.name != MANIFEST_NAME or not header.isreg():
            return None
        if header.size > MAX_MANIFEST_BYTES:
            return None
        return self.store.get_range(payload_key, _BLOCK, _BLOCK + header.size)

    # -- prune -----------------------------------------------------------------

    def prune(self, key: str, grace_ms: int, keep: int = 1) -> PruneReport:
        """Delete the payloads ``payload_prunable`` allows (grace: 4 x lease TTL in rounds;
        docs/semantics/kv.md §11.4), sparing the ``keep`` newest restorable ones.

        The grace counts from a payload's *retirement*, not its upload: the first
        prune that finds it strictly below the pointer (so the pointer has moved off
        it for good) and no longer among the ``keep`` newest (``kept_payloads``: the
        pointer's target counts as one) stamps ``K.retired/<name>``; every pointer
        read, or restore by name, that could name the payload happened before that
        stamp, and the payload goes only once the stamp is ``grace_ms`` old. With no
        parseable pointer nothing is provably older, so nothing goes.
        """
        report = PruneReport()
        observed = self.read_pointer(key)
        payloads = list(self.store.list(check_key(key) + PAYLOADS_SUFFIX))
        if observed.manifest is None or observed.body is None:
            report.kept = [m.key for m in payloads]
            return report
        pointer_rank = observed.manifest.order
        target = self.payload_key(key, content_address(observed.body))
        ranks: dict[str, int | None] = {}
        if keep > 1:  # two range reads a payload: only when more than the target is kept
            ranks = {m.key: self.payload_rank(m.key) for m in payloads if m.key != target}
        kept = kept_payloads(ranks, pointer_rank, target, keep)
        retired_prefix = check_key(key) + RETIRED_SUFFIX
        stamps = {m.key[len(retired_prefix) :]: m for m in self.store.list(retired_prefix)}
        now = self.clock.now_ms()
        for meta in payloads:
            name = meta.key.rsplit("/", 1)[1]
            stamp = stamps.pop(name, None)
            if meta.key in kept:
                # Not retired: a corrupt pointer was replaced by it, or --keep was raised.
                # Its grace starts over once it leaves the kept set.
                if stamp is not None:
                    self._delete_quietly(stamp)
                report.kept.append(meta.key)
                continue
            if stamp is None:
                # Reading a rank costs two range reads; only an unstamped payload needs it.
                # Retired for good iff the guard would delete it once aged: strictly
                # below the pointer, which never comes back down to it.
                rank = ranks[meta.key] if meta.key in ranks else self.payload_rank(meta.key)
                if not payload_prunable(rank, pointer_rank, False, True):
                    report.kept.append(meta.key)
                    continue
                stamp = self._stamp_retired(retired_prefix + name)
            aged_out = now - stamp.last_modified_ms >= grace_ms
            rank = self.payload_rank(meta.key) if aged_out else None
            if payload_prunable(rank, pointer_rank, False, aged_out):
                try:
                    self._delete(meta)
                except PreconditionFailed:
                    report.kept.append(meta.key)  # re-uploaded since it was listed
                    continue
                self._delete_quietly(stamp)
                report.deleted.append(meta.key)
            else:
                report.kept.append(meta.key)
        for orphan in stamps.values():  # its payload is gone (a crash between the deletes)
            self._delete_quietly(orphan)
        return report

    def _stamp_retired(self, stamp_key: str) -> ObjectMeta:
        with contextlib.suppress(ObjectExists):  # a concurrent pruner stamped it first
            self.store.put(stamp_key, b"", mode=CREATE)
        return self.store.head(stamp_key)

    def _delete_quietly(self, meta: ObjectMeta) -> None:
        with contextlib.suppress(ObjectNotFound, PreconditionFailed):
            self._delete(meta)

    def _delete(self, meta: ObjectMeta) -> None:
        if self.store.capabilities.conditional_delete:
            self.store.delete(meta.key, if_match=meta.object_version)
        else:
            self.store.delete(meta.key)

    # -- inspect ---------------------------------------------------------------

    def keys(self) -> list[str]:
        """Artifact keys with a pointer under this store."""
        return [
            m.key[: -len(POINTER_SUFFIX)]
            for m in self.store.list()
            if m.key.endswith(POINTER_SUFFIX) and "/" not in m.key
        ]

    def pointed(self, key: str) -> tuple[ExportManifest, str] | None:
        """The manifest the pointer of ``key`` names and its payload's key (None: no
        valid pointer)."""
        observed = self.read_pointer(key)
        if observed.manifest is None or observed.body is None:
            return None
        return observed.manifest, self.payload_key(key, content_address(observed.body))

    def inspect(self, key: str) -> dict[str, Any]:
        """The pointer, its manifest and every payload, as plain data (for ``fold inspect``)."""
        observed = self.read_pointer(key)
        target = (
            self.payload_key(key, content_address(observed.body))
            if observed.body is not None
            else None
        )
        pointer: dict[str, Any] | None = None
        if observed.body is not None:
            pointer = {
                "key": self.pointer_key(key),
                "etag": observed.version.etag if observed.version else None,
                "valid": observed.manifest is not None,
                "payload": target,
                "manifest": _manifest_doc(observed.manifest),
            }
        payloads = [
            {
                "key": m.key,
                "id": m.key.rsplit("/", 1)[1].removesuffix(".tar"),  # for restore --artifact
                "size": m.size,
                "last_modified_ms": m.last_modified_ms,
                "rank": None if (pm := self.payload_manifest(m.key)) is None else pm.rank,
                "generation": None if pm is None else pm.generation,
                "target": m.key == target,
            }
            for m in self.store.list(check_key(key) + PAYLOADS_SUFFIX)
        ]
        return {"key": key, "url": self.store.url, "pointer": pointer, "payloads": payloads}


def _manifest_doc(m: ExportManifest | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "cursor": m.rank,
        "cursor_hex": m.cursor_hex,
        "backend": m.backend,
        "format_generation": m.format_generation,
        "schema_version": m.schema_version,
        "exporter": m.exporter,
        "exported_at_ms": m.exported_at_ms,
        "bucket": m.bucket,
        "generation": m.generation,
        "scope": list(m.scope),
        "files": [{"path": f.path, "size": f.size, "blake3": f.blake3} for f in m.files],
    }
