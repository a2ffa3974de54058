"""Fold stores behind one contract, and the ``BACKEND:PATH`` spec the CLI takes."""

from __future__ import annotations

from waymark.kv.stores.append_log import AppendLogStore
from waymark.kv.stores.protocol import SnapshotStore, stale_keys

BACKENDS = ("append-log", "lmdb", "rocksdb")


def store_class(backend: str) -> type[SnapshotStore]:
    """The store class of a backend name.

    The on-disk backends are imported only when named, so the default needs neither.
    """
    if backend == "append-log":
        return AppendLogStore
    if backend == "lmdb":
        from waymark.kv.stores.lmdb_store import LmdbStore

        return LmdbStore
    if backend == "rocksdb":
        from waymark.kv.stores.rocksdb_store import RocksDbStore

        return RocksDbStore
    raise ValueError(
        f"unknown fold store backend {backend!r} (expected one of {', '.join(BACKENDS)})"
    )


def open_store(spec: str) -> SnapshotStore:
    """Open a fold store from ``append-log:PATH``, ``lmdb:PATH`` or ``rocksdb:PATH``."""
    backend, sep, path = spec.partition(":")
    if not sep or not path:
        raise ValueError(f"store spec {spec!r} must look like BACKEND:PATH ({', '.join(BACKENDS)})")
    return store_class(backend)(path)  # type: ignore[call-arg]


__all__ = [
    "BACKENDS",
    "AppendLogStore",
    "SnapshotStore",
    "open_store",
    "stale_keys",
    "store_class",
]
