"""How a collector's reply is read: ack, retry later, or reject.

The delays between retries are :class:`waymark.clock.Backoff` ("equal jitter", so a
retry never comes back immediately, which would hammer a collector that just said
it is overloaded), the one retry-delay policy of every layer that retries.
"""

from __future__ import annotations

import enum


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
