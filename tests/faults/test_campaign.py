"""The fault campaign (docs/faults.md): a seeded run over real processes passes every
checker, and each checker fails on a violation planted in what that run observed, so
the campaign cannot pass vacuously."""

from __future__ import annotations

import copy
import itertools
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from waymark.cli import app
from waymark.faults import FaultKind, checkers, make_schedule, report, run_campaign, spark
from waymark.faults.campaign import COPIES, SOURCE, TTL, CampaignResult
from waymark.faults.checkers import Gap

pytestmark = pytest.mark.timeout(300)

# The 60 s: this module's xdist group runs beside the Spark groups, each longer
# (docs/faults.md, "In the test suite"). Every kind: the full disk is left out by the
# campaign itself where a tmpfs cannot be mounted (no root), S3's pause without --s3.
SECONDS = 60.0
# A seed whose schedule, with the full disk or without, has each of these while the
# pipeline runs (its source sends for 36 s): each fires and is lifted in the suite.
SEED = 2581
FIRED = {FaultKind.EDGE_PAUSE, FaultKind.PIPELINE_KILL, FaultKind.PIPELINE_PAUSE,
         FaultKind.NATS_KILL, FaultKind.NATS_PAUSE}  # fmt: skip


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CampaignResult]:
    yield run_campaign(SECONDS, SEED, tmp_path_factory.mktemp("campaign"))


def test_a_seeded_campaign_passes_every_checker_and_each_fails_on_a_planted_violation(
    campaign: CampaignResult, tmp_path: Path
) -> None:
    # Each failed verdict with its summary and examples (the whole list's repr is cut).
    assert [(v.name, v.summary, v.examples) for v in campaign.verdicts if not v.ok] == []
    assert len(campaign.applied) >= 2
    assert all(a.recovered_s is not None for a in campaign.applied), campaign.applied
    # Each of these fired (none found its process exited), was lifted, and recovered.
    fired = {a.fault.kind for a in campaign.applied if not a.noop and a.lifted_s > a.injected_s}
    assert fired >= FIRED, campaign.applied
    obs = campaign.observations
    assert len(obs.acked) > 100 and len(obs.bucket) > 0
    page = report.write(campaign, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["ok"] and data["seed"] == SEED
    assert obs.events > 0 and len(obs.sink) == obs.events  # the pipeline ran, and finished
    # The runner killed mid-run was run again on its store, and that run finished.
    assert obs.pipeline_exits[0] == -signal.SIGKILL and obs.pipeline_exits[-1] == 0
    assert sum(k["count"] for k in data["per_kind"].values()) == len(campaign.applied)
    html = page.read_text()
    assert html.count("<svg") == 3 and "<script" not in html
    assert all(f["kind"] in html for f in data["schedule"])
    # In the same test, not another: ./run test's workers do not keep a module's tests
    # together (xdist_group), and a second test would run a second campaign.
    each_checker_fails_on_a_violation_planted_in(campaign)


def each_checker_fails_on_a_violation_planted_in(campaign: CampaignResult) -> None:
    obs = copy.deepcopy(campaign.observations)
    one = next(iter(obs.acked))
    read = dict(obs.read)
    del read[one]  # an acknowledged record the reader did not get back
    assert not checkers.acknowledged_lost(obs.acked, read, SOURCE).ok
    moved = {**obs.read, one: obs.read[one] + 1}  # read back, at another seq
    assert not checkers.acknowledged_lost(obs.acked, moved, SOURCE).ok
    # A retry stored a second time (its id read twice), which reading back at the
    # acknowledged seq cannot see.
    assert checkers.stored_once(obs.ids).ok
    assert len(obs.ids[SOURCE]) >= len(obs.acked) and obs.ids[TTL]  # it read both topics
    assert not checkers.stored_once({**obs.ids, SOURCE: [*obs.ids[SOURCE], one]}).ok
    copied = dict(obs.copied)
    del copied[one]
    assert not checkers.forwarded(obs.acked, copied, "copy").ok
    silent = [*obs.gaps, Gap(COPIES, 1, 2, None)]
    assert not checkers.gaps_announced(silent, allowed_topics=[COPIES]).ok
    on_fsync = [*obs.gaps, Gap(SOURCE, 1, 2, "lost")]
    assert not checkers.gaps_announced(on_fsync, allowed_topics=[COPIES]).ok
    # nats-server SIGKILLed: an acknowledged write gone from the bucket, or the key at an
    # older revision than the writer was told.
    assert checkers.nats_writes_kept(obs.nats_written, obs.bucket).ok
    key, (value, rev) = next(iter(obs.nats_written.items()))
    without = {k: v for k, v in obs.bucket.items() if k != key}
    assert not checkers.nats_writes_kept(obs.nats_written, without).ok
    behind = {**obs.bucket, key: (value, rev - 1)}
    assert not checkers.nats_writes_kept(obs.nats_written, behind).ok
    key = next(iter(obs.fold))
    value, rev = obs.fold[key]
    assert not checkers.fold_equals_bucket({**obs.fold, key: (value, rev - 1)}, obs.bucket).ok
    assert not checkers.fold_equals_bucket({**obs.fold, "k.extra": (b"x", 1)}, obs.bucket).ok
    # A revision skipped mid-run: on a cycled key the next write hides it by the end, on
    # a key written once it stays missing.
    once = [k for k in obs.bucket if k.startswith("once.")]
    assert once
    skipped = {k: v for k, v in obs.fold.items() if k != once[len(once) // 2]}
    assert not checkers.fold_equals_bucket(skipped, obs.bucket).ok
    t, rank = obs.pointer[-1]
    assert not checkers.pointer_monotonic([*obs.pointer, (t + 1, rank - 1)]).ok
    # A pointer that never moved checked nothing: that is a failure, not a pass.
    assert not checkers.pointer_monotonic([(0.0, rank), (1.0, rank)]).ok
    # The consumer was stopped before the end: some keys' newest changes were never
    # receipted, and the recovery query named them; one left unnamed is caught.
    unreceipted = [k for k, v in obs.newest.items() if obs.receipted.get(k, 0) < v]
    assert unreceipted
    missed = {k: v for k, v in obs.missed.items() if k != unreceipted[0]}
    assert not checkers.recovery_covers(obs.newest, obs.receipted, missed).ok
    older = {**obs.missed, unreceipted[0]: obs.receipted.get(unreceipted[0], 0)}
    assert not checkers.recovery_covers(obs.newest, obs.receipted, older).ok
    lost = ['{"lost": [1, 2], "reason": "expired"}']
    assert not checkers.recovery_covers(obs.newest, obs.receipted, obs.missed, lost).ok
    # The expiring topic: a record gone without a tombstone; a timestamp going back.
    kept = next(rid for rid in obs.ttl_read if rid in obs.ttl_acked)
    assert checkers.expired_announced(obs.ttl_acked, obs.ttl_read, obs.ttl_gaps, TTL).ok
    silent = {rid: seq for rid, seq in obs.ttl_read.items() if rid != kept}
    assert not checkers.expired_announced(obs.ttl_acked, silent, obs.ttl_gaps, TTL).ok
    seq, ts = max(obs.stamps[SOURCE])
    back = {**obs.stamps, SOURCE: [*obs.stamps[SOURCE], (seq + 1, ts - 1)]}
    assert not checkers.timestamps_monotonic(back).ok
    # The queue: a job the worker never acknowledged, or one left in the queue.
    assert checkers.queue_done(obs.jobs, obs.delivered, obs.done, obs.remaining).ok
    job = next(iter(obs.jobs))
    assert not checkers.queue_done(obs.jobs, obs.delivered, obs.done - {job}, []).ok
    assert not checkers.queue_done(obs.jobs, obs.delivered, obs.done, [job]).ok
    # The pipeline: an event missing at the sink, one delivered twice, one it never
    # sent, a pipeline that did not finish (still running, or failed), or a runner run
    # again after it had finished by itself.
    sink, exits, relocs = dict(obs.sink), obs.pipeline_exits, obs.relocations
    assert checkers.pipeline_exactly_once(obs.events, sink, exits, relocs).ok
    del sink[obs.events - 1]
    assert not checkers.pipeline_exactly_once(obs.events, sink, exits, relocs).ok
    twice = {**obs.sink, 0: 2}
    assert not checkers.pipeline_exactly_once(obs.events, twice, exits, relocs).ok
    unknown = {**obs.sink, obs.events: 1}
    assert not checkers.pipeline_exactly_once(obs.events, unknown, exits, relocs).ok
    for ended in ([*exits[:-1], None], [*exits[:-1], 1], [0, *exits]):
        assert not checkers.pipeline_exactly_once(obs.events, obs.sink, ended, relocs).ok
    # A fault never followed by progress of what it hit.
    done = [(str(a.fault.kind), a.injected_s, a.recovered_s) for a in campaign.applied]
    assert checkers.faults_recovered(done, 0).ok
    kind, at, _ = done[-1]
    assert not checkers.faults_recovered([*done[:-1], (kind, at, None)], 0).ok


def test_the_schedule_is_seeded_and_leaves_time_to_settle() -> None:
    a = make_schedule(3, 600.0)
    assert a == make_schedule(3, 600.0) and a != make_schedule(4, 600.0)
    assert {f.kind for f in a} == set(FaultKind) == set(report.COLOURS)
    assert {f.jump_ms > 0 for f in a if f.kind is FaultKind.CLOCK_JUMP} == {True}
    assert all(f.at_s + f.duration_s <= 600.0 - 8.0 for f in a)
    assert all(x.at_s + x.duration_s < y.at_s for x, y in itertools.pairwise(a))


def test_an_unknown_fault_kind_is_refused_before_anything_starts() -> None:
    result = CliRunner().invoke(app, ["faults", "run", "--kind", "meteor"])
    assert result.exit_code == 2 and "meteor" in result.output
    # A kind whose part is not in the flow: said at once, not an empty schedule's crash.
    result = CliRunner().invoke(app, ["faults", "run", "--kind", "spark-kill"])
    assert result.exit_code == 2 and "spark-kill needs --spark" in result.output


def test_the_spark_checkers_pass_once_each_and_fail_on_a_replay_counted_twice() -> None:
    """The ``--spark`` checkers (docs/faults.md, "Checkers"): the suite's campaign runs
    without Spark (its JVM costs more than the suite's budget), so their violations are
    planted in observations shaped as a Spark campaign's."""
    read = {"p0-0": 1, "p0-1": 2, "p1-16": 3, "p1-17": 4, "p0-2": 5}  # record id -> seq
    expected = spark.expected(read)
    assert expected == {"u0": 2, "u1": 2, "u2": 1}
    rows = [(0, "u0", 1), (0, "u1", 1), (1, "u0", 1), (1, "u1", 1), (1, "u2", 1)]
    assert checkers.spark_exactly_once(expected, rows, 0).ok
    assert checkers.spark_fold_equals(expected, {"u0": 2, "u1": 2, "u2": 1}).ok
    # A batch replayed after a driver kill and published again.
    assert not checkers.spark_exactly_once(expected, [*rows, (1, "u2", 1)], 1).ok
    # A batch the sink never published (its records counted nowhere).
    assert not checkers.spark_exactly_once(expected, rows[:2], 1).ok
    # Nothing published at all is a failure, not a vacuous pass.
    assert not checkers.spark_exactly_once(expected, [], 0).ok
    # The fold sink: a replayed batch added twice, a user missing, one it never saw.
    assert not checkers.spark_fold_equals(expected, {"u0": 3, "u1": 2, "u2": 1}).ok
    assert not checkers.spark_fold_equals(expected, {"u0": 2, "u1": 2}).ok
    assert not checkers.spark_fold_equals(expected, {**expected, "u9": 1}).ok


def test_a_spark_kill_is_aimed_inside_a_planned_micro_batch(tmp_path: Path) -> None:
    """A ``spark-kill`` waits for a micro-batch in flight: planned in the checkpoint's
    ``offsets/`` (Spark's file per batch id, beside its ``.N.crc`` and temporary files)
    and not yet in ``commits/``, which the restarted query replays."""
    checkpoint = tmp_path / "spark-checkpoint"
    assert spark.in_flight(tmp_path) is None  # no checkpoint yet: the driver starting
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    for name in ("0", ".0.crc", "1", ".1.crc", ".2.3f1c.tmp"):
        (checkpoint / "offsets" / name).write_text("v1")
    (checkpoint / "commits" / "0").write_text("v1")
    assert spark.in_flight(tmp_path) == 1
    assert spark.aim_inside_batch(tmp_path, 0) == 1
    # Planned by an earlier driver: the one started since replays it, a kill now would
    # not land in a batch this driver is running.
    planned_at = (checkpoint / "offsets" / "1").stat().st_mtime
    assert spark.in_flight(tmp_path, since=planned_at + 1) is None
    (checkpoint / "commits" / "1").write_text("v1")
    assert spark.in_flight(tmp_path) is None  # between batches: nothing to replay
    assert spark.aim_inside_batch(tmp_path, 0.05) is None
    summary = checkers.spark_exactly_once({"u0": 1}, [(0, "u0", 1)], 1, 1).summary
    assert "1 kill(s) inside a micro-batch" in summary


def test_every_other_spark_kill_waits_for_the_batch_to_be_published(tmp_path: Path) -> None:
    """A kill inside a batch but before its sink published leaves nothing for the
    exactly-once sink to refuse on the replay: every other ``spark-kill`` waits on until
    the sink's topic head moved (the rows are out, Spark has not committed), and the
    job's log counts the replays the sinks met as already taken (docs/faults.md)."""
    checkpoint = tmp_path / "spark-checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    (checkpoint / "offsets" / "4").write_text("v1")
    heads = iter([10, 10, 10, 12])  # the publish lands at the fourth look
    assert spark.aim_after_publish(tmp_path, lambda: next(heads), 5.0) == 4
    assert next(heads, None) is None  # it waited for the publish, no longer
    # Spark committed the batch before its rows showed (a batch with no rows, or the
    # window missed): no wait past the commit, and the kill is not inside a batch.
    (checkpoint / "commits" / "4").write_text("v1")
    (checkpoint / "offsets" / "5").write_text("v1")
    looks = []

    def committing() -> int:
        looks.append(1)
        if len(looks) == 2:
            (checkpoint / "commits" / "5").write_text("v1")
        return 10

    assert spark.aim_after_publish(tmp_path, committing, 5.0) is None
    assert len(looks) == 2
    (checkpoint / "offsets" / "6").write_text("v1")
    (checkpoint / "commits" / "6").write_text("v1")
    assert spark.replays(tmp_path) == 0
    (tmp_path / "spark.log").write_text(
        "--- start 2: ...\n"
        '{"event": "batch", "batch": 4, "seq": 9, "steps": {"topic_replayed": true, '
        '"fold_skipped": true}}\n'
        '{"event": "batch", "batch": 5, "seq": 12, "steps": {"topic_replayed": false, '
        '"fold_skipped": false}}\n'
    )
    assert spark.replays(tmp_path) == 1
    summary = checkers.spark_exactly_once({"u0": 1}, [(0, "u0", 1)], 1, 1, 1).summary
    assert "1 replayed batch(es) the sinks had already taken" in summary
