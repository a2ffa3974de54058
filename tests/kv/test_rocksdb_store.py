"""The RocksDB fold store's engine options: what an export round's checkpoint finds
when the fold has written far more than one memtable (docs/kv.md, "Fold stores")."""

from __future__ import annotations

import time
from pathlib import Path

from waymark.kv import KvUpdate, WatchCursor
from waymark.kv.artifact import ExportInfo, stage_export
from waymark.kv.stores.rocksdb_store import WRITE_BUFFER_BYTES, RocksDbStore

BUFFERS = 5
"""The fold writes this many memtables' worth of updates before the checkpoint."""


def _wal_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in db.glob("*.log"))


def test_the_checkpoint_finds_at_most_a_memtable_unflushed_and_no_pinned_wal(
    tmp_path: Path,
) -> None:
    """The fold's own flushes keep up with it: a checkpoint, in the fold's pause, has
    at most about one memtable to flush and no pile of WAL files to delete. Fails with
    RocksDB's 64 MiB memtables (everything still in memory) and without atomic flush
    (the ``meta`` family's cursor pins every WAL since the store was opened)."""
    store = RocksDbStore(tmp_path / "db")
    value = b"v" * 1000
    per_batch = 1000
    batches = BUFFERS * WRITE_BUFFER_BYTES // (per_batch * len(value)) + 1
    for b in range(batches):
        first = b * per_batch
        store.apply(
            [KvUpdate.put(f"k.{first + i:08}", value, first + i + 1) for i in range(per_batch)],
            WatchCursor.from_u64(first + per_batch),
        )
    # Flushes and the WAL purge after them run on RocksDB's background threads.
    deadline = time.monotonic() + 20
    while _wal_bytes(tmp_path / "db") > 2 * WRITE_BUFFER_BYTES and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _wal_bytes(tmp_path / "db") <= 2 * WRITE_BUFFER_BYTES
    data = store._data  # noqa: SLF001 -- the engine property the store does not expose
    unflushed = int(data.property_value("rocksdb.cur-size-all-mem-tables") or 0)
    assert unflushed <= 2 * WRITE_BUFFER_BYTES

    # The export still holds every update, at the live cursor.
    staged = stage_export(store, tmp_path / "artifact", ExportInfo())
    try:
        staged.verify()
        assert RocksDbStore.recover_cursor(staged.data) == store.cursor
        copy = RocksDbStore(staged.data)
        assert len(list(copy.iter_keys())) == batches * per_batch
        copy.close()
    finally:
        staged.discard()
        store.close()
