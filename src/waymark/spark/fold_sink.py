"""The fold sink: ``df.writeStream.foreachBatch(FoldSink(...))``.

Upserts and deletes keyed by a column into a durable fold store
(:mod:`waymark.kv.stores`: append-log, LMDB, RocksDB). The store's
``apply(batch, cursor)`` commits data and cursor in one transaction, and the
cursor here is the Spark batch id: a batch that Spark replays after a crash
between this commit and ``commits/N`` finds its id at or below the stored one
and is skipped, so a fold that is not idempotent (``merge``, e.g. adding counts)
is still applied exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from waymark.kv.stores import SnapshotStore, open_store
from waymark.kv.types import KvUpdate, WatchCursor

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("waymark.spark.fold")

Merge = Callable[[Any, Any], Any]


class FoldSink:
    """A ``foreachBatch`` function folding each micro-batch into a fold store.

    ``store`` is a fold store or a ``BACKEND:PATH`` spec (``lmdb:/var/folds/users``).
    ``key`` names the key column (cast to string). ``value`` names the value column:
    a string is JSON text stored as is, anything else is stored as its JSON.
    ``delete`` optionally names a boolean column; true rows delete their key.
    ``merge(old, new)`` optionally combines the stored value (decoded JSON, or None)
    with the row's value, e.g. ``lambda old, new: (old or 0) + new``; rows of one
    batch fold in order.
    """

    def __init__(
        self,
        store: SnapshotStore | str,
        *,
        key: str = "key",
        value: str = "value",
        delete: str | None = None,
        merge: Merge | None = None,
    ) -> None:
        self._spec = store if isinstance(store, str) else None
        self._store = None if isinstance(store, str) else store
        self.key = key
        self.value = value
        self.delete = delete
        self.merge = merge

    @property
    def store(self) -> SnapshotStore:
        if self._store is None:
            assert self._spec is not None
            self._store = open_store(self._spec)
        return self._store

    def last_batch(self) -> int | None:
        """The id of the last batch folded, from the store's committed cursor."""
        cursor = self.store.cursor
        return None if cursor.is_none else cursor.as_u64()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if self._done(batch_id):
            return
        columns = [self.key, self.value] + ([self.delete] if self.delete else [])
        self.fold_rows(df.select(*columns).toArrow().to_pylist(), batch_id)

    def fold_rows(self, rows: list[dict[str, Any]], batch_id: int) -> bool:
        """Fold rows already collected (dicts holding the key, value and delete columns)
        as batch ``batch_id``; False when the batch was folded before and is skipped."""
        if self._done(batch_id):
            return False
        self.store.apply(self.updates(rows, batch_id), WatchCursor.from_u64(batch_id))
        return True

    def _done(self, batch_id: int) -> bool:
        done = self.last_batch()
        if done is not None and batch_id <= done:
            log.info("fold: batch %d already folded (stored batch %d): skipped", batch_id, done)
            return True
        return False

    def updates(self, rows: list[dict[str, Any]], batch_id: int) -> list[KvUpdate]:
        """The batch's rows as fold updates (``merge`` resolved against the store)."""
        out: list[KvUpdate] = []
        pending: dict[str, Any] = {}  # values this batch already produced, for merge
        for row in rows:
            key = row[self.key]
            if key is None:
                raise ValueError(f"fold sink: a row has a null key column {self.key!r}")
            key = str(key)
            if self.delete and row[self.delete]:
                out.append(KvUpdate.delete(key, batch_id))
                pending[key] = None
                continue
            value = row[self.value]
            if self.merge is not None:
                if key in pending:
                    old = pending[key]
                else:
                    entry = self.store.get(key)
                    old = None if entry is None else orjson.loads(entry.value)
                value = pending[key] = self.merge(old, value)
                encoded = orjson.dumps(value, default=str)
            elif isinstance(value, str):
                encoded = value.encode()
            else:
                encoded = orjson.dumps(value, default=str)
            out.append(KvUpdate.put(key, encoded, batch_id))
        return out

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
