"""Fold artifacts: a verified, self-describing copy of a fold store at an exact cursor.

An artifact is a directory::

    MANIFEST.json   schema version, backend, format generation, cursor, and
                    every file's path, size and BLAKE3 digest
    data/...        the backend's own files

Export stages it in a hidden directory beside the destination, verifies the
copy by reopening it (its recovered cursor must equal the live one: every
``apply`` commits data and cursor together, so that is a complete tail-loss
detector), writes the manifest last and renames the stage into place: an
artifact that exists is complete. Import trusts nothing it is handed: it
checks backend and format generation before opening anything, re-hashes every
file, opens the staged copy and requires the manifest's cursor, and only then
renames it into place; any failure is :class:`ArtifactInvalid` and leaves
nothing at the destination. The manifest is serialised deterministically and
its BLAKE3 prefix is the artifact's content address. The rules:
docs/semantics/kv.md §9 (§9.1 the manifest, §9.2 export, §9.3 import); usage: docs/kv.md.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import blake3
import msgspec

from waymark.kv.errors import ArtifactInvalid, NothingPublished, SnapshotError
from waymark.kv.types import WatchCursor

if TYPE_CHECKING:
    from waymark.kv.stores.protocol import SnapshotStore

SCHEMA_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
DATA_DIR = "data"
ADDRESS_BYTES = 8
"""Bytes of the manifest's BLAKE3 digest that make up the content address."""

MAX_MANIFEST_BYTES = 64 * 1024 * 1024

_SAFE_PATH = re.compile(r"^data(/[^/\0]+)+$")
MAX_NAME_BYTES = 255
"""A path component longer than this no common file system can create."""
MAX_PATH_BYTES = 1024


class ArtifactFile(msgspec.Struct, frozen=True):
    path: str
    size: int
    blake3: str


class ExportManifest(msgspec.Struct, frozen=True):
    """What an artifact holds. ``cursor_hex`` is the exact watch cursor of the copy."""

    schema_version: int
    backend: str
    format_generation: int
    cursor_hex: str
    files: tuple[ArtifactFile, ...]
    exporter: str = ""
    exported_at_ms: int = 0
    bucket: str | None = None
    scope: tuple[str, ...] = ()
    generation: int = 0
    """The bucket instance folded: its stream's creation time in microseconds (0:
    unknown). A bucket deleted and recreated is a new generation."""

    @property
    def cursor(self) -> WatchCursor:
        return WatchCursor(bytes.fromhex(self.cursor_hex))

    @property
    def rank(self) -> int:
        """The cursor as a number."""
        return self.cursor.as_u64()

    @property
    def order(self) -> int:
        """What the pointer guard and the prune guard compare: the generation, then the
        cursor (docs/semantics/kv.md §11.2), so a recreated bucket's artifacts outrank
        the dead one's whatever their cursors."""
        return (self.generation << 64) | self.rank

    def encode(self) -> bytes:
        """Deterministic bytes: sorted keys, no whitespace, files in path order."""
        return msgspec.json.encode(self, order="sorted")

    @classmethod
    def decode(cls, raw: bytes) -> ExportManifest:
        """Parse and validate untrusted manifest bytes; ArtifactInvalid if they are not one."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ArtifactInvalid(f"manifest of {len(raw)} bytes is larger than any we write")
        try:
            m = msgspec.json.decode(raw, type=cls)
        except msgspec.ValidationError as e:
            raise ArtifactInvalid(f"manifest does not parse: {e}") from e
        except msgspec.DecodeError as e:
            raise ArtifactInvalid(f"manifest is not JSON: {e}") from e
        if m.schema_version != SCHEMA_VERSION:
            raise ArtifactInvalid(
                f"manifest schema version {m.schema_version}, this node reads {SCHEMA_VERSION}"
            )
        try:
            cursor = bytes.fromhex(m.cursor_hex)
        except ValueError:
            raise ArtifactInvalid(f"manifest cursor {m.cursor_hex!r} is not hex") from None
        if len(cursor) > 255:
            raise ArtifactInvalid("manifest cursor longer than 255 bytes")
        paths = [f.path for f in m.files]
        if paths != sorted(set(paths)):
            raise ArtifactInvalid("manifest files are not unique and in path order")
        for f in m.files:
            _check_path(f.path)
            if f.size < 0 or not re.fullmatch(r"[0-9a-f]{64}", f.blake3):
                raise ArtifactInvalid(f"manifest entry for {f.path!r} has a bad size or digest")
        # A path that is also another's directory ("data/a" and "data/a/b") could
        # never be written: refuse it here, not with an OSError halfway through.
        dirs = {p.rsplit("/", i)[0] for p in paths for i in range(1, p.count("/"))}
        if clash := sorted(dirs.intersection(paths)):
            raise ArtifactInvalid(f"manifest lists {clash[0]!r} as a file and as a directory")
        return m


def _check_path(path: str) -> None:
    """A manifest path this node can write: under data/, no '.' or '..', no empty or
    overlong component, UTF-8 encodable (docs/semantics/kv.md §9.1)."""
    parts = path.split("/")
    if not _SAFE_PATH.match(path) or any(p in (".", "..") for p in parts):
        raise ArtifactInvalid(f"manifest names an unsafe path {path!r}")
    try:
        encoded = [p.encode() for p in parts]
    except UnicodeEncodeError:
        raise ArtifactInvalid(f"manifest path {path!r} is not valid UTF-8") from None
    if sum(map(len, encoded)) + len(parts) > MAX_PATH_BYTES or any(
        len(p) > MAX_NAME_BYTES for p in encoded
    ):
        raise ArtifactInvalid(f"manifest path {path[:80]!r}... is longer than any we write")


def content_address(manifest_bytes: bytes) -> str:
    """The artifact's content address: the hex BLAKE3 prefix of its manifest bytes."""
    return blake3.blake3(manifest_bytes).digest(length=32)[:ADDRESS_BYTES].hex()


@dataclass(frozen=True)
class ExportInfo:
    """Where an export came from: recorded in the manifest, checked on bootstrap."""

    exporter: str = ""
    exported_at_ms: int = 0
    bucket: str | None = None
    scope: tuple[str, ...] = ()
    generation: int = 0


class ArtifactBackend(Protocol):
    """The backend side of export/import, implemented by each fold store class."""

    backend: str
    format_generation: int

    @property
    def cursor(self) -> WatchCursor: ...

    def write_copy(self, data_dir: Path) -> None:
        """Write a consistent copy of the store's files into ``data_dir`` (not yet existing)."""
        ...

    @classmethod
    def recover_cursor(cls, data_dir: Path) -> WatchCursor:
        """Open a copy read-only through the engine and return the cursor it recovers."""
        ...

    @classmethod
    def path_in(cls, data_dir: Path) -> Path:
        """Where the store's own path is inside ``data_dir`` (a file or the directory)."""
        ...


Progress = Callable[[str, int, int], None]
"""``progress(phase, done, total)`` of a bootstrap or restore (docs/kv.md, "Restore
progress"): ``download`` in payload bytes, ``verify`` in bytes hashed, ``open`` (the
engine's reopen: 0 of 1), ``done`` (the artifact's file bytes, all of them). Called
from the thread doing the work."""

_HASH_STEP = 16 << 20  # bytes hashed between two progress calls


def file_digest(path: Path, hashed: Callable[[int], None] | None = None) -> str:
    """The file's BLAKE3 digest; ``hashed(n)`` after each step of ``n`` bytes, if given."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    size = path.stat().st_size
    if not size:
        return h.hexdigest()
    if hashed is None:
        h.update_mmap(path)
        return h.hexdigest()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        try:
            for at in range(0, size, _HASH_STEP):
                h.update(view[at : at + _HASH_STEP])
                hashed(min(_HASH_STEP, size - at))
        finally:
            view.release()
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Every file, then every directory under ``root`` (deepest first), and ``root``."""
    dirs = {root}
    for p in _tree(root):
        _fsync(p)
        dirs.add(p.parent)
    for d in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
        _fsync(d)


def _fsync_files(root: Path) -> None:
    """fsync the regular files under ``root`` as they are now; anything else is left to
    :func:`_tree`'s checks, and a file an engine's open removes meanwhile is skipped."""
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                # Non-blocking: a FIFO's open would wait for a writer.
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                fd = os.open(os.path.join(dirpath, name), flags)
            except OSError:
                continue  # a symlink or gone: not ours to sync
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.fsync(fd)
            finally:
                os.close(fd)


def _tree(data_dir: Path) -> list[Path]:
    """Every entry under ``data_dir``; raises ArtifactInvalid for anything but files and dirs."""
    out = []
    for dirpath, dirnames, filenames in os.walk(data_dir):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink() or not (p.is_file() or p.is_dir()):
                raise ArtifactInvalid(f"{p.relative_to(data_dir.parent)} is not a plain file")
            if p.is_file():
                out.append(p)
    return sorted(out)


@dataclass
class StagedExport:
    """A copy of a store in a hidden staging directory, not yet verified or described.

    ``stage_export`` makes it while the store is quiescent (between two
    applies); everything after that reads only the copy, so it may run while
    the fold goes on: :meth:`verify` (reopen the copy, compare cursors),
    :meth:`describe` (BLAKE3 of every file, the manifest) and :meth:`seal`
    (manifest last, rename into an artifact directory). An export round
    uploads a described copy while it is being verified and publishes only once
    it is (docs/semantics/kv.md §9.2, §10.3). :meth:`discard` removes the stage.
    """

    stage: Path
    backend_class: type[ArtifactBackend]
    backend: str
    format_generation: int
    cursor: WatchCursor
    """The live store's cursor when the copy was made: the copy must recover it."""
    info: ExportInfo

    @property
    def data(self) -> Path:
        return self.stage / DATA_DIR

    def verify(self) -> None:
        """Reopen the copy through the engine; SnapshotError unless it recovers ``cursor``.

        Every ``apply`` commits data and cursor together, so equal cursors mean
        no committed batch is missing (docs/semantics/kv.md §9.2 step 1).
        """
        recovered = self.backend_class.recover_cursor(self.data)
        if recovered != self.cursor:
            raise SnapshotError(
                f"export of {self.backend} fold failed verification: the copy recovers "
                f"cursor {recovered}, the live fold is at {self.cursor}"
            )

    def describe(self) -> tuple[bytes, ExportManifest]:
        """Hash every file of the copy; the manifest and its deterministic bytes."""
        # Sorted as strings, the order ExportManifest.decode requires (Path order differs).
        rels = sorted((p.relative_to(self.stage).as_posix(), p) for p in _tree(self.data))
        files = [ArtifactFile(rel, p.stat().st_size, file_digest(p)) for rel, p in rels]
        manifest = ExportManifest(
            schema_version=SCHEMA_VERSION,
            backend=self.backend,
            format_generation=self.format_generation,
            cursor_hex=self.cursor.raw.hex(),
            files=tuple(files),
            exporter=self.info.exporter,
            exported_at_ms=self.info.exported_at_ms,
            bucket=self.info.bucket,
            scope=tuple(self.info.scope),
            generation=self.info.generation,
        )
        return manifest.encode(), manifest

    def seal(self, dest: Path, manifest_bytes: bytes) -> None:
        """Make the verified, described and fsynced copy the artifact ``dest``: the
        manifest written last, then the stage renamed (docs/semantics/kv.md §9.2 step 3)."""
        with open(self.stage / MANIFEST_NAME, "wb") as f:
            f.write(manifest_bytes)
            f.flush()
            os.fsync(f.fileno())
        _fsync(self.stage)
        os.rename(self.stage, dest)
        _fsync(dest.parent)

    def discard(self) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)


def stage_export(
    store: ArtifactBackend, dest: str | os.PathLike[str], info: ExportInfo | None = None
) -> StagedExport:
    """Copy ``store`` into a hidden staging directory beside ``dest`` (which must not exist).

    The only step of an export that reads the live store: it must not run
    concurrently with ``apply`` (inside ``watch_applied``, an ``ExportRequest``).
    """
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"artifact destination {dest} exists")
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.stage-", dir=dest.parent))
    staged = StagedExport(
        stage,
        type(store),
        store.backend,
        store.format_generation,
        store.cursor,
        info or ExportInfo(),
    )
    try:
        store.write_copy(staged.data)
    except BaseException:
        staged.discard()
        raise
    return staged


def export_store(
    store: ArtifactBackend, dest: str | os.PathLike[str], info: ExportInfo | None = None
) -> ExportManifest:
    """Export ``store`` as an artifact directory at ``dest`` (which must not exist).

    Must not run concurrently with ``apply``: inside ``watch_applied`` go
    through an ``ExportRequest``. Raises SnapshotError if the copy does not
    recover the live cursor; nothing is left at ``dest`` then.
    The steps and their order: docs/semantics/kv.md §9.2. The verifying reopen
    runs on a second thread while the files are fsynced and hashed; the
    manifest is written only after both.
    """
    dest = Path(dest)
    staged = stage_export(store, dest, info)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="waymark-export-verify") as pool:
            verified = pool.submit(staged.verify)
            try:
                _fsync_tree(staged.data)
                raw, manifest = staged.describe()
            finally:
                wait([verified])
        verified.result()
        staged.seal(dest, raw)
    except BaseException:
        staged.discard()
        raise
    return manifest


def read_manifest(artifact_dir: str | os.PathLike[str]) -> tuple[bytes, ExportManifest]:
    """The manifest bytes of an artifact directory and what they say (ArtifactInvalid if bad)."""
    path = Path(artifact_dir) / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ArtifactInvalid(f"no {MANIFEST_NAME} in {artifact_dir}") from None
    return raw, ExportManifest.decode(raw)


def backend_class(backend: str) -> type[ArtifactBackend]:
    from waymark.kv.stores import store_class

    return store_class(backend)  # type: ignore[return-value]


def check_source(
    manifest: ExportManifest,
    backend: str,
    bucket: str | None = None,
    scope: tuple[str, ...] | None = None,
    generation: int | None = None,
) -> type[ArtifactBackend]:
    """Everything decidable from the manifest alone, before any file is fetched or opened
    (docs/semantics/kv.md §9.3 step 1).

    Raises ArtifactInvalid; returns the backend's store class.
    """
    if manifest.backend != backend:
        raise ArtifactInvalid(
            f"artifact is a {manifest.backend} fold, this node's store is {backend}"
        )
    cls = backend_class(backend)
    if manifest.format_generation != cls.format_generation:
        raise ArtifactInvalid(
            f"artifact has {backend} format generation {manifest.format_generation}, "
            f"this node reads generation {cls.format_generation}"
        )
    if bucket is not None and manifest.bucket not in (None, bucket):
        raise ArtifactInvalid(f"artifact folds bucket {manifest.bucket!r}, not {bucket!r}")
    if generation and manifest.generation and manifest.generation != generation:
        # The artifact is sound, just of a bucket that no longer exists: for this one
        # nothing is published yet.
        raise NothingPublished(
            f"the published artifact folds generation {manifest.generation} of the bucket, "
            f"which was deleted and recreated since (now generation {generation})"
        )
    if scope is not None and tuple(manifest.scope) != tuple(scope):
        raise ArtifactInvalid(
            f"artifact folds scope {list(manifest.scope) or 'all'}, "
            f"this node watches {list(scope) or 'all'}"
        )
    return cls


def verify_files(manifest: ExportManifest, root: Path, progress: Progress | None = None) -> None:
    """Every file the manifest lists, and nothing else, with its size and BLAKE3 digest
    (docs/semantics/kv.md §9.3 step 2)."""
    total = sum(f.size for f in manifest.files)
    done = 0

    def hashed(n: int) -> None:
        nonlocal done
        done += n
        assert progress is not None
        progress("verify", done, total)

    data = root / DATA_DIR
    present = {p.relative_to(root).as_posix(): p for p in _tree(data)} if data.is_dir() else {}
    listed = {f.path: f for f in manifest.files}
    if extra := sorted(present.keys() - listed.keys()):
        raise ArtifactInvalid(f"files not in the manifest: {', '.join(extra)}")
    if missing := sorted(listed.keys() - present.keys()):
        raise ArtifactInvalid(f"files missing: {', '.join(missing)}")
    for path, f in listed.items():
        p = present[path]
        if p.stat().st_size != f.size:
            raise ArtifactInvalid(f"{path} is {p.stat().st_size} bytes, the manifest says {f.size}")
        if file_digest(p, hashed if progress is not None else None) != f.blake3:
            raise ArtifactInvalid(f"{path} does not match its BLAKE3 digest")


def _store_spec(spec: str) -> tuple[str, Path]:
    backend, sep, path = spec.partition(":")
    if not sep or not path:
        raise ValueError(f"store spec {spec!r} must look like BACKEND:PATH")
    return backend, Path(path)


def destination_is_empty(path: Path) -> bool:
    """Whether an import may create the store at ``path``: nothing there, or an empty directory."""
    if not path.exists() and not path.is_symlink():
        return True
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


def import_artifact(
    artifact_dir: str | os.PathLike[str],
    store_spec: str,
    *,
    consume: bool = False,
    bucket: str | None = None,
    scope: tuple[str, ...] | None = None,
    progress: Progress | None = None,
) -> ExportManifest:
    """Import an artifact as the fold store ``BACKEND:PATH`` (PATH must be empty).

    With ``consume`` the artifact's files are moved rather than copied (a
    downloaded artifact on the same file system). ``bucket`` and ``scope``,
    when given, must match what the manifest records. Raises ArtifactInvalid
    (nothing written at PATH) or FileExistsError (PATH not empty).
    """
    manifest, _ = _import(artifact_dir, store_spec, consume, bucket, scope, keep_open=False,
                          progress=progress)  # fmt: skip
    return manifest


def import_and_open(
    artifact_dir: str | os.PathLike[str],
    store_spec: str,
    *,
    consume: bool = False,
    bucket: str | None = None,
    scope: tuple[str, ...] | None = None,
    progress: Progress | None = None,
) -> tuple[ExportManifest, SnapshotStore]:
    """:func:`import_artifact`, returning the imported store open at PATH.

    The store the verification opened is handed over when its backend can be
    moved while open (the append log, whose open replays the whole log), so a
    bootstrap opens it once; the others are reopened at PATH.
    """
    manifest, store = _import(artifact_dir, store_spec, consume, bucket, scope, keep_open=True,
                              progress=progress)  # fmt: skip
    assert store is not None
    return manifest, store


def _import(
    artifact_dir: str | os.PathLike[str],
    store_spec: str,
    consume: bool,
    bucket: str | None,
    scope: tuple[str, ...] | None,
    *,
    keep_open: bool,
    progress: Progress | None = None,
) -> tuple[ExportManifest, SnapshotStore | None]:
    backend, dest = _store_spec(store_spec)
    src = Path(artifact_dir)
    _, manifest = read_manifest(src)
    cls = check_source(manifest, backend, bucket, scope)
    if not destination_is_empty(dest):
        raise FileExistsError(f"{dest} is not empty: an artifact is imported into a new store")
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.import-", dir=dest.parent))
    store: SnapshotStore | None = None
    pool = ThreadPoolExecutor(1, thread_name_prefix="waymark-import-sync")
    try:
        if (src / DATA_DIR).is_dir():
            if consume:
                try:
                    os.rename(src / DATA_DIR, stage / DATA_DIR)
                except OSError:  # another file system: copy instead
                    shutil.copytree(src / DATA_DIR, stage / DATA_DIR, symlinks=True)
            else:
                shutil.copytree(src / DATA_DIR, stage / DATA_DIR, symlinks=True)
        # The staged files are written to disk while they are hashed and opened (the
        # fsync waits on the disk, the checks on the CPU); the rename waits for both.
        syncing = pool.submit(_fsync_files, stage / DATA_DIR)
        # Hash the staged copy itself: the source is untrusted and could change meanwhile.
        verify_files(manifest, stage, progress)
        staged = cls.path_in(stage / DATA_DIR)
        if progress is not None:
            progress("open", 0, 1)
        try:
            store = open_backend(backend, staged)
        except Exception as e:
            raise ArtifactInvalid(f"the {backend} copy does not open: {e}") from e
        if store.cursor != manifest.cursor:  # docs/semantics/kv.md §9.3 step 3
            raise ArtifactInvalid(
                f"the copy recovers cursor {store.cursor}, the manifest says {manifest.cursor}"
            )
        syncing.result()
        _fsync_tree(stage / DATA_DIR)  # durable before it is renamed into place (step 4)
        relocated = getattr(store, "relocated", None)
        if keep_open and relocated is not None:
            _place(staged, dest)
            relocated(dest)
        else:
            store.close()
            store = None
            _place(staged, dest)
            if keep_open:
                store = open_backend(backend, dest)
    except BaseException:
        pool.shutdown(wait=True)  # the sync may still have the stage's files open
        if store is not None:
            store.close()
        shutil.rmtree(stage, ignore_errors=True)
        raise
    pool.shutdown(wait=False)
    shutil.rmtree(stage, ignore_errors=True)
    if progress is not None:
        size = sum(f.size for f in manifest.files)
        progress("done", size, size)
    return manifest, store


def open_backend(backend: str, path: Path) -> SnapshotStore:
    from waymark.kv.stores import open_store

    return open_store(f"{backend}:{path}")


def _place(staged: Path, dest: Path) -> None:
    """Move the verified store into place atomically, never over something that appeared."""
    if staged.is_dir():
        os.rename(staged, dest)  # replaces an empty directory, fails on a non-empty one
    else:
        os.link(staged, dest)  # fails if dest exists; unlike rename it never replaces
        staged.unlink()
    _fsync(dest.parent)
