"""``waymark demo`` end to end at small scale: a real server, a real Spark driver
SIGKILLed mid-run and restarted from its checkpoint, verified against the truth."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from waymark.cli.demo import OUTPUT_TOPIC, Truth, user_name, verify_fold, verify_rows

WAYMARK = str(Path(sys.executable).parent / "waymark")


def test_demo_kills_the_driver_and_verifies_exactly_once(tmp_path: Path) -> None:
    # 3 micro-batches of <= 8000: the kill lands in batch 1, batch 1 replays on restart.
    args = [WAYMARK, "demo", "--events", "20000", "--users", "300", "--max-per-trigger", "8000",
            "--kill-at", "0.3", "--work-dir", str(tmp_path)]  # fmt: skip
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "SIGKILL the driver" in out and "during batch 1" in out
    assert out.count("exactly once") == 2 and "records lost = 0, duplicated = 0" in out
    # The restarted driver ran from the killed run's checkpoint: one query, batches 0..2.
    assert sorted(p.name for p in (tmp_path / "checkpoint" / "commits").glob("[0-9]")) == [
        "0",
        "1",
        "2",
    ]


def test_demo_verifier_counts_lost_and_duplicated_events() -> None:
    """The checks the demo prints catch what they claim to (no Spark needed)."""
    truth = Truth(events=np.array([3, 1]), purchases=np.array([1, 0]), cents=np.array([500, 0]))
    u0, u1 = user_name(0), user_name(1)
    rows = [
        {"batch": 0, "user": u0, "events": 2, "purchases": 1, "cents": 500},
        {"batch": 1, "user": u0, "events": 1, "purchases": 0, "cents": 0},
        {"batch": 1, "user": u1, "events": 1, "purchases": 0, "cents": 0},
    ]
    assert verify_rows(truth, rows).ok
    replayed = verify_rows(truth, [*rows, rows[1]])  # a batch's row published twice
    assert (replayed.lost, replayed.duplicated, replayed.ok) == (0, 1, False)
    assert replayed.problems == [f"batch 1 user {u0} appears twice"]
    lost = verify_rows(truth, rows[:2])
    assert (lost.lost, lost.duplicated, lost.counted) == (1, 0, 3)
    assert OUTPUT_TOPIC in lost.name
    fold = {u0: {"events": 3, "purchases": 1, "cents": 500}, u1: {"events": 2, "purchases": 0,
                                                                  "cents": 0}}  # fmt: skip
    doubled = verify_fold(truth, fold)
    assert (doubled.lost, doubled.duplicated, doubled.users_wrong) == (0, 1, 0)
    wrong_cents = verify_fold(truth, {**fold, u1: {"events": 1, "purchases": 0, "cents": 9}})
    assert wrong_cents.users_wrong == 1 and not wrong_cents.ok
