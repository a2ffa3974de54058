"""Injectable time, and the ids that go with it.

Every time decision in waymark (TTL, leases, priority decay, backoff) reads a
:class:`Clock` instead of the wall clock, so tests drive time explicitly and
never sleep. Likewise the engine draws the random ids it hands out (lease ids, the
instance id) from an :class:`IdSource`, so a test can make them predictable.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...


class SystemClock:
    """The wall clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class OffsetClock:
    """Fault injector: the wall clock plus the milliseconds ``path`` holds (absent or
    empty: 0), read again at most every ``reread_s``; a file another process rewrites
    makes this process's clock jump, forwards or back (docs/faults.md, "Faults")."""

    def __init__(self, path: Path, reread_s: float = 0.1) -> None:
        self.path = path
        self.reread_s = reread_s
        self._offset = 0
        self._read_at = float("-inf")

    def now_ms(self) -> int:
        mono = time.monotonic()
        if mono - self._read_at >= self.reread_s:
            self._read_at = mono
            # (absent, or caught mid-write: the last offset stays)
            with contextlib.suppress(OSError, ValueError):
                self._offset = int(self.path.read_text().strip() or 0)
        return time.time_ns() // 1_000_000 + self._offset


class ManualClock:
    """A clock that moves only when told to; for tests and simulations."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("a clock never runs backwards")
        self._now += ms

    def set(self, now_ms: int) -> None:
        if now_ms < self._now:
            raise ValueError("a clock never runs backwards")
        self._now = now_ms


class IdSource(Protocol):
    def token(self, nbytes: int) -> str:
        """A fresh id of ``nbytes`` bytes, as ``2 * nbytes`` lowercase hex digits."""
        ...


class RandomIds:
    """Ids from the operating system's randomness."""

    def token(self, nbytes: int) -> str:
        return secrets.token_hex(nbytes)


class CountingIds:
    """Ids 1, 2, 3, ... in hex, zero-padded; for tests and simulations."""

    def __init__(self) -> None:
        self._last = 0

    def token(self, nbytes: int) -> str:
        self._last += 1
        return f"{self._last:0{2 * nbytes}x}"
