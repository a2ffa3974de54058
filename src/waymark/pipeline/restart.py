"""When a failed stage starts again, and when the pipeline gives up instead
(docs/semantics/pipeline.md §9): exponential backoff with jitter between restarts,
and a failure-rate limit, like Flink's failure-rate restart strategy and a
Kubernetes crash-loop backoff."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from waymark.clock import Backoff


@dataclass(frozen=True)
class RestartPolicy:
    """``delay_s`` before the first restart, doubling per consecutive failure up to
    ``max_delay_s`` (each wait between half and all of that, the jitter); more than
    ``max_restarts`` restarts of one stage within ``window_s`` stop the pipeline; a
    stage function failing ``max_attempts`` times on one event dead-letters it."""

    delay_s: float = 0.5
    max_delay_s: float = 30.0
    max_restarts: int = 10
    window_s: float = 60.0
    max_attempts: int = 3

    def __post_init__(self) -> None:
        Backoff(self.delay_s, self.max_delay_s)  # 0 < delay_s <= max_delay_s
        if self.max_restarts < 0 or self.window_s <= 0 or self.max_attempts < 1:
            raise ValueError(f"not a restart policy: {self}")


class Restarts:
    """One stage's failures on an injected clock: the wait before each restart, or
    None once the failure-rate limit is passed."""

    def __init__(self, policy: RestartPolicy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.backoff = Backoff(policy.delay_s, policy.max_delay_s)
        self.rng = rng or random.Random()
        self.times: deque[int] = deque()  # failures within the window, oldest first
        self.consecutive = 0  # failures since the last successful step

    def failed(self, now_ms: int) -> float | None:
        """A failure at ``now_ms``: the seconds to wait before starting again, or None
        when it is more than ``max_restarts`` within ``window_s``."""
        window_ms = self.policy.window_s * 1000
        while self.times and now_ms - self.times[0] >= window_ms:
            self.times.popleft()
        self.times.append(now_ms)
        if len(self.times) > self.policy.max_restarts:
            return None
        self.consecutive += 1
        return self.backoff.delay(self.consecutive, self.rng)

    def succeeded(self) -> None:
        """A step went through: the next failure waits the first delay again."""
        self.consecutive = 0
