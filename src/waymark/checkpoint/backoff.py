"""Retry delays: capped exponential backoff with jitter, and how a collector's reply is read.

Jitter keeps many shippers (or many in-flight batches of one shipper) that failed
together from retrying together. "Equal jitter" is used rather than full jitter:
a retry never comes back immediately, which would hammer a collector that just
said it is overloaded.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

# 2**62 times any sane base is far above any cap; a larger exponent would only
# risk a float overflow after thousands of failed attempts.
_MAX_EXPONENT = 62


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before retry ``attempt`` (1 = the first retry): between half and all of
    ``min(cap_s, base_s * 2 ** (attempt - 1))``."""

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


class Verdict(enum.Enum):
    """What a collector's HTTP status means for the batch."""

    ACK = "ack"
    TRANSIENT = "transient"
    REJECT = "reject"


def verdict(status: int) -> Verdict:
    """2xx acks; 408, 429 and 5xx are worth a retry; any other 4xx (413, 400, ...)
    will never succeed and rejects the batch.

    1xx/3xx are not answers a collector should give: they are retried (checkpoint
    frozen, visible in the retry counters) rather than taken as a reason to give
    data up.
    """
    if 200 <= status < 300:
        return Verdict.ACK
    if 400 <= status < 500 and status not in (408, 429):
        return Verdict.REJECT
    return Verdict.TRANSIENT
