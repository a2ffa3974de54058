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

This module is the manifest and the export, which every fold store uses for its
``export_to``; import, which opens a store by backend name, is
:mod:`waymark.kv.artifact_import` (so neither imports the other's dependents).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import blake3
import msgspec

from waymark.kv.errors import ArtifactInvalid, SnapshotError
from waymark.kv.types import WatchCursor

if TYPE_CHECKING:
    pass

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
    reopen_holds_gil: bool
    """Whether ``recover_cursor`` holds the GIL for the whole engine open (rocksdict's
    does): a stage without a ``reopener`` then verifies while its upload waits, not
    beside the hashing, which it would stall (docs/kv.md, "Replicas")."""

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


@dataclass(frozen=True)
class VerifiedPrefix:
    """What a round's verification proved of a live file that is only appended to:
    its first ``size`` bytes, whose BLAKE3 digest is ``digest``, replay whole (every
    record intact, the last one ending at ``size``) to ``cursor``
    (docs/semantics/kv.md §10.3)."""

    size: int
    digest: bytes
    cursor: bytes
    file_id: tuple[int, int] = (0, 0)
    """The file's (device, inode): a hint only (a compaction renames a new file over the
    path, whose bytes will not match); the digest decides."""


def _file_id(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


class PrefixLedger:
    """The last :class:`VerifiedPrefix` of a store's live file, kept by the store for its
    rounds: the next verification re-hashes those bytes and, if they still have that
    digest (they are the very bytes verified), replays only what follows them."""

    def __init__(self) -> None:
        self.last: VerifiedPrefix | None = None


FileIdentity = tuple[str, int, int, int, int]
"""A file of a stage: its artifact path, device, inode, size and mtime (ns)."""


def _identity(rel: str, path: Path) -> FileIdentity:
    st = path.stat()
    return rel, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class DigestMemo:
    """BLAKE3 digests of a store's immutable files (RocksDB's SST files: written once,
    never changed, their numbers never reused) from its last round, by
    :data:`FileIdentity`. A round's stage hard-links such a file again: its
    ``describe`` takes the digest instead of hashing the file before the upload can
    start, and its verification hashes the file again, beside the upload, so every
    byte published is still hashed in the round that publishes it
    (docs/semantics/kv.md §10.3)."""

    def __init__(self, immutable: Callable[[str], bool]) -> None:
        self.immutable = immutable
        """Whether the file at this artifact path is never changed once written."""
        self.digests: dict[FileIdentity, str] = {}


class MemoBackend(ArtifactBackend, Protocol):
    """A backend whose round stages hard-link immutable files (RocksDB's SST files)."""

    digest_memo: DigestMemo

    def begin_reopen(self, data_dir: Path) -> Callable[[], WatchCursor]:
        """Start the verifying reopen of the round copy at ``data_dir`` outside this
        process (its open would hold the GIL): a call that waits for the cursor it
        recovered, raising SnapshotError where it could not be had."""
        ...

    def round_copy(self, data_dir: Path) -> None:
        """Like ``write_copy``, for a round's stage: verified, uploaded and discarded,
        never sealed, so it need not be durable."""
        ...


def split_digest(path: Path, split: int | None, size: int) -> tuple[bytes | None, bytes]:
    """One BLAKE3 pass over the first ``size`` bytes of ``path``: the digest of the first
    ``split`` bytes (None without a split) and of all of them."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    at = None
    if size:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                if split is not None:
                    h.update(view[:split])
                    at = h.copy().digest()
                h.update(view[split or 0 :])
            finally:
                view.release()
    elif split is not None:
        at = h.digest()
    return at, h.digest()


class LinkingBackend(ArtifactBackend, Protocol):
    """A backend whose round stage may be a hard link to its live file instead of a
    copy: the file is only ever appended to, so its first ``size`` bytes, the
    committed ones when the link was made, stay exactly as they were."""

    prefix_ledger: PrefixLedger

    def link_copy(self, data_dir: Path) -> dict[str, int]:
        """Like ``write_copy``, but may hard-link the live file: returns, by artifact
        path (``data/...``), how many leading bytes of each linked file are the copy
        (empty where it copied)."""
        ...

    @classmethod
    def recover_prefix_cursor(
        cls, data_dir: Path, sizes: dict[str, int], resume: VerifiedPrefix | None = None
    ) -> tuple[WatchCursor, bool]:
        """``recover_cursor`` of the copy whose linked files end at ``sizes``, and whether
        every byte up to there was read whole (records intact, the last one ending at
        the size). ``resume``: the linked file's first ``resume.size`` bytes are known
        to replay whole to ``resume.cursor`` (the caller checked their digest); the
        replay starts after them."""
        ...


Progress = Callable[[str, int, int], None]
"""``progress(phase, done, total)`` of a bootstrap or restore (docs/kv.md, "Restore
progress"): ``download`` in payload bytes, ``verify`` in bytes hashed, ``open`` (the
engine's reopen: 0 of 1), ``done`` (the artifact's file bytes, all of them). Called
from the thread doing the work."""

_HASH_STEP = 16 << 20  # bytes hashed between two progress calls


def file_digest(
    path: Path, hashed: Callable[[int], None] | None = None, size: int | None = None
) -> str:
    """The file's BLAKE3 digest (of its first ``size`` bytes, if given); ``hashed(n)``
    after each step of ``n`` bytes, if given."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    whole = size is None
    size = path.stat().st_size if size is None else size
    if not size:
        return h.hexdigest()
    if hashed is None and whole:
        h.update_mmap(path)
        return h.hexdigest()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        try:
            for at in range(0, size, _HASH_STEP):
                h.update(view[at : at + _HASH_STEP])
                if hashed is not None:
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
    prefixes: dict[str, int] = field(default_factory=dict)
    """Files of the stage (by artifact path) that are hard links to a live file the
    fold goes on appending to: only their first N bytes are the copy. Such a stage is
    verified, hashed and uploaded, never sealed."""
    ledger: PrefixLedger | None = None
    """The live store's record of what its earlier rounds verified (a stage of one linked
    file only); ``known`` is its record when the stage was made."""
    known: VerifiedPrefix | None = None
    hashed: tuple[bytes | None, bytes] | None = None
    """:meth:`describe`'s digests of the linked file when ``ledger`` is set: of its first
    ``known.size`` bytes (None without ``known``) and of all its bytes; the verification
    uses them instead of hashing the file again."""
    memo: DigestMemo | None = None
    """The live store's digests of its immutable files (a round's stage only)."""
    reused: dict[str, str] | None = None
    """Set by :meth:`describe` when ``memo`` is: the files (by artifact path) whose
    digest it took from the memo, which :meth:`verify` hashes again."""
    reopener: Callable[[Path], Callable[[], WatchCursor]] | None = None
    """The live store's ``begin_reopen`` (a RocksDB round's stage): the verifying reopen
    runs in another process, off this one's GIL (docs/semantics/kv.md §10.3)."""
    reopening: Callable[[], WatchCursor] | None = None
    """Set by :meth:`begin_reopen`: waits for the reopen under way."""

    @property
    def data(self) -> Path:
        return self.stage / DATA_DIR

    def verify(self) -> None:
        """Reopen the copy through the engine; SnapshotError unless it recovers ``cursor``.

        Every ``apply`` commits data and cursor together, so equal cursors mean
        no committed batch is missing (docs/semantics/kv.md §9.2 step 1).
        """
        if self.prefixes:
            recovered = self._verify_linked()
        elif self.reopener is not None:
            self.begin_reopen()
            assert self.reopening is not None
            reopening, self.reopening = self.reopening, None
            recovered = reopening()
        else:
            recovered = self.backend_class.recover_cursor(self.data)
        if recovered != self.cursor:
            raise SnapshotError(
                f"export of {self.backend} fold failed verification: the copy recovers "
                f"cursor {recovered}, the live fold is at {self.cursor}"
            )
        if self.memo is not None:
            self._recheck_reused(self.memo)

    def begin_reopen(self) -> None:
        """Start the reopen :meth:`verify` waits for, if the stage has a ``reopener`` and
        none is under way: as soon as the stage exists, beside describe and the upload."""
        if self.reopener is not None and self.reopening is None:
            self.reopening = self.reopener(self.data)

    def abandon_reopen(self) -> None:
        """Wait for a reopen under way that no verification will collect (the round
        failed before its verification began), its outcome ignored: the worker then
        opens nothing after the stage is removed (an open of a missing path makes
        its directories)."""
        if self.reopening is not None:
            reopening, self.reopening = self.reopening, None
            with contextlib.suppress(SnapshotError):
                reopening()

    def _recheck_reused(self, memo: DigestMemo) -> None:
        """Hash again the files whose digest ``describe`` took from the memo; one that no
        longer has it fails the verification (and leaves the memo)."""
        if self.reused is None:
            raise RuntimeError("a stage with a digest memo is described before it is verified")
        for rel, digest in self.reused.items():
            if file_digest(self.stage / rel) != digest:
                memo.digests = {k: v for k, v in memo.digests.items() if k[0] != rel}
                raise SnapshotError(
                    f"export of {self.backend} fold failed verification: {rel} no longer has"
                    " the digest an earlier round took of it"
                )

    def _verify_linked(self) -> WatchCursor:
        """The verification of a linked stage. With a ledger, only what follows the
        last verified prefix is replayed, if the copy's first bytes still have that
        prefix's digest, and a copy read whole is recorded for the next round
        (docs/semantics/kv.md §10.3)."""
        linking = cast(type[LinkingBackend], self.backend_class)
        if self.ledger is None:
            return linking.recover_prefix_cursor(self.data, self.prefixes)[0]
        ((rel, size),) = self.prefixes.items()
        known = self.known
        hashed = self.hashed
        if hashed is None:  # verified before (or without) describe: hash here
            hashed = split_digest(self.stage / rel, known.size if known else None, size)
        if known is not None and hashed[0] != known.digest:
            known = None  # not the bytes verified: every record is replayed
        cursor, whole = linking.recover_prefix_cursor(self.data, self.prefixes, known)
        if whole:
            path = self.stage / rel
            self.ledger.last = VerifiedPrefix(size, hashed[1], cursor.raw, _file_id(path))
        return cursor

    def describe(self) -> tuple[bytes, ExportManifest]:
        """Hash every file of the copy; the manifest and its deterministic bytes."""
        # Sorted as strings, the order ExportManifest.decode requires (Path order differs).
        rels = sorted((p.relative_to(self.stage).as_posix(), p) for p in _tree(self.data))
        files = []
        memo, reused, seen = self.memo, {}, {}
        for rel, p in rels:
            size = self.prefixes.get(rel)
            if memo is not None and size is None and memo.immutable(rel):
                ident = _identity(rel, p)
                digest = memo.digests.get(ident)
                if digest is None:
                    digest = file_digest(p)
                else:
                    reused[rel] = digest
                seen[ident] = digest
                files.append(ArtifactFile(rel, ident[3], digest))
                continue
            if size is not None and self.ledger is not None:
                # One pass gives the manifest's digest and the verification's prefix check.
                split = self.known.size if self.known is not None else None
                self.hashed = split_digest(p, split, size)
                files.append(ArtifactFile(rel, size, self.hashed[1].hex()))
                continue
            whole = p.stat().st_size if size is None else size
            files.append(ArtifactFile(rel, whole, file_digest(p, size=size)))
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
        if memo is not None:  # this round's files only: compacted ones leave it
            memo.digests, self.reused = seen, reused
        return manifest.encode(), manifest

    def seal(self, dest: Path, manifest_bytes: bytes) -> None:
        """Make the verified, described and fsynced copy the artifact ``dest``: the
        manifest written last, then the stage renamed (docs/semantics/kv.md §9.2 step 3)."""
        if self.prefixes:
            raise ValueError("a stage of hard links to live files is uploaded, never sealed")
        with open(self.stage / MANIFEST_NAME, "wb") as f:
            f.write(manifest_bytes)
            f.flush()
            os.fsync(f.fileno())
        _fsync(self.stage)
        os.rename(self.stage, dest)
        _fsync(dest.parent)

    def discard(self) -> None:
        self.abandon_reopen()
        shutil.rmtree(self.stage, ignore_errors=True)


def stage_export(
    store: ArtifactBackend,
    dest: str | os.PathLike[str],
    info: ExportInfo | None = None,
    *,
    link: bool = False,
) -> StagedExport:
    """Copy ``store`` into a hidden staging directory beside ``dest`` (which must not exist).

    The only step of an export that reads the live store: it must not run
    concurrently with ``apply`` (inside ``watch_applied``, an ``ExportRequest``).
    With ``link``, a backend that can (the append log) hard-links its live file
    instead of copying it and the stage records how many of its bytes are the copy
    (``prefixes``): for a stage that is uploaded and discarded (an export round),
    never for one sealed into an artifact directory; a backend with a
    :class:`DigestMemo` (RocksDB) makes such a stage with its ``round_copy`` and lends
    it the memo.
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
        if link and hasattr(store, "link_copy"):
            linking = cast(LinkingBackend, store)
            staged.prefixes = linking.link_copy(staged.data)
            if len(staged.prefixes) == 1:
                staged.ledger = linking.prefix_ledger
                known = staged.ledger.last
                ((rel, size),) = staged.prefixes.items()
                # Another file (compacted since) will not match: verify it all, at once.
                same = known is not None and known.file_id == _file_id(staged.stage / rel)
                staged.known = known if same and known is not None and known.size <= size else None
        elif link and hasattr(store, "digest_memo"):
            memo_backend = cast(MemoBackend, store)
            memo_backend.round_copy(staged.data)
            staged.memo = memo_backend.digest_memo
            staged.reopener = memo_backend.begin_reopen
        else:
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
