"""The audit log (docs/security.md, "Audit log"): one JSON line per refused request and
per admin action, in a file rotated by size.

A line is ``{"ts", "event", ...}`` with ``event`` one of

- ``refused``: a request the server refused — a token missing, unknown, expired,
  without the scope or past its rate, a browser check, or a limit (every code counted
  in ``waymark_refusals_total``) — with ``code``, ``status``, the client address and,
  when the request got that far, ``method``, ``path``, ``token`` (its name) and the
  refusal's ``detail``;
- ``admin``: a request to a route that needs ``admin`` and changes something (topic
  config and drops, routers, forgetting reports), with its ``status``;
- ``tokens_reloaded``: a SIGHUP that loaded the tokens file (``tokens``: their names),
  or ``tokens_not_reloaded`` with ``reason``.

Secrets and ``Authorization`` headers are never written. Past ``max_bytes`` the file
is renamed ``<file>.1`` (``.1`` to ``.2`` and so on, ``backups`` kept) and a new one
begun, so a flood of hostile requests fills a bounded amount of disk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from ..clock import Clock, SystemClock

MAX_PATH_CHARS = 1024  # a path is logged cut to this: a hostile one may be 64 KiB


class AuditLog:
    """Appends audit lines to ``path`` (mode 0600), rotating it past ``max_bytes``."""

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = 10 << 20,
        backups: int = 5,
        clock: Clock | None = None,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.clock = clock or SystemClock()
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size
        self.lines = 0  # written since start, all files

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, event: str, **fields: Any) -> None:
        """One line; an OSError (a full disk) is not the request's failure: dropped."""
        line = msgspec.json.encode({"ts": self.clock.now_ms(), "event": event, **fields}) + b"\n"
        try:
            if self._size and self._size + len(line) > self.max_bytes:
                self._rotate()
            os.write(self._fd, line)  # O_APPEND: one write per line, whole
        except OSError:
            return
        self._size += len(line)
        self.lines += 1

    def refused(
        self,
        code: str,
        status: int,
        client: str | None,
        *,
        method: str | None = None,
        path: str | None = None,
        token: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self.write(
            "refused", code=code, status=status, client=client, method=method,
            path=None if path is None else path[:MAX_PATH_CHARS], token=token,
            detail=detail or {},
        )  # fmt: skip

    def _rotate(self) -> None:
        os.close(self._fd)
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.backups:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            os.truncate(self.path, 0)
        self._fd = self._open()
        self._size = 0

    def close(self) -> None:
        os.close(self._fd)
