"""A seeded random schedule of faults (docs/faults.md, "The schedule").

The same seed and length give the same schedule, so a failing campaign can be run
again as it was.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class FaultKind(enum.StrEnum):
    SERVER_KILL = "server-kill"  # SIGKILL `waymark serve`, start it again on its data dir
    SERVER_PAUSE = "server-pause"  # SIGSTOP it for the fault's duration, then SIGCONT
    FOLD_KILL = "fold-kill"  # SIGKILL `waymark fold`, start it again on its store
    FOLD_PAUSE = "fold-pause"  # SIGSTOP / SIGCONT `waymark fold`
    CONSUMER_KILL = "consumer-kill"  # SIGKILL the receipt recovery consumer, start it again
    CONSUMER_PAUSE = "consumer-pause"  # SIGSTOP / SIGCONT it
    NET_CUT = "net-cut"  # the proxy drops every connection and refuses new ones
    NET_LATENCY = "net-latency"  # the proxy delays every chunk it forwards
    S3_PAUSE = "s3-pause"  # SIGSTOP / SIGCONT the S3 endpoint (moto) the fold exports to
    DISK_FULL = "disk-full"  # the server's data directory (a tmpfs) filled up, then freed
    EDGE_KILL = "edge-kill"  # SIGKILL the pipeline's second edge server, start it again
    CLOCK_JUMP = "clock-jump"  # the injected clocks jump ahead, and back at the lift
    EDGE_PAUSE = "edge-pause"  # SIGSTOP / SIGCONT the pipeline's second edge server
    PIPELINE_KILL = "pipeline-kill"  # SIGKILL `waymark pipeline run`, run it again on its store
    PIPELINE_PAUSE = "pipeline-pause"  # SIGSTOP / SIGCONT it
    NATS_KILL = "nats-kill"  # SIGKILL nats-server, start it again on its store dir and port
    NATS_PAUSE = "nats-pause"  # SIGSTOP / SIGCONT it
    # With --spark only (last: a campaign without them draws the schedule it always did)
    SPARK_KILL = "spark-kill"  # SIGKILL the Spark driver's process group, restart it
    SPARK_PAUSE = "spark-pause"  # SIGSTOP / SIGCONT it


@dataclass(frozen=True)
class Fault:
    """One fault: injected ``at_s`` seconds into the campaign, lifted ``duration_s`` later
    (a kill's restart comes after its duration: the process stays dead meanwhile)."""

    at_s: float
    kind: FaultKind
    duration_s: float
    latency_ms: int = 0
    jump_ms: int = 0  # a clock jump's size


def make_schedule(
    seed: int,
    seconds: float,
    kinds: tuple[FaultKind, ...] = tuple(FaultKind),
    *,
    gap_s: tuple[float, float] = (2.0, 5.0),
    duration_s: tuple[float, float] = (0.5, 3.0),
    settle_s: float = 8.0,
) -> list[Fault]:
    """Faults one after another (never two at once, so each one's time to recover is its
    own), with a random quiet gap between them; none in the last ``settle_s`` seconds,
    left for the flow to catch up before the checkers run."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    t = rng.uniform(*gap_s)
    while True:
        kind = rng.choice(kinds)
        duration = round(rng.uniform(*duration_s), 2)
        if t + duration > seconds - settle_s:
            return faults
        latency = rng.choice((50, 200, 500)) if kind is FaultKind.NET_LATENCY else 0
        # Within the idempotency window (120 s by default): a retry still finds its id.
        jump = rng.choice((5_000, 20_000, 60_000)) if kind is FaultKind.CLOCK_JUMP else 0
        faults.append(Fault(round(t, 2), kind, duration, latency, jump))
        t += duration + rng.uniform(*gap_s)
