"""Importing a fold artifact: trust nothing handed over (docs/semantics/kv.md §9.3).

Checks backend and format generation before opening anything, re-hashes every file,
opens the staged copy and requires the manifest's cursor, and only then renames it into
place; any failure is :class:`ArtifactInvalid` and leaves nothing at the destination.

Its own module, beside :mod:`waymark.kv.artifact` (the manifest and the export): import
opens a store by its backend name (:mod:`waymark.kv.stores`), and every store exports
through :mod:`waymark.kv.artifact`, so the two halves in one module were an import cycle.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from waymark.kv.artifact import (
    DATA_DIR,
    ArtifactBackend,
    ExportManifest,
    Progress,
    _fsync,
    _fsync_files,
    _fsync_tree,
    _tree,
    file_digest,
    read_manifest,
)
from waymark.kv.errors import ArtifactInvalid, NothingPublished
from waymark.kv.stores import open_store, store_class
from waymark.kv.stores.protocol import SnapshotStore


def backend_class(backend: str) -> type[ArtifactBackend]:
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
    return open_store(f"{backend}:{path}")


def _place(staged: Path, dest: Path) -> None:
    """Move the verified store into place atomically, never over something that appeared."""
    if staged.is_dir():
        os.rename(staged, dest)  # replaces an empty directory, fails on a non-empty one
    else:
        os.link(staged, dest)  # fails if dest exists; unlike rename it never replaces
        staged.unlink()
    _fsync(dest.parent)
