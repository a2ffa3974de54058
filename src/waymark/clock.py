"""Injectable time, the retry delays, and the ids that go with them.

Every time decision in waymark (TTL, leases, priority decay, backoff) reads a
:class:`Clock` instead of the wall clock, so tests drive time explicitly and
never sleep. :class:`Backoff` is the one retry-delay policy, here at the bottom of
the layers so that every layer that retries (the shipper, the pipeline, the KV
watch) uses the same one. Likewise the engine draws the random ids it hands out
(lease ids, the instance id) from an :class:`IdSource`, so a test can make them
predictable.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import time
from dataclasses import dataclass
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


# 2**62 times any sane base is far above any cap; a larger exponent would only
# risk a float overflow after thousands of failed attempts.
_MAX_EXPONENT = 62


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with "equal jitter": the delay before retry
    ``attempt`` (1 = the first retry) is between half and all of
    ``min(cap_s, base_s * 2 ** (attempt - 1))``, never next to nothing."""

    base_s: float = 0.1
    cap_s: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(f"backoff needs 0 < base ({self.base_s}) <= cap ({self.cap_s})")

    def ceiling(self, attempt: int) -> float:
        """The largest delay before retry ``attempt``."""
        exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
        return min(self.cap_s, self.base_s * 2**exponent)

    def delay(self, attempt: int, rng: random.Random) -> float:
        ceiling = self.ceiling(attempt)
        return ceiling / 2 + rng.random() * ceiling / 2


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
