"""The checkers a campaign ends with, each a verdict with its evidence
(docs/faults.md, "Checkers").

They take plain observations (what producers were told, what a reader saw, what a
fold holds), not live connections, so a test can hand them a planted violation and
see them fail: a checker that cannot fail proves nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from signal import SIGKILL
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


NOTHING = " (nothing to check: a checker that checked nothing fails)"


def _checked(
    name: str,
    ok: bool,
    summary: str,
    examples: list[Any],
    *,
    checked: bool,
    nothing: str = NOTHING,
) -> CheckResult:
    """A checker's verdict: it passes only if it ``checked`` something (a checker fed
    nothing would pass whatever happened) and found nothing wrong."""
    return CheckResult(name, ok and checked, summary + ("" if checked else nothing), examples)


def acknowledged_lost(acked: Mapping[str, int], read: Mapping[str, int], topic: str) -> CheckResult:
    """Every record a producer was told is stored (id -> seq) is read back at that seq."""
    lost = [(rid, seq) for rid, seq in acked.items() if read.get(rid) != seq]
    return _checked(
        f"acknowledged records lost ({topic})",
        not lost,
        f"{len(lost)} of {len(acked)} acknowledged records not read back at their seq",
        lost[:5],
        checked=bool(acked),
    )


def stored_once(ids: Mapping[str, Sequence[str]]) -> CheckResult:
    """Per topic, no record id is read back twice: a producer's retry of a write whose
    answer it never got carries the same id, and the server answers the original seq
    rather than storing it again (docs/semantics/topics.md §4.1). ``ids``: topic -> the
    id of every record read, in seq order. (Reading back at the acknowledged seq, the
    check above, cannot see a second copy: it looks up one seq per id.)"""
    twice = [
        (topic, rid, n) for topic, seen in ids.items()
        for rid, n in Counter(seen).items() if n > 1
    ]  # fmt: skip
    n = sum(len(seen) for seen in ids.values())
    return _checked(
        "each record stored once (idempotent ids)",
        not twice,
        f"{len(twice)} id(s) stored more than once among {n} records of {len(ids)} topic(s)",
        twice[:5],
        checked=n > 0,
    )


def forwarded(acked: Iterable[str], copies: Mapping[str, int], router: str) -> CheckResult:
    """A router forwards every acknowledged source record at least once."""
    acked = list(acked)
    missing = [rid for rid in acked if copies.get(rid, 0) < 1]
    extra = sum(n - 1 for n in copies.values() if n > 1)
    return _checked(
        f"router {router} forwarded every acknowledged record",
        not missing,
        f"{len(missing)} missing from the destination; {extra} duplicate copies "
        "(allowed: at least once)",
        missing[:5],
        checked=bool(acked),
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
    return _checked(
        "the fold equals its bucket",
        not differ,
        f"{len(differ)} key(s) differ of {len(bucket)} in the bucket",
        differ[:5],
        checked=bool(bucket),
    )


def pointer_monotonic(observed: Sequence[tuple[float, int]]) -> CheckResult:
    """The artifact pointer's cursor, sampled over the run, never moved backwards."""
    back = [(t, before, now) for (_, before), (t, now) in pairwise(observed) if now < before]
    moves = sum(1 for (_, a), (_, b) in pairwise(observed) if b > a)
    return _checked(
        "the replica pointer never moved backwards",
        not back,
        f"{len(observed)} samples, {moves} moves forward, {len(back)} backwards",
        back[:5],
        checked=moves > 0,
        nothing=" (it never moved: nothing was checked)",
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
    # No change left unreceipted leaves the query nothing to name: it checked nothing
    # (the campaign stops its consumer before the end so that some are).
    return _checked(
        "`recovery missed` covers every change not receipted",
        not not_named and not window_lost,
        f"{unreceipted} of {len(newest)} keys with a change not receipted, "
        f"{len(not_named)} of them not named; {len(missed)} named; "
        f"{len(window_lost)} window loss(es)",
        [*not_named[:5], *window_lost[:2]],
        checked=unreceipted > 0,
    )


def pipeline_exactly_once(
    events: int, counts: Mapping[int, int], exits: Sequence[int | None], relocations: int
) -> CheckResult:
    """Every event ``0 .. events - 1`` of the relocatable pipeline is at its sink exactly
    once, none else, and the pipeline finished. ``exits``: each runner's exit status in
    order, None for one still running at the check; the last must have finished (0) and
    every earlier one must have been SIGKILLed (a runner that finished, or failed, was
    never run again: its run must count as it ended). (How often its edges moved and the
    runner was run again are evidence, not conditions: the schedule decides.)"""
    missing = [n for n in range(events) if counts.get(n, 0) == 0]
    twice = [n for n, c in counts.items() if c > 1]
    unknown = [n for n in counts if not 0 <= n < events]
    finished = bool(exits) and exits[-1] == 0
    rerun = [(i, code) for i, code in enumerate(exits[:-1]) if code != -SIGKILL]
    return _checked(
        "every pipeline event exactly once at the sink",
        finished and not missing and not twice and not unknown and not rerun,
        f"{len(missing)} of {events} events missing, {len(twice)} more than once, "
        f"{len(unknown)} unknown; the pipeline {'finished' if finished else 'did not finish'} "
        f"(exit status {exits[-1] if exits else None}) after {len(exits)} run(s), "
        f"{len(rerun)} run again after exiting by itself; {relocations} edge relocation(s)",
        [("missing", n) for n in missing[:3]]
        + [("twice", n) for n in twice[:3]]
        + [("unknown", n) for n in unknown[:3]]
        + [("rerun", i, code) for i, code in rerun[:3]],
        checked=events > 0,
    )


def nats_writes_kept(
    written: Mapping[str, tuple[bytes, int]], bucket: Mapping[str, tuple[bytes, int]]
) -> CheckResult:
    """Every NATS write acknowledged to the writer (its last per key: the writer is the
    bucket's only one) is in the bucket at the end: the key at that revision with that
    value, or at a later revision (a write whose answer was lost, tried again). A
    nats-server SIGKILLed keeps what it acknowledged: the page cache outlives it."""

    def kept(key: str, value: bytes, rev: int) -> bool:
        got_value, got_rev = bucket.get(key, (b"", 0))
        return got_rev > rev or (got_rev == rev and got_value == value)

    lost = sorted(key for key, (value, rev) in written.items() if not kept(key, value, rev))
    return _checked(
        "acknowledged NATS writes kept",
        not lost,
        f"{len(lost)} of {len(written)} keys' last acknowledged write missing from the bucket",
        [(key, written[key][1], bucket.get(key, (b"", None))[1]) for key in lost[:5]],
        checked=bool(written),
    )


def faults_recovered(
    recovered: Sequence[tuple[str, float, float | None]], noops: int
) -> CheckResult:
    """Every fault that did something (``(kind, injected_s, seconds to recover)``) was
    followed by progress of the part it hit: the campaign waited for it at the end
    (docs/faults.md, "Checkers"), so None means it never came back. ``noops``: faults
    that found their target exited (a pipeline runner that had finished)."""
    never = [(kind, round(at, 2)) for kind, at, after in recovered if after is None]
    return _checked(
        "every fault recovered",
        not never,
        f"{len(never)} of {len(recovered)} fault(s) never followed by progress; "
        f"{noops} found their target exited (nothing to do)",
        never[:5],
        checked=bool(recovered),
    )


def expired_announced(
    acked: Mapping[str, int], read: Mapping[str, int], gaps: Sequence[Gap], topic: str
) -> CheckResult:
    """On a topic whose records expire (a TTL, moved by clock jumps): every acknowledged
    record is read back at its seq or lies in a gap a tombstone announced; none is
    skipped silently."""
    covered = sorted((g.gap_from, g.gap_to) for g in gaps if g.topic == topic)

    def announced(seq: int) -> bool:
        return any(lo <= seq <= hi for lo, hi in covered)

    silent = [(rid, seq) for rid, seq in acked.items()
              if read.get(rid) != seq and not announced(seq)]  # fmt: skip
    gone = sum(1 for rid, seq in acked.items() if read.get(rid) != seq)
    return _checked(
        f"every expired record announced ({topic})",
        not silent,
        f"{len(silent)} of {len(acked)} acknowledged records gone without a tombstone; "
        f"{gone} gone in all, {len(covered)} tombstone(s)",
        silent[:5],
        checked=bool(acked),
    )


def timestamps_monotonic(stamps: Mapping[str, Sequence[tuple[int, int]]]) -> CheckResult:
    """Per topic, record timestamps (``$ts``) never decrease along seqs, even where the
    server's clock jumped back (docs/topics.md, "What it guarantees")."""
    back = [
        (topic, a, b)
        for topic, pairs in stamps.items()
        for a, b in pairwise(sorted(pairs))
        if b[1] < a[1]
    ]
    n = sum(len(p) for p in stamps.values())
    return _checked(
        "record timestamps never decrease along seqs",
        not back,
        f"{len(back)} decrease(s) among {n} records of {len(stamps)} topic(s)",
        back[:5],
        checked=n > 1,
    )


def queue_done(
    jobs: Iterable[str],
    delivered: Mapping[str, int],
    done: Iterable[str],
    remaining: Sequence[str],
    drain_s: float | None = None,
) -> CheckResult:
    """Every job put into the queue was given to the worker and acknowledged by it at
    least once (at least once: leases a clock jump or a crash took back give a job
    again), and none is left in the queue at the end. (``drain_s``, how long the queue
    took to drain once the check began, is evidence, not a condition.)"""
    acked = set(done)
    jobs = list(jobs)
    never = [rid for rid in jobs if rid not in acked]
    again = sum(n - 1 for n in delivered.values() if n > 1)
    return _checked(
        "every queued job processed",
        not never and not remaining,
        f"{len(never)} job(s) never processed, {len(remaining)} left in the queue; "
        f"{again} delivered again (allowed: at least once)"
        + ("" if drain_s is None else f"; the queue drained {drain_s:.1f} s into the check"),
        [("never", rid) for rid in never[:3]] + [("left", rid) for rid in remaining[:3]],
        checked=bool(jobs),
    )


def spark_exactly_once(
    expected: Mapping[str, int],
    rows: Sequence[tuple[int, str, int]],
    restarts: int,
    kills_inside: int = 0,
    replays: int = 0,
) -> CheckResult:
    """The Spark query's exactly-once topic sink: no micro-batch's row for a user is
    published twice, and per user the published deltas add up to the records of that
    user in the input — each input record counted once, however often the driver died
    and replayed a batch. (Its restarts, the kills that landed inside a micro-batch, and
    the replays its sinks met as already taken — the path that keeps a replay from
    publishing twice — are evidence, not a condition: the schedule decides.)"""
    seen: dict[tuple[int, str], int] = {}
    for batch, user, _ in rows:
        seen[batch, user] = seen.get((batch, user), 0) + 1
    twice = [key for key, n in seen.items() if n > 1]
    sums: dict[str, int] = {}
    for _, user, events in rows:
        sums[user] = sums.get(user, 0) + events
    off = sorted(u for u in expected.keys() | sums.keys() if sums.get(u, 0) != expected.get(u, 0))
    return _checked(
        "duplicates at the Spark exactly-once sink",
        not twice and not off,
        f"{len(rows)} rows over {len({b for b, _, _ in rows})} batches; {len(twice)} published "
        f"twice; {len(off)} of {len(expected)} users whose deltas do not add up to their "
        f"{sum(expected.values())} input records; {restarts} driver restart(s) after a failure; "
        f"{kills_inside} kill(s) inside a micro-batch; {replays} replayed batch(es) the "
        "sinks had already taken",
        [("twice", list(k)) for k in twice[:3]]
        + [("user", u, sums.get(u, 0), expected.get(u, 0)) for u in off[:3]],
        checked=bool(expected),
    )


def spark_fold_equals(expected: Mapping[str, int], folded: Mapping[str, int]) -> CheckResult:
    """The Spark query's fold sink: each user's total equals that user's records in the
    input (a replayed batch skipped, never added twice)."""
    off = sorted(u for u in expected.keys() | folded.keys() if folded.get(u) != expected.get(u))
    return _checked(
        "the Spark fold sink equals its input",
        not off,
        f"{len(off)} of {len(expected)} users' totals differ from the input",
        [(u, folded.get(u), expected.get(u)) for u in off[:5]],
        checked=bool(expected),
    )
