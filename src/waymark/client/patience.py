"""Waiting out a server outage (docs/client.md, "Outages").

A client given a :class:`Patience` sends a request again, after capped exponential
backoff with jitter, when the server could not have acted on it or acting twice is
harmless, until the outage has lasted the budget; then the last error is raised. What
is safe to send again is the client's to decide (:func:`worth_retrying`); how long to
wait is the policy's.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..protocol import ErrorCode
from .errors import ApiError, ConnectError, TransportError

log = logging.getLogger("waymark.client")

# Refusals that changed nothing and say "later": a full or broken write-ahead log, the
# connection limit, a token's request rate (docs/http-api.md, "Errors").
_LATER = frozenset({ErrorCode.STORAGE_UNAVAILABLE, ErrorCode.SERVER_BUSY, ErrorCode.RATE_LIMITED})


def worth_retrying(error: Exception, idempotent: bool) -> bool:
    """Whether a request that failed with ``error`` may be sent again: the connection
    was never made (nothing was sent), the server refused it for now without acting,
    or the answer was lost but the request is idempotent."""
    if isinstance(error, ApiError):
        return error.code in _LATER
    if isinstance(error, ConnectError):
        return True
    return isinstance(error, TransportError) and idempotent


def next_wait(
    patience: Patience | None,
    outage: Outage | None,
    error: Exception,
    what: str,
    idempotent: bool,
) -> tuple[Outage, float] | None:
    """After a request ``what`` failed with ``error``: its outage and the seconds to
    wait before sending it again, or None when it is not sent again (no patience, not
    safe to repeat, or the budget spent): the caller then raises ``error``."""
    if patience is None or not worth_retrying(error, idempotent):
        return None
    outage = outage or patience.outage(what)
    wait = outage.delay(error)
    return None if wait is None else (outage, wait)


@dataclass
class Patience:
    """How long a client waits out an outage: each request retries for up to
    ``budget_s`` seconds from its first failure, waiting between half and all of
    ``min(cap_s, base_s * 2 ** (attempt - 1))`` (more if the server's ``Retry-After``
    says so). ``now`` and ``sleep`` are the clock (seconds) and the wait, injectable."""

    budget_s: float = 60.0
    base_s: float = 0.05
    cap_s: float = 2.0
    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], object] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.budget_s < 0 or not 0 < self.base_s <= self.cap_s:
            raise ValueError(
                f"patience needs budget >= 0 and 0 < base <= cap, not {self.budget_s}, "
                f"{self.base_s}, {self.cap_s}"
            )

    def outage(self, what: str) -> Outage:
        """The wait of one request, ``what`` naming it in the log."""
        return Outage(self, what, self.now())


@dataclass
class Outage:
    """One request's outage: since when it fails and how many times it was retried."""

    patience: Patience
    what: str
    since: float
    attempts: int = 0

    def delay(self, error: Exception) -> float | None:
        """Seconds to wait before sending again, or None: the budget is spent."""
        patience = self.patience
        left = self.since + patience.budget_s - patience.now()
        if left <= 0:
            log.warning("%s: gave up after %.1f s: %s", self.what, patience.budget_s, error)
            return None
        self.attempts += 1
        ceiling = min(patience.cap_s, patience.base_s * 2 ** min(self.attempts - 1, 62))
        wait = ceiling / 2 + patience.rng.random() * ceiling / 2
        if isinstance(error, ApiError):
            wait = max(wait, float(error.detail.get("retry_after_s", 0) or 0))
        if self.attempts == 1:
            log.warning("%s: %s; retrying for up to %.1f s", self.what, error, left)
        return min(wait, left)
