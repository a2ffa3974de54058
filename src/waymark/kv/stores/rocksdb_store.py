"""A fold store on RocksDB (rocksdict): one WriteBatch per ``apply`` holds data and cursor.

Column families ``data`` (key -> value record) and ``meta`` (the cursor). The
WAL is always on; ``sync=False`` (the default) leaves the fsync to the OS, so a
crash can lose an un-synced tail but never separates the cursor from its data.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, cast

from rocksdict import Checkpoint, Rdict, WriteBatch, WriteOptions

from waymark.kv.artifact import DigestMemo, ExportInfo, ExportManifest, export_store
from waymark.kv.errors import SnapshotError, SnapshotIoError
from waymark.kv.stores.protocol import CURSOR_KEY, VER_LEN, decode_record
from waymark.kv.stores.rocksdb_reopen import (
    WRITE_BUFFER_BYTES as WRITE_BUFFER_BYTES,  # the fold store's, named here too
)
from waymark.kv.stores.rocksdb_reopen import (
    ReopenWorker,
    recover_raw_cursor,
    reopen_view,
)
from waymark.kv.stores.rocksdb_reopen import options as _options
from waymark.kv.types import KvEntry, KvUpdate, Op, WatchCursor

REOPEN_VIEW = ".reopen"
"""The directory, inside a round's stage (beside its ``data``), that the reopen worker
opens: never part of the payload, removed with the stage."""

_BACKGROUND_JOBS = ("rocksdb.num-running-flushes", "rocksdb.num-running-compactions")


class _Version(NamedTuple):
    """The engine's state as a round copy sees it."""

    busy: int
    """Flushes and compactions running: each writes its MANIFEST record, syncs it and
    only then installs its version (the live files), so while one runs the MANIFEST may
    name files the live set does not yet have."""
    ssts: frozenset[str]
    """The live SST files, by name."""
    sizes: tuple[tuple[str, int], ...]
    """CURRENT and the MANIFEST it names, the newest OPTIONS, the WAL files and
    rocksdict's config, with their sizes: the files a round copies."""


FORMAT_GENERATION = 1
"""The on-disk format generation recorded in export artifacts: the ``data``/``meta``
column families and the value-record codec. Bump it when either changes."""


class RocksDbStore:
    backend = "rocksdb"
    format_generation = FORMAT_GENERATION
    reopen_holds_gil = True  # rocksdict opens a DB without releasing the GIL
    reopen_deadline_s = 120.0
    """How long a round's reopen in the worker may take before the round fails."""

    def __init__(self, path: str | os.PathLike[str], *, sync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = Rdict(
                str(self.path),
                options=_options(),
                column_families={"data": _options(), "meta": _options()},
            )
        except Exception as e:  # rocksdict raises plain Exception for engine errors
            raise SnapshotIoError(f"cannot open RocksDB fold at {self.path}: {e}") from e
        self._data_cf = self._db.get_column_family_handle("data")
        self._meta_cf = self._db.get_column_family_handle("meta")
        self._data = self._db.get_column_family("data")
        self._write_opts = WriteOptions()
        self._write_opts.sync = sync
        raw = self._db.get_column_family("meta").get(CURSOR_KEY)
        self._cursor = WatchCursor(bytes(raw) if raw is not None else b"")
        # SST files are never changed once written: a round's stage links the same ones
        # again, and hashes only the new ones before its upload (docs/kv.md, "Replicas").
        self.digest_memo = DigestMemo(lambda rel: rel.endswith(".sst"))
        # A round's verifying reopen runs in this worker, off the exporter's GIL; it is
        # started by the first round (or ``start_rounds``), stopped by ``close``.
        self.reopen_worker = ReopenWorker(self.reopen_deadline_s)

    @property
    def cursor(self) -> WatchCursor:
        return self._cursor

    def apply(self, batch: Sequence[KvUpdate], cursor: WatchCursor) -> None:
        wb = WriteBatch(raw_mode=True)
        data = self._data_cf
        # One plain loop for every kind of update: CPython 3.11 specialises the
        # attribute reads, which made it faster than encoding with C-level
        # ``map`` passes and then feeding ``WriteBatch.put`` from another.
        put, delete, ver_len, join, op_put = wb.put, wb.delete, VER_LEN, b"".join, Op.PUT
        for u in batch:
            value = u.value
            if value and u.op is op_put:
                version = u.version.raw
                put(u.key.encode(), join((ver_len[len(version)], version, value)), data)
            else:
                delete(u.key.encode(), data)
        wb.put(CURSOR_KEY, cursor.raw, self._meta_cf)
        try:
            self._db.write(wb, self._write_opts)
        except Exception as e:
            raise SnapshotIoError(f"RocksDB apply failed: {e}") from e
        self._cursor = cursor

    def export_to(
        self, dest: str | os.PathLike[str], info: ExportInfo | None = None
    ) -> ExportManifest:
        """Export the fold as an artifact directory at ``dest``; see waymark.kv.artifact."""
        return export_store(self, dest, info)

    def write_copy(self, data_dir: Path) -> None:
        """RocksDB's checkpoint: memtables flushed, SST files hard-linked, consistent by
        construction (and verified by reopening all the same)."""
        try:
            Checkpoint(self._db).create_checkpoint(str(data_dir))
        except Exception as e:  # rocksdict raises plain Exception for engine errors
            raise SnapshotIoError(f"RocksDB checkpoint to {data_dir} failed: {e}") from e

    def round_copy(self, data_dir: Path) -> None:
        """A round's stage without a flush or a sync: the live SST files hard-linked; the
        MANIFEST, CURRENT, the newest OPTIONS and the WAL files copied. The verifying
        reopen replays the copied WAL, as a checkpoint that carries the WAL would
        (RocksDB's ``log_size_for_flush``, which rocksdict does not expose); every
        batch writes its cursor with its data, so the cursor it recovers proves the copy
        whole. Runs in the fold's pause, so nothing is written meanwhile, but the
        engine's background flushes and compactions go on: one running when the copy
        starts or ends may have written its MANIFEST record before installing its
        version, and one that ran in between changed the live files, the MANIFEST or
        the WAL files. Either way the copy could mix two versions, so it is not made,
        or is discarded, and RocksDB's checkpoint made instead; so it is where a file
        cannot be hard-linked (another file system) (docs/kv.md, "Replicas")."""
        before = self._version()
        if not before.busy and self._copy(before, data_dir) and self._version() == before:
            return
        shutil.rmtree(data_dir, ignore_errors=True)
        self.write_copy(data_dir)

    def _copy(self, version: _Version, data_dir: Path) -> bool:
        """Link and copy ``version``'s files into ``data_dir``; False where a file was
        gone (a background job removed it) or a link cannot be made (another file
        system, or one without hard links: the checkpoint then copies)."""
        try:
            data_dir.mkdir()
            for name in version.ssts:
                os.link(self.path / name, data_dir / name)
            for name, _ in version.sizes:
                shutil.copyfile(self.path / name, data_dir / name)
        except OSError:
            return False
        return True

    def _version(self) -> _Version:
        """What a round copy must find unchanged after it; see :class:`_Version`."""
        busy = sum(self._db.property_int_value(p) or 0 for p in _BACKGROUND_JOBS)
        ssts = frozenset(f["name"].lstrip("/") for f in self._db.live_files())
        names = os.listdir(self.path)
        current = (self.path / "CURRENT").read_text().strip()
        options = max((n for n in names if n.startswith("OPTIONS-")), default=None)
        wanted = {"CURRENT", current, options, "rocksdict-config.json"}
        sizes = []
        for name in sorted(n for n in names if n in wanted or n.endswith(".log")):
            try:
                sizes.append((name, os.stat(self.path / name).st_size))
            except FileNotFoundError:
                continue  # an obsolete WAL deleted since the listing: not part of a version
        return _Version(busy, ssts, tuple(sizes))

    @classmethod
    def recover_cursor(cls, data_dir: Path) -> WatchCursor:
        try:
            return WatchCursor(recover_raw_cursor(str(data_dir)))
        except Exception as e:
            raise SnapshotIoError(f"cannot open RocksDB copy at {data_dir}: {e}") from e

    @classmethod
    def path_in(cls, data_dir: Path) -> Path:
        return data_dir

    def get(self, key: str) -> KvEntry | None:
        rec = self._data.get(key.encode())
        return None if rec is None else decode_record(key, rec)

    def range(self, prefix: str = "") -> list[KvEntry]:
        p = prefix.encode()
        out = []
        # The fold is opened raw: keys and values are bytes (the stubs say any value).
        items = cast("Iterator[tuple[bytes, bytes]]", self._data.items(from_key=p))
        for k, v in items:
            if not k.startswith(p):
                break
            out.append(decode_record(k.decode(), v))
        return out

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        p = prefix.encode()
        for k in cast("Iterator[bytes]", self._data.keys(from_key=p)):
            if not k.startswith(p):
                return
            yield k.decode()

    def begin_reopen(self, data_dir: Path) -> Callable[[], WatchCursor]:
        """Send the round copy at ``data_dir`` to the reopen worker (started again if it
        died); the returned call waits for the cursor it recovers, with the worker's
        deadline. The worker opens a view of hard links beside the copy, inside the
        stage (removed with it), and never writes into the files being uploaded
        (docs/kv.md, "Replicas")."""
        view = data_dir.parent / REOPEN_VIEW
        reopen_view(data_dir, view)
        worker = self.reopen_worker
        try:
            ticket = worker.submit(view)
        except ChildProcessError as e:
            shutil.rmtree(view, ignore_errors=True)
            raise SnapshotError(f"export of rocksdb fold failed verification: {e}") from e

        def recovered() -> WatchCursor:
            try:
                return WatchCursor(worker.result(ticket))
            except (ChildProcessError, TimeoutError) as e:  # died, or killed at the deadline
                raise SnapshotError(f"export of rocksdb fold failed verification: {e}") from e
            except OSError as e:
                raise SnapshotIoError(str(e)) from e
            finally:
                shutil.rmtree(view, ignore_errors=True)

        return recovered

    def start_rounds(self) -> None:
        """Start the worker of the rounds' verifying reopens now, so that the first
        round does not wait for its start (an exporter calls it before its rounds)."""
        self.reopen_worker.start()

    def close(self) -> None:
        self.reopen_worker.close()
        # Column-family views share the engine: drop them so close releases the LOCK.
        self._data.close()
        del self._data, self._data_cf, self._meta_cf
        self._db.close()
