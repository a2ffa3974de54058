"""Effective priority (docs/semantics/topics.md §3), in integer arithmetic with a 64-entry table
for 2^-x."""

from __future__ import annotations

W_MANUAL = 1
W_AUTO = 1
W_AGE = 1
PRIORITY_BOUND = 1000
AUTO_MAX = 500
HALF_LIFE_MS = 30_000
AUTO_FLOOR_MS = 300_000
AGE_RATE_PER_S = 100
AGE_CAP_MS = 10_000

_FRACTION_BITS = 16
# _POW2_NEG[i] = 2^(-i/64) in 16-bit fixed point.
_POW2_NEG = [round(2 ** (-i / 64) * (1 << _FRACTION_BITS)) for i in range(64)]


def auto_recency(now: int, last_consumed_at: int) -> int:
    """AUTO_MAX * 2^(-(now - last_consumed_at) / HALF_LIFE_MS), 0 past AUTO_FLOOR_MS."""
    if last_consumed_at <= 0:
        return 0
    idle = max(0, now - last_consumed_at)
    if idle >= AUTO_FLOOR_MS:
        return 0
    sixty_fourths = idle * 64 // HALF_LIFE_MS  # idle in 1/64ths of a half-life
    whole, frac = divmod(sixty_fourths, 64)
    scaled = (AUTO_MAX * _POW2_NEG[frac] + (1 << (_FRACTION_BITS - 1))) >> _FRACTION_BITS
    return scaled >> whole


def age_boost(now: int, enqueued_at: int) -> int:
    """+AGE_RATE per second a topic's unconsumed data has waited, capped at AGE_CAP_MS."""
    if enqueued_at <= 0:
        return 0
    return AGE_RATE_PER_S * min(max(0, now - enqueued_at), AGE_CAP_MS) // 1000


def effective_priority(
    priority: int | None, auto: bool, now: int, last_consumed_at: int, enqueued_at: int
) -> int:
    manual = max(-PRIORITY_BOUND, min(PRIORITY_BOUND, priority or 0))
    recency = auto_recency(now, last_consumed_at) if auto else 0
    return W_MANUAL * manual + W_AUTO * recency + W_AGE * age_boost(now, enqueued_at)
