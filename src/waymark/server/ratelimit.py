"""Per-token rate limits (docs/security.md, "Rate limits").

A token with ``rate_per_s`` in the tokens file is admitted that many requests per
second on average, with a burst of one second's worth (at least one request): a token
bucket per token id, refilled by the server's clock (:mod:`waymark.clock`, so tests
drive it). A request past it is 429 ``rate_limited`` with ``Retry-After``: the whole
seconds until the bucket holds a request again. Streams are charged once, when they
open; a refused request charges nothing.
"""

from __future__ import annotations

import math

from ..clock import Clock
from ..log import ErrorCode, TopicError
from .auth import Token


class RateLimits:
    """The buckets of every rate-limited token, by token id."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._buckets: dict[str, tuple[float, int]] = {}  # id -> (requests left, at ms)

    def take(self, token: Token) -> TopicError | None:
        """Charge one request to ``token``: None admits it, else the 429 refusal."""
        rate = token.rate_per_s
        if rate is None:
            return None
        burst = max(1.0, rate)
        now = self.clock.now_ms()
        left, at = self._buckets.get(token.id, (burst, now))
        left = min(burst, left + max(0, now - at) * rate / 1000)
        if left >= 1.0:
            self._buckets[token.id] = (left - 1.0, now)
            return None
        self._buckets[token.id] = (left, now)
        retry_after_s = max(1, math.ceil((1.0 - left) / rate))
        return TopicError(
            ErrorCode.RATE_LIMITED,
            f"token {token.name!r} is past its rate of {rate:g} requests per second; "
            f"retry after {retry_after_s} s",
            {"token": token.name, "rate_per_s": rate, "retry_after_s": retry_after_s},
        )

    def forget_except(self, ids: set[str]) -> None:
        """Drop the buckets of tokens no longer in the file (after a reload)."""
        for token_id in [i for i in self._buckets if i not in ids]:
            del self._buckets[token_id]
