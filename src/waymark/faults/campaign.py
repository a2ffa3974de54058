"""One fault campaign: start the data flow, run the schedule, check, report
(docs/faults.md).

The flow: producers append with ``fsync`` durability through the client, via the
fault proxy, to ``waymark serve``; a router on the server copies every record into a
second topic; a NATS writer updates a bucket that ``waymark fold`` folds and exports
to a ``file://`` object store; ``waymark pipeline run`` runs a relocatable pipeline
whose edges move between that server and a second one when the one under an edge dies
(:mod:`waymark.faults.relocation`). Producers and the NATS writer run in this process
(their acknowledgments are the ground truth); the servers, the fold, the pipeline and
nats-server are processes of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waymark.faults import checkers
from waymark.faults import spark as spark_query
from waymark.faults.checkers import CheckResult, Gap
from waymark.faults.clock import ClockFile
from waymark.faults.disk import TmpfsDisk
from waymark.faults.processes import (
    S3_ENVIRONMENT,
    Managed,
    free_port,
    listening,
    moto_server,
    wait_for,
)
from waymark.faults.proxy import FaultProxy
from waymark.faults.relocation import events_for, sink_counts, write_spec
from waymark.faults.schedule import Fault, FaultKind, make_schedule

SOURCE, COPIES, ROUTER, BUCKET, CLIENT = "events", "copies", "copy", "campaign", "campaign"
SINK = "sink"  # the relocatable pipeline's sink topic, on the campaign's server
TTL, TTL_MS = "expiring", 10_000  # a disk topic whose records expire: clock jumps bite
QUEUE, LEASE_MS = "jobs", 5_000  # a queue whose leases a clock jump ahead expires
TAGS = 16  # records are tagged k0..k15: the recovery keys events/k0..events/k15
PRODUCERS = 2
KEYS = 200  # the NATS writer cycles over this many keys, so the fold overwrites
# ... and every ONCE-th write is a key of its own, never overwritten: a revision the fold
# skipped mid-run stays visible at the end there, where a cycled key's next write hides it.
ONCE = 50


@dataclass
class Applied:
    """A fault as it ran: when it was injected and lifted (seconds into the run)."""

    fault: Fault
    injected_s: float
    lifted_s: float
    ready_s: float  # when lifting it was done (a killed process answers again)
    recovered_s: float | None = None  # from the lift to the first progress after it
    inside_batch: int | None = None  # a spark-kill's: the micro-batch it landed inside
    # Why it did nothing: a pipeline fault that found the runner finished (no runner to
    # kill or pause, and none to start again: a finished runner is not run twice).
    noop: str | None = None

    def to_json(self) -> dict[str, Any]:
        recovered = None if self.recovered_s is None else round(self.recovered_s, 3)
        return {"at_s": self.fault.at_s, "kind": str(self.fault.kind),
                "duration_s": self.fault.duration_s, "latency_ms": self.fault.latency_ms,
                "jump_ms": self.fault.jump_ms,
                "injected_s": round(self.injected_s, 3), "lifted_s": round(self.lifted_s, 3),
                "recovered_s": recovered, "inside_batch": self.inside_batch,
                "noop": self.noop}  # fmt: skip


@dataclass
class Observations:
    """What the campaign saw, filled by its threads (each list is appended by one)."""

    acked: dict[str, int] = field(default_factory=dict)  # record id -> seq it was told
    ttl_acked: dict[str, int] = field(default_factory=dict)  # the same, of the TTL topic
    jobs: dict[str, int] = field(default_factory=dict)  # the same, of the queue
    delivered: dict[str, int] = field(default_factory=dict)  # job id -> claims that got it
    done: set[str] = field(default_factory=set)  # job ids the worker sent an ack for
    remaining: list[str] = field(default_factory=list)  # job ids left in the queue at the end
    drain_s: float | None = None  # how long the queue took to drain at the end (None: never)
    acks: list[tuple[float, float]] = field(default_factory=list)  # (t, latency s)
    errors: list[tuple[float, str]] = field(default_factory=list)  # (t, what failed)
    nats_acks: list[tuple[float, int]] = field(default_factory=list)  # (t, revision told)
    # NATS key -> (value, revision) of its last acknowledged write (the writer is alone).
    nats_written: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    pointer: list[tuple[float, int]] = field(default_factory=list)  # (t, cursor named)
    processed: list[tuple[float, int]] = field(default_factory=list)  # (t, consumer log size)
    # What the checkers read at the end, kept so a test can plant a violation in it.
    read: dict[str, int] = field(default_factory=dict)  # source: record id -> seq
    ids: dict[str, list[str]] = field(default_factory=dict)  # topic: every id read, seq order
    ttl_read: dict[str, int] = field(default_factory=dict)  # TTL topic: record id -> seq
    ttl_gaps: list[Gap] = field(default_factory=list)  # the tombstones met reading it
    stamps: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # topic: (seq, $ts)
    copied: dict[str, int] = field(default_factory=dict)  # dest: record id -> copies
    gaps: list[Gap] = field(default_factory=list)
    fold: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    bucket: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    newest: dict[str, int] = field(default_factory=dict)  # recovery key -> newest version
    receipted: dict[str, int] = field(default_factory=dict)  # key -> newest processed
    missed: dict[str, int] = field(default_factory=dict)  # `recovery missed`: key -> version
    window_lost: list[str] = field(default_factory=list)
    events: int = 0  # the pipeline's source sends events 0 .. events - 1
    sink_head: list[tuple[float, int]] = field(default_factory=list)  # (t, sink topic head)
    sink: dict[int, int] = field(default_factory=dict)  # event id -> times at the sink
    # Each `waymark pipeline run`'s exit status in order, the last None if it was still
    # running at the check (a killed one is -9, and only a killed one is run again).
    pipeline_exits: list[int | None] = field(default_factory=list)
    relocations: int = 0  # placements past each edge's first, from `waymark pipeline status`
    # With --spark: the Spark query's exactly-once sink and fold sink (docs/faults.md).
    spark: bool = False
    spark_head: list[tuple[float, int]] = field(default_factory=list)  # (t, its sink's head)
    spark_rows: list[tuple[int, str, int]] = field(default_factory=list)  # (batch, user, n)
    spark_fold: dict[str, int] = field(default_factory=dict)  # fold sink: user -> records
    spark_expected: dict[str, int] = field(default_factory=dict)  # input: user -> records
    spark_restarts: int = 0  # the supervisor's, after the driver exited by itself
    spark_kills_inside: int = 0  # spark-kills that landed inside a micro-batch
    spark_replays: int = 0  # batches its sinks met as already taken (the job's log)


@dataclass
class CampaignResult:
    seed: int
    seconds: float
    applied: list[Applied]
    verdicts: list[CheckResult]
    observations: Observations
    components: list[str]
    left_out: list[str]
    workdir: Path

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


def run_campaign(
    seconds: float,
    seed: int,
    workdir: Path,
    *,
    kinds: tuple[FaultKind, ...] = tuple(FaultKind),
    s3: bool = False,
    spark: bool = False,
    log: Callable[[str], None] = lambda _: None,
) -> CampaignResult:
    """Run one campaign of ``seconds`` in ``workdir`` (its logs stay there; the data
    too, unless it was on the full-disk fault's tmpfs). With ``s3`` the fold exports to
    an S3 endpoint (moto's server, a process) instead of ``file://``; with ``spark`` a
    Spark query with the exactly-once topic sink and the fold sink reads the producers'
    topic (:mod:`waymark.faults.spark`), and its faults join the schedule."""
    workdir.mkdir(parents=True, exist_ok=True)
    left_out = []
    if not spark:
        kinds = tuple(k for k in kinds if k not in SPARK_KINDS)
        left_out.append("Spark query and its sinks (with --spark)")
    s3_port = free_port()
    moto = moto_server(s3_port, workdir / "s3.log") if s3 else None
    if moto is None:
        kinds = tuple(k for k in kinds if k is not FaultKind.S3_PAUSE)
        left_out.append("S3 export (moto)" if not s3 else "S3 export (moto is not installed)")
    disk = TmpfsDisk(workdir / "data")
    if FaultKind.DISK_FULL in kinds and not disk.mount():
        kinds = tuple(k for k in kinds if k is not FaultKind.DISK_FULL)
        left_out.append("full disk (mounting a tmpfs needs root)")
    schedule = make_schedule(seed, seconds, kinds)
    components = [
        "producers (client, fsync, idempotent ids) via the fault proxy",
        "waymark serve (SIGKILL, SIGSTOP, its injected clock jumping ahead and back)",
        "the injected clocks of waymark fold's export rounds (its lease) and of "
        "waymark pipeline run (its leases, backoff, patience) jumping with the server's",
        "a router (at least once)", "an expiring topic (TTL) and its producer",
        "a queue (leases of 5 s) with a producer and a worker claiming and acking",
        "nats-server + waymark fold (SIGKILL, SIGSTOP) exporting to "
        + ("S3 (moto's server, SIGSTOP)" if moto else "file://"),
        "a receipt recovery consumer process (SIGKILL, SIGSTOP) and `waymark recovery missed`",
        "`waymark pipeline run`: a relocatable pipeline, its edges on the server and a second "
        "one (SIGKILL), its sink on the server",
    ] + (["the server's data directory on a tmpfs (full disk)"] * disk.mounted)  # fmt: skip
    if spark:
        components.append(
            "a Spark query (local[2], SIGKILL and SIGSTOP of its process group, restarted "
            "from its checkpoint) reading the producers' topic: per-user deltas to the "
            "exactly-once topic sink and the fold sink"
        )
    obs = Observations(spark=spark)
    stop = threading.Event()  # the producers and the NATS writer
    sampled = threading.Event()  # the pointer's sampler, which the fold's check reads
    port = free_port()
    clock = ClockFile(workdir / "clock-offset")
    server = Managed(
        "server",
        [
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(workdir / "data"),
            "--clock-offset-file",
            str(clock.path),
        ],
        workdir / "server.log",
        ready=lambda: listening(port),
    )
    edge_port = free_port()
    edge = Managed(
        "edge",
        ["serve", "--port", str(edge_port), "--data-dir", str(workdir / "edge")],
        workdir / "edge.log",
        ready=lambda: listening(edge_port),
    )
    artifacts = (workdir / "artifacts").as_uri()
    with contextlib.ExitStack() as stack:
        stack.callback(disk.unmount)  # last: the server has stopped
        # Both servers start while the rest is set up: their start-up is the longest wait.
        server.launch()
        stack.callback(server.stop)
        edge.launch()
        stack.callback(edge.stop)
        from waymark.client import Client
        from waymark.kv.server import nats_server_executable
        from waymark.protocol.topics import ConfigPatch, Durability, TopicType

        if moto is not None:
            artifacts = _start_s3(moto, s3_port, stack)
        # nats-server (one node, JetStream's file store) as a process of the campaign's:
        # the nats-kill fault starts it again on the same store directory and port.
        nats_port = free_port()
        nats_url = f"nats://127.0.0.1:{nats_port}"
        nats = Managed(
            "nats",
            ["-js", "-a", "127.0.0.1", "-p", str(nats_port), "-sd", str(workdir / "nats")],
            workdir / "nats.log",
            ready=lambda: listening(nats_port),
            program=[nats_server_executable()],
        )
        nats.start()
        stack.callback(nats.stop)
        fold = Managed(
            "fold",
            ["fold", "--nats", nats_url, "--bucket", BUCKET, "--store",
             f"lmdb:{workdir / 'fold'}", "--export-to", artifacts, "--export-every-s", "0.5",
             "--lease-ttl-s", "2", "--nats-timeout-s", "2",
             "--clock-offset-file", str(clock.path)],
            workdir / "fold.log",
        )  # fmt: skip
        server.wait_ready()
        proxy = FaultProxy(port).start()
        stack.callback(proxy.stop)
        direct = f"http://127.0.0.1:{port}"
        with Client(direct, timeout=10) as admin:
            admin.put_topic(SOURCE, ConfigPatch(durability=Durability.FSYNC))
            admin.put_topic(TTL, ConfigPatch(ttl_ms=TTL_MS))
            admin.put_topic(QUEUE, ConfigPatch(durability=Durability.FSYNC, lease_ms=LEASE_MS),
                            type=TopicType.QUEUE)  # fmt: skip
            admin.put_router(ROUTER, SOURCE, COPIES)
        supervisor = None
        if spark:  # started now: its JVM starts while the rest is set up
            supervisor = spark_query.Supervisor(spark_query.driver(direct, SOURCE, workdir))
            supervisor.start()
            stack.callback(supervisor.stop)
        fold.start()
        stack.callback(fold.stop)
        consumer = Managed(
            "consumer",
            [direct, str(workdir / "receipts.db"), CLIENT, str(workdir / "processed.log"), SOURCE],
            workdir / "consumer.log",
            program=[sys.executable, "-m", "waymark.faults.consumer"],
        )
        consumer.start()
        stack.callback(consumer.stop)
        obs.events = events_for(seconds)
        spec = workdir / "pipeline.toml"
        write_spec(spec, (workdir / "handoff").as_uri(), (direct, f"http://127.0.0.1:{edge_port}"),
                   direct, SINK, obs.events)  # fmt: skip
        # A process group of its own: the pipeline-kill fault SIGKILLs the whole runner.
        pipeline = Managed("pipeline", ["pipeline", "run", str(spec), "--clock-offset-file",
                                        str(clock.path)], workdir / "pipeline.log",
                           group=True)  # fmt: skip
        edge.wait_ready()
        pipeline.start()
        stack.callback(pipeline.stop)
        if supervisor is not None:  # its start-up and first batch are not the campaign's
            supervisor.job.wait_ready(SPARK_READY_S)
            rid, seq = spark_query.warm_up(direct, SOURCE, workdir, SPARK_READY_S)
            obs.acked[rid] = seq
        started = time.monotonic()

        def now() -> float:
            return time.monotonic() - started

        threads = [
            threading.Thread(
                target=_produce,
                args=(k, proxy.url, SOURCE, obs.acked, obs, stop, now),
                daemon=True,
            )
            for k in range(PRODUCERS)
        ]
        threads.append(
            threading.Thread(
                target=_produce,
                args=(PRODUCERS, proxy.url, TTL, obs.ttl_acked, obs, stop, now),
                daemon=True,
            )
        )
        threads.append(
            threading.Thread(
                target=_produce,
                args=(PRODUCERS + 1, proxy.url, QUEUE, obs.jobs, obs, stop, now),
                daemon=True,
            )
        )
        threads.append(
            threading.Thread(target=_write_bucket, args=(nats_url, obs, stop, now), daemon=True)
        )
        worked = threading.Event()  # the worker drains the queue until the check says so
        worker = threading.Thread(target=_work, args=(proxy.url, obs, worked, now), daemon=True)
        worker.start()
        sampler = threading.Thread(
            target=_sample,
            args=(artifacts, workdir / "processed.log", direct, obs, sampled, now),
            daemon=True,
        )
        for t in (*threads, sampler):
            t.start()
        applied = []
        targets = {"server": server, "fold": fold, "consumer": consumer, "edge": edge,
                   "nats": nats, "pipeline": pipeline}  # fmt: skip
        if moto is not None:
            targets["s3"] = moto
        if supervisor is not None:
            targets["spark"] = supervisor.job
        aim = None
        if supervisor is not None:  # a spark-kill waits for a micro-batch to land inside
            job = supervisor.job
            kills = itertools.count()

            def aim() -> int | None:
                # Every other one waits on for the batch's rows to be published, so that
                # the restarted query replays a batch the sink already took.
                if next(kills) % 2 == 0:
                    return spark_query.aim_inside_batch(workdir, SPARK_AIM_S, job.started_at)
                with Client(direct, timeout=2) as client:

                    def head() -> int:
                        return client.get_topic(spark_query.OUTPUT, touch=False).head_seq

                    return spark_query.aim_after_publish(workdir, head, SPARK_AIM_S, job.started_at)

        for fault in schedule:
            _sleep_until(started + fault.at_s)
            log(f"{now():7.2f}s  {fault.kind} for {fault.duration_s}s")
            applied.append(_apply(fault, targets, proxy, disk, clock, now, aim))
            obs.spark_kills_inside += applied[-1].inside_batch is not None
        # The consumer stops processing 2 s before the end and is killed at the check,
        # so the last changes are never receipted: the recovery query must name them.
        # First every fault whose progress needs the producers, the NATS writer or the
        # consumer running must have recovered (or RECOVER_S passed): judged by a
        # condition, not by the 8 s the schedule leaves, so a slow host's restarts do
        # not fail the campaign (docs/faults.md, "Checkers").
        _sleep_until(started + seconds - 2)
        with contextlib.suppress(TimeoutError):  # then the checker names the faults
            wait_for("every fault recovered", lambda: _live_recovered(applied, obs), RECOVER_S)
        consumer.pause()
        _sleep_until(max(started + seconds, time.monotonic() + 2))
        stop.set()
        for t in threads:
            t.join(30)
        log(f"{now():7.2f}s  faults over; checking")
        verdicts = _check(direct, nats_url, fold, consumer, pipeline, workdir, obs, worked,
                          supervisor)  # fmt: skip
        worker.join(30)
        sampled.set()
        sampler.join(5)
        for a in applied:
            a.recovered_s = None if a.noop else _recovery(a, obs)
        verdicts.append(checkers.faults_recovered(
            [(str(a.fault.kind), a.injected_s, a.recovered_s) for a in applied if not a.noop],
            sum(1 for a in applied if a.noop),
        ))  # fmt: skip
    return CampaignResult(
        seed, seconds, applied, verdicts, obs,
        components=components,
        left_out=left_out,
        workdir=workdir,
    )  # fmt: skip


def _start_s3(moto: Managed, port: int, stack: contextlib.ExitStack) -> str:
    """Start moto's S3 server, point this process and its children at it (the ``AWS_*``
    environment, as a user reaches S3), make the bucket; the artifacts' URL."""
    import os

    import boto3  # type: ignore[import-untyped]

    moto.start()
    stack.callback(moto.stop)
    environment = {**S3_ENVIRONMENT, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in environment}
    os.environ.update(environment)

    def restore() -> None:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    stack.callback(restore)
    boto3.client("s3", endpoint_url=environment["AWS_ENDPOINT_URL"]).create_bucket(
        Bucket="campaign"
    )
    return "s3://campaign/artifacts"


KILLS = (FaultKind.SERVER_KILL, FaultKind.FOLD_KILL, FaultKind.CONSUMER_KILL,
         FaultKind.EDGE_KILL, FaultKind.PIPELINE_KILL, FaultKind.NATS_KILL,
         FaultKind.SPARK_KILL)  # fmt: skip
SPARK_KINDS = (FaultKind.SPARK_KILL, FaultKind.SPARK_PAUSE)
SPARK_READY_S = 180.0  # for the Spark session's first start, before the clock starts
SPARK_AIM_S = 10.0  # how long a spark-kill waits for a micro-batch in flight
SPARK_CATCH_UP_S = 180.0  # after the faults, for the Spark query to read the input's head
PIPELINE_FINISH_S = 60.0  # after the faults, for the pipeline to deliver what is in flight
# At the check, for the worker to drain the queue: its claims have been
# seen to return nothing for 25-30 s with thousands of jobs ready (docs/faults.md,
# "Findings", open), which a 30 s wait failed on; the drain time is reported.
QUEUE_DRAIN_S = 60.0
# At the end, for every fault to show progress after its lift (a slow host's restarts).
RECOVER_S = 60.0
PAUSES = (FaultKind.SERVER_PAUSE, FaultKind.FOLD_PAUSE, FaultKind.CONSUMER_PAUSE,
          FaultKind.S3_PAUSE, FaultKind.EDGE_PAUSE, FaultKind.PIPELINE_PAUSE,
          FaultKind.NATS_PAUSE, FaultKind.SPARK_PAUSE)  # fmt: skip
# A runner that finished is not run again: a fault on it then does nothing, said so.
RUNS_ONCE = (FaultKind.PIPELINE_KILL, FaultKind.PIPELINE_PAUSE)
FINISHED = "the pipeline runner had exited"


def _sleep_until(deadline: float) -> None:
    time.sleep(max(deadline - time.monotonic(), 0.0))


def _apply(
    fault: Fault,
    targets: dict[str, Managed],
    proxy: FaultProxy,
    disk: TmpfsDisk,
    clock: ClockFile,
    now: Callable[[], float],
    aim: Callable[[], int | None] | None = None,
) -> Applied:
    """Inject ``fault``, hold it for its duration, lift it. The lift's time is when
    lifting starts: a killed process's start-up counts in its time to recover. A
    ``spark-kill`` first waits for ``aim`` (a micro-batch in flight, which the restarted
    query must replay exactly once)."""
    kind = fault.kind
    inside = aim() if aim is not None and kind is FaultKind.SPARK_KILL else None
    injected = now()
    if kind in KILLS or kind in PAUSES:
        target = targets[kind.value.partition("-")[0]]  # the part the kind is named after
        if not (target.kill() if kind in KILLS else target.pause()) and kind in RUNS_ONCE:
            # Nothing to lift: its exit status is the checker's to judge.
            return Applied(fault, injected, injected, injected, noop=FINISHED)
    elif kind is FaultKind.NET_CUT:
        proxy.cut()
    elif kind is FaultKind.DISK_FULL:
        disk.fill()
    elif kind is FaultKind.CLOCK_JUMP:
        clock.set(fault.jump_ms)
    else:
        proxy.latency(fault.latency_ms)
    time.sleep(fault.duration_s)
    lifted = now()
    if kind in KILLS:
        target.start()
    elif kind in PAUSES:
        target.resume()
    elif kind is FaultKind.DISK_FULL:
        disk.free()
    elif kind is FaultKind.CLOCK_JUMP:
        clock.set(0)  # back: the wall clock steps back under what was written meanwhile
    else:
        proxy.restore()
    return Applied(fault, injected, lifted, now(), inside_batch=inside)


def _samples(a: Applied, obs: Observations) -> list[tuple[float, int]] | None:
    """What shows progress after ``a``: the pointer for the fold, S3 and nats-server
    (past the first revision written after the lift: the fold read again, exported), the
    processed log for the consumer, the pipeline's sink for the edge server and the
    runner, ``spark-out`` for Spark; None: an acknowledged append."""
    return {"fold": obs.pointer, "s3": obs.pointer, "nats": obs.pointer,
            "consumer": obs.processed, "edge": obs.sink_head, "pipeline": obs.sink_head,
            "spark": obs.spark_head}.get(a.fault.kind.value.partition("-")[0])  # fmt: skip


def _live_recovered(applied: list[Applied], obs: Observations) -> bool:
    """Whether every fault whose progress the producers, the NATS writer or the consumer
    make (they stop at the end) has recovered; the pipeline's and Spark's are judged
    after the check, which waits for them to finish."""
    after_check = (obs.sink_head, obs.spark_head)
    return all(
        a.noop or any(_samples(a, obs) is s for s in after_check) or _recovery(a, obs) is not None
        for a in applied
    )


def _recovery(a: Applied, obs: Observations) -> float | None:
    """Seconds from the lift to the first progress after it (:func:`_samples`); for the
    edge server and the runner, once the pipeline delivered every event, the lift's end
    (no sink growth is left to wait for)."""
    samples = _samples(a, obs)
    if samples is obs.pointer:  # a revision written after the lift, folded and exported
        written = min((r for t, r in obs.nats_acks if t > a.lifted_s), default=None)
        after: Iterator[float] = (
            t for t, r in samples if t > a.lifted_s and written is not None and r >= written
        )
    elif samples is not None:
        at_lift = max((r for t, r in samples if t <= a.lifted_s), default=0)
        after = (t for t, r in samples if t > a.lifted_s and r > at_lift)
        if samples is obs.sink_head and at_lift >= obs.events:  # nothing left
            after = iter([a.ready_s])
    else:
        after = (t for t, _ in obs.acks if t > a.lifted_s)
    first = next(after, None)
    return None if first is None else first - a.lifted_s


def _produce(
    k: int,
    url: str,
    topic: str,
    acked: dict[str, int],
    obs: Observations,
    stop: threading.Event,
    now: Callable[[], float],
) -> None:
    """Append one record at a time with an id to ``topic``, retrying it until
    acknowledged (then noted in ``acked``): the id makes a retry of a write that was
    committed answer the original seq."""
    from waymark.client import Client, RecordIn

    with Client(url, timeout=3, connect_timeout=1) as client:
        i = 0
        while not stop.is_set():
            rid = f"p{k}-{i}"
            sent = now()
            try:
                # (The user is what the Spark query groups by, with --spark.)
                data = {"p": k, "n": i, "user": spark_query.user_of(rid)}
                record = RecordIn.of(data, id=rid, tag=f"k{i % TAGS}")
                ack = client.append(topic, [record])
            except Exception as e:  # a fault: the write's fate is unknown; send it again
                obs.errors.append((now(), f"producer {k}: {type(e).__name__}"))
                time.sleep(0.05)
                continue
            done = now()
            acked[rid] = ack.seqs[0]
            obs.acks.append((done, done - sent))
            i += 1


def _write_bucket(
    url: str, obs: Observations, stop: threading.Event, now: Callable[[], float]
) -> None:
    from waymark.kv import Connection, NatsConnectionConfig, StoreConfig

    async def write() -> None:
        config = NatsConnectionConfig(url=url, timeout=5, name="campaign-writer")
        async with Connection(config) as conn:
            writer = (await conn.store(BUCKET, StoreConfig(max_bytes=None))).writer()
            i = 0
            while not stop.is_set():
                try:
                    key = f"once.{i:09}" if i % ONCE == 0 else f"k.{i % KEYS:04}"
                    version = await writer.put(key, b"v%d" % i)
                except Exception as e:
                    obs.errors.append((now(), f"nats writer: {type(e).__name__}"))
                    await asyncio.sleep(0.05)
                    continue
                revision = version.as_u64() or 0
                obs.nats_acks.append((now(), revision))
                obs.nats_written[key] = (b"v%d" % i, revision)
                i += 1
                await asyncio.sleep(0.002)

    asyncio.run(write())


def _sample(
    url: str,
    processed: Path,
    server: str,
    obs: Observations,
    stop: threading.Event,
    now: Callable[[], float],
) -> None:
    """Every 0.2 s: the cursor the artifact pointer names, the consumer's log's size, the
    pipeline's sink topic's head."""
    from waymark.client import Client
    from waymark.kv import ObjectStoreTransport
    from waymark.objstore import open_store

    transport = ObjectStoreTransport(open_store(url))
    with Client(server, timeout=1, connect_timeout=0.5) as client:
        while not stop.wait(0.2):
            with contextlib.suppress(FileNotFoundError):
                obs.processed.append((now(), processed.stat().st_size))
            with contextlib.suppress(Exception):  # not made yet, or the server is down
                obs.sink_head.append((now(), client.get_topic(SINK, touch=False).head_seq))
            if obs.spark:
                with contextlib.suppress(Exception):
                    head = client.get_topic(spark_query.OUTPUT, touch=False).head_seq
                    obs.spark_head.append((now(), head))
            with contextlib.suppress(Exception):  # not published yet, or mid-write
                manifest = transport.read_pointer(BUCKET).manifest
                if manifest is not None:
                    obs.pointer.append((now(), manifest.rank))


def _read_topic(
    client: Any, topic: str, gaps: list[Gap], stamps: list[tuple[int, int]] | None = None
) -> list[tuple[str, int, str]]:
    """Every record of ``topic`` as (id, seq, tag), the tombstones met on the way, and
    into ``stamps`` each record's (seq, $ts)."""
    import msgspec

    got: list[tuple[str, int, str]] = []
    after = 0
    while True:
        page = client.diff_raw(topic, after, limit=1000)
        if page.tombstone is not None:
            t = page.tombstone
            gaps.append(Gap(topic, t.gap_from, t.gap_to, t.reason))
        for r in page.records:
            data = msgspec.json.decode(r.data)
            got.append((f"p{data['p']}-{data['n']}", r.seq, r.tag or ""))
            if stamps is not None:
                stamps.append((r.seq, r.ts))
        if page.next_from_seq <= after or (page.caught_up and not page.records):
            return got
        after = page.next_from_seq


def _check(
    url: str,
    nats_url: str,
    fold: Managed,
    consumer: Managed,
    pipeline: Managed,
    workdir: Path,
    obs: Observations,
    worked: threading.Event,
    supervisor: spark_query.Supervisor | None = None,
) -> list[CheckResult]:
    from waymark.client import Client

    gaps: list[Gap] = []
    with Client(url, timeout=10) as client:
        obs.stamps = {SOURCE: [], TTL: []}
        source = _read_topic(client, SOURCE, gaps, obs.stamps[SOURCE])
        obs.read = read = {rid: seq for rid, seq, _ in source}
        expiring = _read_topic(client, TTL, obs.ttl_gaps, obs.stamps[TTL])
        obs.ttl_read = {rid: seq for rid, seq, _ in expiring}
        obs.ids = {SOURCE: [rid for rid, _, _ in source], TTL: [rid for rid, _, _ in expiring]}
        for _, seq, tag in source:
            key = f"{SOURCE}/{tag}"
            obs.newest[key] = max(obs.newest.get(key, 0), seq)

        def copies() -> dict[str, int]:
            counts: dict[str, int] = {}
            for rid, _, _ in _read_topic(client, COPIES, []):
                counts[rid] = counts.get(rid, 0) + 1
            return counts

        # The router forwards asynchronously: give it until every acked record is there.
        with contextlib.suppress(TimeoutError):
            wait_for("the router caught up", lambda: obs.acked.keys() <= copies().keys(), 30)
        copied_gaps: list[Gap] = []
        copied: dict[str, int] = {}
        for rid, _, _ in _read_topic(client, COPIES, copied_gaps):
            copied[rid] = copied.get(rid, 0) + 1
    # The three waits (the fold's export, a change checkpoint, the pipeline's end) and
    # the two commands run at once: each waits on processes, not on this one.
    with ThreadPoolExecutor(5) as pool:
        folded = pool.submit(asyncio.run, _fold_and_bucket(nats_url, fold, workdir, obs))
        recovered = pool.submit(_recovery_check, url, consumer, workdir, obs)
        drained = pool.submit(_queue_check, url, worked, obs)
        sparked = pool.submit(_spark_check, url, supervisor, workdir, obs) if supervisor else None
        pool.submit(_pipeline_check, url, pipeline, workdir, obs).result()
        drained.result()
        if sparked is not None:
            sparked.result()
        fold_state, bucket_state = folded.result()
        recovery = recovered.result()
    obs.copied, obs.gaps, obs.fold, obs.bucket = (
        copied,
        gaps + copied_gaps,
        fold_state,
        bucket_state,
    )
    return [
        checkers.acknowledged_lost(obs.acked, read, SOURCE),
        checkers.stored_once(obs.ids),
        checkers.forwarded(obs.acked, copied, ROUTER),
        # The router's dest is a `disk` topic: a server crash may lose its newest copies,
        # announced (docs/durability.md) and forwarded again; the fsync source loses none.
        checkers.gaps_announced(gaps + copied_gaps + obs.ttl_gaps, allowed_topics=[COPIES, TTL]),
        checkers.expired_announced(obs.ttl_acked, obs.ttl_read, obs.ttl_gaps, TTL),
        checkers.timestamps_monotonic(obs.stamps),
        checkers.fold_equals_bucket(fold_state, bucket_state),
        checkers.nats_writes_kept(obs.nats_written, bucket_state),
        checkers.pointer_monotonic(obs.pointer),
        recovery,
        checkers.queue_done(obs.jobs, obs.delivered, obs.done, obs.remaining, obs.drain_s),
        checkers.pipeline_exactly_once(obs.events, obs.sink, obs.pipeline_exits, obs.relocations),
    ] + (
        [
            checkers.spark_exactly_once(
                obs.spark_expected,
                obs.spark_rows,
                obs.spark_restarts,
                obs.spark_kills_inside,
                obs.spark_replays,
            ),
            checkers.spark_fold_equals(obs.spark_expected, obs.spark_fold),
        ]
        if supervisor is not None
        else []
    )


def _spark_check(
    url: str, supervisor: spark_query.Supervisor, workdir: Path, obs: Observations
) -> None:
    """Let the Spark query report a batch through the input's head (both its sinks took
    it), kill it, and read its exactly-once sink's topic and its fold sink's store."""
    from waymark.client import Client

    head = max(obs.read.values(), default=0)
    with contextlib.suppress(TimeoutError):  # then the checkers say how far it got
        wait_for(
            "the Spark query read the input's head",
            lambda: spark_query.reported_through(workdir) >= head,
            SPARK_CATCH_UP_S,
        )
    supervisor.stop()
    obs.spark_restarts = supervisor.restarts
    with Client(url, timeout=10) as client, contextlib.suppress(Exception):  # none published
        obs.spark_rows = spark_query.published(client)
    obs.spark_fold = spark_query.folded(workdir)
    obs.spark_expected = spark_query.expected(obs.read)
    obs.spark_replays = spark_query.replays(workdir)


def _queue_check(url: str, worked: threading.Event, obs: Observations) -> None:
    """Let the worker drain the queue (every job it was given acknowledged), stop it,
    and read what is left in the queue."""
    from waymark.client import Client

    with Client(url, timeout=10) as client:

        def drained() -> bool:
            return obs.jobs.keys() <= obs.done and client.get_topic(QUEUE).count == 0

        started = time.monotonic()
        with contextlib.suppress(TimeoutError):  # then the checker says what is left
            wait_for("the queue drained", drained, QUEUE_DRAIN_S)
            obs.drain_s = time.monotonic() - started
        worked.set()
        obs.remaining = [rid for rid, _, _ in _read_topic(client, QUEUE, [])]


def _work(url: str, obs: Observations, worked: threading.Event, now: Callable[[], float]) -> None:
    """The queue's worker: claim up to 10 jobs under a 5 s lease, work on them a moment
    (a clock jump ahead meanwhile expires the lease: the ack is skipped and the jobs
    come again), acknowledge them."""
    from waymark.client import Client

    with Client(url, timeout=3, connect_timeout=1) as client:
        while not worked.is_set():
            try:
                jobs = client.claim(QUEUE, "worker", 10, lease_ms=LEASE_MS)
            except Exception as e:  # a fault: claim again
                obs.errors.append((now(), f"worker: {type(e).__name__}"))
                time.sleep(0.05)
                continue
            if not jobs:
                time.sleep(0.02)
                continue
            ids = [f"p{job.data['p']}-{job.data['n']}" for job in jobs]
            for rid in ids:
                obs.delivered[rid] = obs.delivered.get(rid, 0) + 1
            time.sleep(0.05)  # the work
            obs.done.update(ids)  # before the ack: an answer lost on the way hides a done one
            with contextlib.suppress(Exception):  # not acknowledged: the jobs come again
                client.ack(QUEUE, "worker", [j.seq for j in jobs],
                           lease_ids=[j.lease_id for j in jobs])  # fmt: skip


def _pipeline_check(url: str, pipeline: Managed, workdir: Path, obs: Observations) -> None:
    """Let the pipeline finish (its source's events delivered), then read its sink and
    ask ``waymark pipeline status`` (as a user would) how often its edges moved."""
    import json

    from waymark.client import ApiError, Client
    from waymark.faults.processes import waymark_executable

    obs.pipeline_exits = [*pipeline.exits, pipeline.wait(PIPELINE_FINISH_S)]
    # (No sink topic: nothing was delivered.)
    with Client(url, timeout=10) as client, contextlib.suppress(ApiError):
        obs.sink = sink_counts(client, SINK)
    done = subprocess.run(
        [waymark_executable(), "pipeline", "status", str(workdir / "pipeline.toml"), "--json"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if done.returncode == 0:
        edges = json.loads(done.stdout)["edges"].values()
        obs.relocations = sum(max(e["generation"] - 1, 0) for e in edges)


async def _fold_and_bucket(
    url: str, fold: Managed, workdir: Path, obs: Observations
) -> tuple[dict[str, tuple[bytes, int]], dict[str, tuple[bytes, int]]]:
    """Let the fold reach the bucket's head, stop it, and read both."""
    from waymark.kv import Connection, NatsConnectionConfig, StoreConfig, open_store

    async with Connection(NatsConnectionConfig(url=url, timeout=5)) as conn:
        kv = await conn.store(BUCKET, StoreConfig(max_bytes=None))
        _, last = await kv.stream_bounds()
        bucket = {e.key: (e.value, e.version.as_u64() or 0) for e in await kv.reader().scan()}
    with contextlib.suppress(TimeoutError):  # then the checker says how far it was
        await asyncio.to_thread(
            wait_for, "the fold exported the head", lambda: obs.pointer and _head(obs) >= last, 30
        )
    fold.stop()
    store = open_store(f"lmdb:{workdir / 'fold'}")
    try:
        folded = {e.key: (e.value, e.version.as_u64() or 0) for e in store.range()}
    finally:
        store.close()
    return folded, bucket


def _head(obs: Observations) -> int:
    return obs.pointer[-1][1]


def _recovery_check(
    client_url: str, consumer: Managed, workdir: Path, obs: Observations
) -> CheckResult:
    """Kill the consumer, let a change checkpoint cover the source's head, ask
    ``waymark recovery missed`` (as a user would) and check it names every key whose
    newest change the consumer never processed."""
    import json

    from waymark.client import Client
    from waymark.faults.processes import waymark_executable

    consumer.kill()
    head = max(obs.newest.values(), default=0)

    def covered() -> bool:
        with Client(client_url, timeout=10) as client:
            page = client.list_checkpoints(limit=20, topics=[SOURCE])
        return any(c.last >= head for cp in page.checkpoints for c in cp.changes)

    with contextlib.suppress(TimeoutError):  # then the checker shows what is missing
        wait_for("a change checkpoint covering the head", covered, 30)
    processed = workdir / "processed.log"
    if processed.exists():
        for line in processed.read_text().splitlines():
            key, _, version = line.partition(" ")
            if version.isdigit():
                obs.receipted[key] = max(obs.receipted.get(key, 0), int(version))
    done = subprocess.run(
        [waymark_executable(), "recovery", "missed", "--url", client_url,
         "--store", str(workdir / "receipts.db"), "--client", CLIENT, "--topics", SOURCE,
         "--recent-s", "0", "--json", "--accept-loss"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    for line in done.stdout.splitlines():
        entry = json.loads(line)
        if "lost" in entry:
            obs.window_lost.append(line)
        else:
            obs.missed[entry["key"]] = entry["version"]
    if done.returncode != 0:
        obs.window_lost.append(f"recovery missed exited {done.returncode}: {done.stderr[-300:]}")
    return checkers.recovery_covers(obs.newest, obs.receipted, obs.missed, obs.window_lost)
