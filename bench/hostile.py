"""Hostile clients against a real ``waymark serve`` over TLS, with the figures issue 25
asks for (docs/security.md, "Hostile clients"): bad inputs tried, load held, faults
survived, acknowledged records lost (must be 0), and /v0/health p99 under each attack
against the idle anchor measured in the same run.

A checker appends to an fsync topic and a prober asks /v0/health from 127.0.0.2 in a
child process throughout; the attacks come from 127.0.1.x one after the other, then the
server is SIGKILLed and restarted ``--kills`` times; every acknowledged record is then
read back. The attacks and the checks are ``tests/hostile.py``, which
``tests/server/test_hostile.py`` runs at a small scale in the normal suite.

Run: ``.venv/bin/python bench/hostile.py [--streams 2000] [--connections 500]``;
``--only append --only SSE --kills 0`` runs those attacks alone.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.hostile
from tests import hostile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=500, help="slow clients per attack")
    parser.add_argument("--streams", type=int, default=2000, help="SSE streams held open")
    parser.add_argument("--examples", type=int, default=300, help="hypothesis bad bodies")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each attack")
    parser.add_argument("--append-mb", type=int, default=50, help="the large legal append")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs at the end")
    parser.add_argument("--only", action="append", default=[],
                        help="run only the attacks whose name contains this (repeatable), "
                        "e.g. --only append --only SSE")  # fmt: skip
    args = parser.parse_args()
    started = time.monotonic()
    chosen = [
        phase
        for phase in hostile.phases(
            connections=args.connections,
            streams=args.streams,
            examples=args.examples,
            seconds=args.seconds,
            append_mb=args.append_mb,
        )
        if not args.only or any(word in phase.name for word in args.only)
    ]
    with tempfile.TemporaryDirectory() as directory:
        report = hostile.run(
            Path(directory),
            chosen,
            idle_s=args.seconds,
            kills=args.kills,
            extra=(
                "--header-timeout-s",
                "2",
                "--body-timeout-s",
                "2",
                "--max-streams",
                str(args.streams + 100),
                "--max-connections",
                str(args.streams + 4 * args.connections + 200),
            ),
        )
    idle = report.p("idle", 0.99)
    table = Table(title=f"hostile clients ({time.monotonic() - started:.0f} s)")
    columns = ("attack", "tried", "cut / refused", "answers", "5xx", "health probes",
               "failed", "p50 ms", "p99 ms", "p99 / idle", "notes")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column in ("attack", "notes") else "right")
    rows = [("idle", None), *report.phases, *[("after restart", None)] * bool(report.kills)]
    for name, tally in rows:
        p99 = report.p(name, 0.99)
        table.add_row(
            name,
            "" if tally is None else str(tally.tried),
            "" if tally is None else str(tally.cut),
            "" if tally is None else " ".join(f"{k}:{v}" for k, v in sorted(tally.answers.items())),
            "" if tally is None else str(tally.server_errors),
            str(len(report.probes.get(name, []))),
            str(report.failed_probes.get(name, 0)),
            f"{report.median(name) * 1000:.1f}",
            f"{p99 * 1000:.1f}",
            f"{p99 / idle:.1f}x",
            "" if tally is None else "; ".join(tally.notes),
        )
    console = Console(width=230)
    console.print(table)
    bad = sum(t.tried for name, t in report.phases if name == "bad bodies")
    faults = sum(1 for _ in report.phases) + report.kills
    console.print(
        f"bad inputs tried: {bad} bodies; slow/flood connections: "
        f"{sum(t.tried for n, t in report.phases if n != 'bad bodies')}\n"
        f"load held: {report.acked} fsync records acknowledged by the checker "
        f"({report.unacked} appends unanswered, during restarts)\n"
        f"faults survived: {faults} ({len(report.phases)} attacks, {report.kills} SIGKILLs)\n"
        f"acknowledged records lost: {len(report.lost)}\n"
        f"server log lines with a warning or traceback: {len(report.log_errors)}"
    )
    if report.lost:
        sys.exit(1)


if __name__ == "__main__":
    main()
