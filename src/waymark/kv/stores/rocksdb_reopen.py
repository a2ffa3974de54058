"""RocksDB's verifying reopen in a long-lived worker process (docs/kv.md, "Replicas").

rocksdict's open holds the GIL for the whole open (the copied WAL's replay
included), so in the exporter's process it cannot overlap the upload's hashing
and tar stream. A round sends its stage's path to this worker instead, which opens
the copy read-only and answers the cursor it recovers; the exporter's GIL stays free.

This file is also the worker's program: run as ``python -P rocksdb_reopen.py`` it
imports rocksdict and the standard library only (not the waymark package, whose
imports take ~1 s). Requests and answers are lines on its stdin and stdout:
``ID<TAB>PATH`` and ``ID<TAB>ok<TAB>CURSOR_HEX`` or ``ID<TAB>err<TAB>MESSAGE``. It
exits when its stdin closes (its exporter closed it, or died).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

CURSOR_KEY = b"cursor"
"""The ``meta`` column family's key of the cursor (waymark.kv.stores.protocol's)."""
CONFIG_NAME = "rocksdict-config.json"
"""The file rocksdict rewrites on every open, a read-only one included."""

WRITE_BUFFER_BYTES = 4 << 20
"""Memtable size per column family (RocksDB's default is 64 MiB). A sealed export's
checkpoint flushes what the memtables hold, and a round's stage carries the WAL that
holds it (replayed by the verification): with small memtables the fold's background
flushes have written all but the last few MiB to SST files already (docs/kv.md,
"Fold stores")."""


def options() -> Options:
    """The options of a fold store and of every reopen of its copies."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_write_buffer_size(WRITE_BUFFER_BYTES)
    # Every flush takes all column families. The ``meta`` family (one key, the
    # cursor) never fills its memtable: flushed alone it would pin every WAL since
    # the last checkpoint, which that checkpoint then deletes in the foreground
    # (~50 ms of a round for a million keys), and flush in a job of its own there
    # (docs/kv.md, "Fold stores").
    opts.set_atomic_flush(True)
    return opts


def recover_raw_cursor(data_dir: str) -> bytes:
    """Open the copy at ``data_dir`` read-only; the raw cursor it recovers (b"" if none).
    Raises the engine's plain Exception where it cannot be opened."""
    if not os.path.isfile(os.path.join(data_dir, "CURRENT")):
        # Checked first: an open of a missing path makes its parent directories.
        raise FileNotFoundError(f"{data_dir} holds no RocksDB copy (no CURRENT)")
    db = Rdict(
        data_dir,
        options=options(),
        column_families={"data": options(), "meta": options()},
        access_type=AccessType.read_only(),
    )
    try:
        meta = db.get_column_family("meta")
        raw = meta.get(CURSOR_KEY)
        meta.close()
    finally:
        db.close()
    return bytes(raw) if raw is not None else b""


def reopen_view(data: Path, view: Path) -> None:
    """A directory ``view`` for the reopen of the copy ``data``: its files hard-linked
    (copied where they cannot be), rocksdict's config copied. A read-only open writes
    no engine file but rewrites the config, which the upload may be reading from the
    stage meanwhile."""
    view.mkdir()
    for p in data.iterdir():
        if p.name != CONFIG_NAME:
            try:
                os.link(p, view / p.name)
                continue
            except OSError:
                pass  # no hard links here: a copy is as good
        shutil.copyfile(p, view / p.name)


class ReopenWorker:
    """The exporter's side of the worker: started once (and again after a failure),
    closed with the store. One answer is awaited at a time; an answer to an earlier
    request that was never awaited (a round that failed first) is skipped."""

    def __init__(self, deadline_s: float = 120.0) -> None:
        self.deadline_s = deadline_s
        """How long an answer may take; beyond it the worker is killed and the round fails."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._next = 0
        self._buf = b""

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        """Start the worker unless it runs (its imports then overlap what follows)."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._proc = subprocess.Popen(
                # -P: this file's directory (the stores' modules) is not put on
                # sys.path; the rest of the exporter's environment (PYTHONPATH, the
                # user's site) is kept, so rocksdict imports as it did here.
                [sys.executable, "-P", __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        return self._proc

    def submit(self, data_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
        """Ask for the cursor of the copy at ``data_dir``; a ticket for :meth:`result`.
        ChildProcessError where the worker is gone."""
        with self._lock:
            proc = self._ensure()
            self._next += 1
            assert proc.stdin is not None
            try:
                proc.stdin.write(f"{self._next}\t{data_dir}\n".encode())
                proc.stdin.flush()
            except OSError as e:
                self._stop()
                raise ChildProcessError(f"the RocksDB reopen worker is gone: {e}") from e
            return proc, self._next

    def result(self, ticket: tuple[subprocess.Popen[bytes], int]) -> bytes:
        """The raw cursor the worker recovered; OSError with its message where the copy
        could not be opened; ChildProcessError where the worker died, TimeoutError where
        it missed the deadline (it is killed then)."""
        proc, wanted = ticket
        deadline = time.monotonic() + self.deadline_s
        with self._lock:
            if proc is not self._proc:
                raise ChildProcessError(
                    "the RocksDB reopen worker was restarted before it answered"
                )
            assert proc.stdout is not None
            fd = proc.stdout.fileno()
            while True:
                line, sep, rest = self._buf.partition(b"\n")
                if sep:
                    self._buf = rest
                    ident, status, text = line.decode().split("\t", 2)
                    if int(ident) != wanted:
                        continue  # a request nobody awaits any more
                    if status == "ok":
                        return bytes.fromhex(text)
                    raise OSError(text)
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    self._stop()
                    raise TimeoutError(
                        f"the RocksDB reopen worker did not answer within {self.deadline_s} s"
                    )
                chunk = os.read(fd, 65536)
                if not chunk:
                    code = proc.wait()
                    self._stop()
                    raise ChildProcessError(f"the RocksDB reopen worker died (exit status {code})")
                self._buf += chunk

    @property
    def asked(self) -> int:
        """How many reopens were asked of this worker and its predecessors."""
        return self._next

    def close(self) -> None:
        """Stop the worker (with the fold's store). Killed first, without the lock: a
        round awaiting its answer then fails at once instead of holding the lock."""
        proc = self._proc
        if proc is not None:
            proc.kill()
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        proc, self._proc, self._buf = self._proc, None, b""
        if proc is None:
            return
        proc.kill()  # it holds nothing that outlives it: read-only opens of copies
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _serve() -> None:
    for line in sys.stdin:
        ident, _, path = line.rstrip("\n").partition("\t")
        try:
            answer = f"ok\t{recover_raw_cursor(path).hex()}"
        except Exception as e:  # the engine raises plain Exception
            answer = "err\t" + " ".join(f"cannot open RocksDB copy at {path}: {e}".split())
        sys.stdout.write(f"{ident}\t{answer}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
