"""The checkers a campaign ends with, each a verdict with its evidence
(docs/faults.md, "Checkers").

They take plain observations (what producers were told, what a reader saw, what a
fold holds), not live connections, so a test can hand them a planted violation and
see them fail: a checker that cannot fail proves nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    summary: str
    examples: list[Any] = field(default_factory=list)  # a few offending items, for the report

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "summary": self.summary,
                "examples": self.examples}  # fmt: skip


@dataclass(frozen=True)
class Gap:
    """A tombstone a reader met: ``[gap_from, gap_to]`` of ``topic``, with its reason."""

    topic: str
    gap_from: int
    gap_to: int
    reason: str | None


def acknowledged_lost(acked: Mapping[str, int], read: Mapping[str, int], topic: str) -> CheckResult:
    """Every record a producer was told is stored (id -> seq) is read back at that seq."""
    lost = [(rid, seq) for rid, seq in acked.items() if read.get(rid) != seq]
    return CheckResult(
        f"acknowledged records lost ({topic})",
        not lost,
        f"{len(lost)} of {len(acked)} acknowledged records not read back at their seq",
        lost[:5],
    )


def forwarded(acked: Iterable[str], copies: Mapping[str, int], router: str) -> CheckResult:
    """A router forwards every acknowledged source record at least once."""
    missing = [rid for rid in acked if copies.get(rid, 0) < 1]
    extra = sum(n - 1 for n in copies.values() if n > 1)
    return CheckResult(
        f"router {router} forwarded every acknowledged record",
        not missing,
        f"{len(missing)} missing from the destination; {extra} duplicate copies "
        "(allowed: at least once)",
        missing[:5],
    )


def gaps_announced(gaps: Sequence[Gap], allowed_topics: Iterable[str] = ()) -> CheckResult:
    """Every gap a reader met came as a tombstone with a reason, and none on a topic
    where no loss is allowed (an ``fsync`` topic loses nothing it acknowledged)."""
    bad = [g for g in gaps if not g.reason or g.topic not in set(allowed_topics)]
    return CheckResult(
        "every gap announced with its reason",
        not bad,
        f"{len(gaps)} tombstone(s) met, {len(bad)} without a reason or where none is allowed",
        [g.__dict__ for g in bad[:5]],
    )


def fold_equals_bucket(
    fold: Mapping[str, tuple[bytes, int]], bucket: Mapping[str, tuple[bytes, int]]
) -> CheckResult:
    """The fold holds each key of the bucket at the bucket's value and revision."""
    differ = sorted(k for k in fold.keys() | bucket.keys() if fold.get(k) != bucket.get(k))
    return CheckResult(
        "the fold equals its bucket",
        not differ,
        f"{len(differ)} key(s) differ of {len(bucket)} in the bucket",
        differ[:5],
    )


def pointer_monotonic(observed: Sequence[tuple[float, int]]) -> CheckResult:
    """The artifact pointer's cursor, sampled over the run, never moved backwards."""
    back = [(t, before, now) for (_, before), (t, now) in pairwise(observed) if now < before]
    moves = sum(1 for (_, a), (_, b) in pairwise(observed) if b > a)
    return CheckResult(
        "the replica pointer never moved backwards",
        not back and moves > 0,
        f"{len(observed)} samples, {moves} moves forward, {len(back)} backwards"
        + ("" if moves else " (it never moved: nothing was checked)"),
        back[:5],
    )


def recovery_covers(
    newest: Mapping[str, int],
    receipted: Mapping[str, int],
    missed: Mapping[str, int],
    window_lost: Sequence[str] = (),
) -> CheckResult:
    """``recovery missed`` names every key whose newest committed version the consumer
    never processed (so never receipted), at that version or later; and no window
    loss was reported (docs/recovery.md, "What it guarantees")."""
    not_named = [
        (key, v) for key, v in newest.items()
        if receipted.get(key, 0) < v and missed.get(key, 0) < v
    ]  # fmt: skip
    unreceipted = sum(1 for key, v in newest.items() if receipted.get(key, 0) < v)
    return CheckResult(
        "`recovery missed` covers every change not receipted",
        not not_named and not window_lost,
        f"{unreceipted} of {len(newest)} keys with a change not receipted, "
        f"{len(not_named)} of them not named; {len(missed)} named; "
        f"{len(window_lost)} window loss(es)",
        [*not_named[:5], *window_lost[:2]],
    )
