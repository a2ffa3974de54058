"""The campaign's Spark query (docs/faults.md, "The data flow"), with ``--spark``: the
demo's job (:mod:`waymark.spark.demo_job`) reading ``events`` and, per micro-batch,
publishing each user's deltas with the exactly-once topic sink and adding them into a
fold store with the fold sink. It runs as a process group (driver, JVM, Python
workers), SIGKILLed or SIGSTOPped by the schedule, and started again from its
checkpoint, as a supervisor (``spark-submit --supervise``) would, whenever it exits.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from waymark.faults.processes import Managed, wait_for

OUTPUT = "spark-out"  # the exactly-once sink's topic, on the campaign's server
USERS = 16  # the producers' records name user u<n mod USERS>
UNTIL = 2**62  # the job reads on until the campaign stops it
MAX_PER_TRIGGER = 2000


def user_of(record_id: str) -> str:
    """The user a producer's record ``p<k>-<n>`` names (``_produce`` in the campaign)."""
    return f"u{int(record_id.rpartition('-')[2]) % USERS}"


def driver(url: str, source: str, workdir: Path) -> Managed:
    """The Spark job as a process group of its own, its checkpoint and fold in ``workdir``."""
    from waymark.spark.demo_job import JobConfig

    config = JobConfig(url, source, OUTPUT, fold_spec(workdir), str(workdir / "spark-checkpoint"),
                       MAX_PER_TRIGGER, UNTIL)  # fmt: skip
    return Managed("spark", config.args(), workdir / "spark.log",
                   ready=lambda: started(workdir),
                   program=[sys.executable, "-m", "waymark.spark.demo_job"],
                   group=True)  # fmt: skip


def started(workdir: Path) -> bool:
    """Whether the job's session was ever ready (its first start is the slow one: a
    JVM, 10-40 s on a loaded machine, which the campaign waits out before its clock
    starts)."""
    with contextlib.suppress(FileNotFoundError):
        return '{"event": "ready"' in (workdir / "spark.log").read_text(errors="replace")
    return False


def fold_spec(workdir: Path) -> str:
    return f"lmdb:{workdir / 'spark-fold'}"


def warm_up(url: str, source: str, workdir: Path, timeout: float) -> tuple[str, int]:
    """Append one record to ``source`` (shaped as a producer's, ``p99-0``) and wait until
    the job reported the micro-batch that read it: its first batch starts the Python
    workers and the JIT (25 s or more here), which the campaign waits out before its
    clock starts, so the schedule's faults find a query that runs batches. Returns the
    record's id and seq, acknowledged like any producer's."""
    from waymark.client import Client, RecordIn

    record_id = "p99-0"
    with Client(url, timeout=10) as client:
        data = {"p": 99, "n": 0, "user": user_of(record_id)}
        seq = client.append(source, [RecordIn.of(data, id=record_id, tag="k0")]).seqs[0]
    with contextlib.suppress(TimeoutError):  # then it runs late; the checkers will say
        wait_for("the Spark query's first micro-batch", lambda: reported_through(workdir) >= seq,
                 timeout)  # fmt: skip
    return record_id, seq


class Supervisor:
    """Start the job again whenever it exits by itself (a query failed while the server
    was down): every restart resumes from the checkpoint. A fault's SIGKILL is the
    schedule's to lift."""

    def __init__(self, job: Managed) -> None:
        self.job = job
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Supervisor:
        self.job.launch()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            if self.job.restart_if_exited():
                self.restarts += 1

    def stop(self) -> None:
        """Stop supervising, then SIGKILL the job (exactly once is its to keep)."""
        self._stop.set()
        self._thread.join(5)
        self.job.kill()


def published(client: Any) -> list[tuple[int, str, int]]:
    """The exactly-once sink's rows as (batch, user, events), in seq order."""
    rows: list[tuple[int, str, int]] = []
    cursor = 0
    while True:
        page = client.diff(OUTPUT, cursor, limit=1000)
        for record in page.records:
            data = record.data
            rows.append((int(data["batch"]), str(data.get("user")), int(data["events"])))
        if page.caught_up or page.next_from_seq <= cursor:
            return rows
        cursor = page.next_from_seq


def folded(workdir: Path) -> dict[str, int]:
    """The fold sink's store: user -> events counted."""
    from waymark.kv.stores import open_store

    totals: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError):
        store = open_store(fold_spec(workdir))
        try:
            for entry in store.range():
                totals[str(entry.key)] = int(json.loads(entry.value)["events"])
        finally:
            store.close()
    return totals


def expected(read: Mapping[str, int]) -> dict[str, int]:
    """Per user, the records of the input (record id -> seq, as read back at the end)."""
    counts: dict[str, int] = {}
    for record_id in read:
        user = user_of(record_id)
        counts[user] = counts.get(user, 0) + 1
    return counts


def in_flight(workdir: Path, since: float = 0.0) -> int | None:
    """The micro-batch the query planned at or after ``since`` (wall clock: the driver's
    start) and has not committed, if any: Spark writes a batch's ``offsets/N`` to the
    checkpoint before running it and ``commits/N`` after, and replays a batch that has
    the one without the other when it starts again (without writing ``offsets/N`` again,
    so a batch being replayed is not one a driver planned since its start)."""
    checkpoint = workdir / "spark-checkpoint"
    planned = _batch_ids(checkpoint / "offsets")
    last = max(planned, default=None)
    if last is None or last in _batch_ids(checkpoint / "commits"):
        return None
    with contextlib.suppress(FileNotFoundError):
        if (checkpoint / "offsets" / str(last)).stat().st_mtime >= since:
            return last
    return None


def _batch_ids(directory: Path) -> set[int]:
    with contextlib.suppress(FileNotFoundError):
        return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}
    return set()


def aim_inside_batch(workdir: Path, timeout_s: float, since: float = 0.0) -> int | None:
    """Wait up to ``timeout_s`` for a micro-batch in flight that the driver started at
    ``since`` planned (:func:`in_flight`), so that a kill lands inside it; the batch, or
    None if none ran (the driver starting, or replaying the batch a kill left)."""
    deadline = time.monotonic() + timeout_s
    while (batch := in_flight(workdir, since)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return batch


def aim_after_publish(
    workdir: Path, head: Callable[[], int], timeout_s: float, since: float = 0.0
) -> int | None:
    """As :func:`aim_inside_batch`, then wait on until the exactly-once sink published
    that batch (``head()``, its topic's head, moved) while Spark has not committed it:
    a kill then leaves a batch whose rows are out, which the restarted query replays
    into the sink, and the sink must answer "already published" rather than publish it
    twice. The window is the fold sink's write and Spark's commit (milliseconds), so a
    kill often misses it (None: Spark committed the batch first); the job's log says
    which replays the sinks met (:func:`replays`)."""
    deadline = time.monotonic() + timeout_s
    batch = aim_inside_batch(workdir, timeout_s, since)
    if batch is None:
        return None
    commit = workdir / "spark-checkpoint" / "commits" / str(batch)
    with contextlib.suppress(Exception):  # the server answering slowly: kill as it is
        before = head()
        while head() == before and not commit.exists() and time.monotonic() < deadline:
            pass  # (no sleep: the window is a few milliseconds)
    return None if commit.exists() else batch  # committed meanwhile: not inside it


def replays(workdir: Path) -> int:
    """How many micro-batches the job reported its sinks met as already taken (the
    topic sink's "already published", the fold sink's skip): the exactly-once path a
    kill after the publish makes the restarted query take."""
    n = 0
    with contextlib.suppress(FileNotFoundError):
        for line in (workdir / "spark.log").read_text(errors="replace").splitlines():
            if line.startswith('{"event": "batch"'):
                with contextlib.suppress(ValueError, KeyError):
                    steps = json.loads(line)["steps"]
                    n += bool(steps["topic_replayed"] or steps["fold_skipped"])
    return n


def reported_through(workdir: Path) -> int:
    """The highest input seq a batch the job reported done had read: both its sinks
    had then taken the batch (the job reports a batch after its ``foreachBatch``)."""
    last = 0
    log = workdir / "spark.log"
    with contextlib.suppress(FileNotFoundError):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith('{"event": "batch"'):
                with contextlib.suppress(ValueError, KeyError):
                    last = max(last, int(json.loads(line)["seq"]))
    return last
