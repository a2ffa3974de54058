"""``LocalReceiptStore``: receipts in an embedded SQLite file
(docs/semantics/recovery.md §4.1).

WAL journal mode with ``synchronous=FULL``: a method returns once its transaction is
on disk, so a receipt the service reported persisted survives a SIGKILL or a power
cut. One file serves any number of clients (the client id is part of each row's key).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from .store import Binding

_SCHEMA = """
CREATE TABLE IF NOT EXISTS watermark (client TEXT PRIMARY KEY, checkpoint INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ranges (
    client TEXT NOT NULL, begin INTEGER NOT NULL, end INTEGER NOT NULL,
    PRIMARY KEY (client, begin)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS binding (
    client TEXT PRIMARY KEY, instance TEXT NOT NULL, topics TEXT, since INTEGER NOT NULL,
    unreceipted TEXT
);
"""


class LocalReceiptStore:
    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        """``read_only``: open an existing file to look at (``waymark recovery missed``
        and ``status``): nothing is created or changed, a missing file is a
        :class:`FileNotFoundError`, and a write fails."""
        self.path = Path(path)
        if read_only:
            if not self.path.is_file():
                raise FileNotFoundError(f"no receipt store at {self.path}")
            self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                       check_same_thread=False, isolation_level=None)  # fmt: skip
            tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master")}
            if not {"watermark", "ranges"} <= tables:
                self._db.close()
                raise FileNotFoundError(f"{self.path} is not a receipt store")
            self._binding = "binding" in tables
            # (a file from before the unreceipted ranges were kept: it has none)
            self._holes = self._binding and "unreceipted" in self._columns()
        else:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._binding = True
            if "unreceipted" not in self._columns():  # a file from before it was kept
                self._db.execute("ALTER TABLE binding ADD COLUMN unreceipted TEXT")
            self._holes = True
        self._lock = threading.Lock()

    def _write(self, sql: str, rows: Iterable[tuple[object, ...]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(sql, rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def low_watermark(self, client: str) -> int | None:
        with self._lock:
            row = self._db.execute(
                "SELECT checkpoint FROM watermark WHERE client = ?", (client,)
            ).fetchone()
        return None if row is None else int(row[0])

    def store_low_watermark(self, client: str, checkpoint: int) -> None:
        self._write(
            "INSERT INTO watermark VALUES (?, ?) ON CONFLICT (client) "
            "DO UPDATE SET checkpoint = excluded.checkpoint",
            [(client, checkpoint)],
        )

    def store_range_receipt(self, client: str, begin: int, end: int) -> None:
        self._write(
            "INSERT INTO ranges VALUES (?, ?, ?) ON CONFLICT (client, begin) "
            "DO UPDATE SET end = max(end, excluded.end)",
            [(client, begin, end)],
        )

    def range_receipts(self, client: str, after: int) -> Iterator[tuple[int, int]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT begin, end FROM ranges WHERE client = ? AND end > ? ORDER BY begin DESC",
                (client, after),
            ).fetchall()
        return iter([(int(b), int(e)) for b, e in rows])

    def purge_range_receipts(self, client: str, begins: Iterable[int]) -> None:
        self._write(
            "DELETE FROM ranges WHERE client = ? AND begin = ?", [(client, b) for b in begins]
        )

    def purge_before(self, client: str, checkpoint: int) -> None:
        self._write("DELETE FROM ranges WHERE client = ? AND end <= ?", [(client, checkpoint)])

    def _columns(self) -> set[str]:
        return {row[1] for row in self._db.execute("PRAGMA table_info(binding)")}

    def binding(self, client: str) -> Binding | None:
        if not self._binding:
            return None  # (a file from before bindings were kept, opened read-only)
        unreceipted = "unreceipted" if self._holes else "NULL"
        with self._lock:
            row = self._db.execute(
                f"SELECT instance, topics, since, {unreceipted} FROM binding WHERE client = ?",
                (client,),
            ).fetchone()
        if row is None:
            return None
        topics = None if row[1] is None else json.loads(row[1])
        holes = [(first, last) for first, last in json.loads(row[3] or "[]")]
        return Binding(row[0], topics, int(row[2]), holes)

    def store_binding(self, client: str, binding: Binding) -> None:
        topics = None if binding.topics is None else json.dumps(binding.topics)
        self._write(
            "INSERT INTO binding VALUES (?, ?, ?, ?, ?) ON CONFLICT (client) DO UPDATE SET "
            "instance = excluded.instance, topics = excluded.topics, since = excluded.since, "
            "unreceipted = excluded.unreceipted",
            [(client, binding.instance, topics, binding.since, json.dumps(binding.unreceipted))],
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()
