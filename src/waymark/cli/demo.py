"""``waymark demo``: a click stream through Spark, a driver SIGKILL, and proof of exactly once.

1. starts ``waymark serve`` as a subprocess on a temporary ``--data-dir``;
2. produces a click stream (default 1M events over 50k users, skewed like real
   traffic) with a few concurrent producers, 2000 records per POST, and keeps
   the ground truth — each user's events, purchases and cents — on the side;
3. runs the Spark job of :mod:`waymark.spark.demo_job` as a child process:
   per micro-batch, per-user deltas go to an output topic (exactly-once sink)
   and into a fold store (fold sink, ``merge`` adds);
4. SIGKILLs the driver's whole process group mid-run and restarts it from its
   checkpoint;
5. verifies both outputs against the ground truth: events lost and duplicated
   must both be 0 (exit status 1 otherwise).
"""

from __future__ import annotations

import json
import math
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from waymark.cli.extras import require
from waymark.cli.relocate import relocate

if TYPE_CHECKING:
    import numpy as np
    from rich.console import Console

INPUT_TOPIC = "demo.clicks"
OUTPUT_TOPIC = "demo.user-deltas"
ACTIONS = (b"view", b"click", b"add_to_cart", b"purchase")
ACTION_WEIGHTS = (0.62, 0.28, 0.07, 0.03)
PURCHASE = 3


def register(app: typer.Typer) -> None:
    demo_app = typer.Typer(
        help="Demos: with no subcommand, the main job (click stream -> Spark -> exactly once)."
    )
    demo_app.command("relocate")(relocate)
    app.add_typer(demo_app, name="demo")

    @demo_app.callback(invoke_without_command=True)
    def demo(
        ctx: typer.Context,
        events: Annotated[int, typer.Option(help="Click events to produce.", min=1)] = 1_000_000,
        users: Annotated[int, typer.Option(help="Distinct users (skewed popularity).", min=1)] = (
            50_000
        ),
        producers: Annotated[int, typer.Option(help="Concurrent producers.", min=1)] = 3,
        batch: Annotated[
            int, typer.Option(help="Records per producer POST (at most 10000).", min=1, max=10_000)
        ] = 2_000,
        max_per_trigger: Annotated[
            int,
            typer.Option(
                help="maxOffsetsPerTrigger: events per Spark micro-batch (each batch costs "
                "~0.2 s fixed, so fewer, larger batches are faster).",
                min=1,
            ),
        ] = 250_000,
        kill_at: Annotated[
            float,
            typer.Option(
                help="SIGKILL the Spark driver once this fraction of the events is "
                "aggregated (then restart it from its checkpoint); 0 disables the kill.",
                min=0.0,
                max=0.99,
            ),
        ] = 0.4,
        store: Annotated[
            str, typer.Option(help="Fold store backend: append-log, lmdb or rocksdb.")
        ] = "lmdb",
        seed: Annotated[int, typer.Option(help="Seed of the event generator.")] = 7,
        master: Annotated[
            str | None,
            typer.Option(
                help="Run the Spark job on a standalone cluster, spark://HOST:PORT (see "
                "`waymark cluster up`); default: local[2] in the driver's process.",
            ),
        ] = None,
        work_dir: Annotated[
            Path | None,
            typer.Option(
                help="Keep the server data, Spark checkpoint, fold and logs here "
                "(default: a temporary directory, removed afterwards)."
            ),
        ] = None,
    ) -> None:
        """Run the main job: click stream -> Spark (SIGKILLed and restarted) -> topic + fold,
        verified against the ground truth (lost = 0, duplicated = 0)."""
        if ctx.invoked_subcommand is not None:
            return
        require("demo", "server", "kv", "spark")
        from rich.console import Console

        from waymark.kv.stores import BACKENDS

        if store not in BACKENDS:
            raise typer.BadParameter(f"--store is one of {', '.join(BACKENDS)}")
        console = Console()
        if not console.is_terminal:  # logs and pipes: don't wrap the tables at 80 columns
            console = Console(width=120)
        if master is not None and not master.startswith("spark://"):
            raise typer.BadParameter("--master is spark://HOST:PORT")
        if kill_at and _kill_point(events, max_per_trigger, kill_at) >= events:
            # Batches end at multiples of maxOffsetsPerTrigger at the most: none would end
            # between the kill point and the last event, so the kill could never land.
            raise typer.BadParameter(
                f"with --max-per-trigger {max_per_trigger:,} no micro-batch of the "
                f"{events:,} events ends past {kill_at:.0%} and before the last one, so the "
                f"kill could not land mid-run: pass --max-per-trigger "
                f"{max(1, events // 5):,} (or --kill-at 0)"
            )
        settings = DemoOptions(events, users, producers, batch, max_per_trigger, kill_at,
                               store, seed, master)  # fmt: skip
        with _work_dir(work_dir, console) as root:
            ok = Demo(settings, root, console).run()
            if not ok:
                raise typer.Exit(1)


@dataclass(frozen=True)
class DemoOptions:
    events: int
    users: int
    producers: int
    batch: int
    max_per_trigger: int
    kill_at: float
    store: str
    seed: int
    master: str | None = None


def _kill_point(events: int, max_per_trigger: int, kill_at: float) -> int:
    """The first batch boundary at or past the kill fraction, if batches are full."""
    return -(-math.ceil(kill_at * events) // max_per_trigger) * max_per_trigger


@contextmanager
def _work_dir(given: Path | None, console: Console) -> Iterator[Path]:
    """``given``, or a temporary directory removed once the demo passed: a failed run
    keeps it, since the logs its failure points to are in it."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    tmp = Path(tempfile.mkdtemp(prefix="waymark-demo-"))
    try:
        yield tmp
    except BaseException:
        console.print(f"kept {tmp} (server data, checkpoint, fold and logs) for a look")
        raise
    shutil.rmtree(tmp, ignore_errors=True)


# --- the ground truth and the event stream ------------------------------------------------


@dataclass
class Truth:
    """Per user: events, purchases and cents, computed by the producer side only."""

    events: np.ndarray
    purchases: np.ndarray
    cents: np.ndarray


def user_name(i: int) -> str:
    return f"user-{i:06d}"


class Stream:
    """The demo's click events, generated up front (numpy) so producers only encode and send."""

    def __init__(self, events: int, users: int, seed: int) -> None:
        import numpy as np

        rng = np.random.default_rng(seed)
        popularity = 1.0 / np.arange(1, users + 1) ** 0.8  # a few heavy users, a long tail
        ranks = rng.permutation(users)  # popularity is not alphabetical
        self.user = ranks[rng.choice(users, size=events, p=popularity / popularity.sum())]
        self.action = rng.choice(len(ACTIONS), size=events, p=ACTION_WEIGHTS)
        self.page = rng.integers(1, 5_000, size=events)
        purchase = self.action == PURCHASE
        self.cents = np.where(purchase, rng.integers(199, 25_000, size=events), 0)
        self.ts = 1_790_000_000_000 + np.arange(events) * 3
        self.truth = Truth(
            events=np.bincount(self.user, minlength=users),
            purchases=np.bincount(self.user[purchase], minlength=users),
            cents=np.bincount(self.user, weights=self.cents, minlength=users)
            .round()
            .astype(np.int64),
        )

    def body(self, lo: int, hi: int) -> bytes:
        """Records ``lo..hi-1`` as one append request body."""
        users = self.user[lo:hi].tolist()
        actions = self.action[lo:hi].tolist()
        pages = self.page[lo:hi].tolist()
        cents = self.cents[lo:hi].tolist()
        ts = self.ts[lo:hi].tolist()
        out = []
        for u, a, p, c, t in zip(users, actions, pages, cents, ts, strict=True):
            if a == PURCHASE:
                out.append(
                    b'{"data":{"user":"user-%06d","action":"purchase","page":"/product/%d",'
                    b'"cents":%d,"ts":%d}}' % (u, p, c, t)
                )
            else:
                out.append(
                    b'{"data":{"user":"user-%06d","action":"%s","page":"/product/%d","ts":%d}}'
                    % (u, ACTIONS[a], p, t)
                )
        return b'{"records":[' + b",".join(out) + b"]}"


# --- the demo -------------------------------------------------------------------------------


@dataclass
class Timeline:
    produced_s: float = 0.0
    produce_rate: float = 0.0
    job_s: float = 0.0
    driver_starts: list[float] = field(default_factory=list)
    batches: int = 0
    kill: str = "no kill"
    replayed: str = "-"


class Demo:
    def __init__(self, settings: DemoOptions, root: Path, console: Console) -> None:
        self.s = settings
        self.root = root
        self.console = console
        self.timeline = Timeline()
        self.fold_spec = f"{settings.store}:{root / 'fold'}"
        self.checkpoint = root / "checkpoint"
        self.job_log = root / "spark-driver.log"

    def run(self) -> bool:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        began = time.perf_counter()
        s = self.s
        self.console.print(
            f"[bold]waymark demo[/bold]: {s.events:,} click events over {s.users:,} users -> "
            f"Spark (maxOffsetsPerTrigger {s.max_per_trigger:,}) -> topic [cyan]{OUTPUT_TOPIC}"
            f"[/cyan] + {s.store} fold; SIGKILL of the driver at {s.kill_at:.0%}; Spark on "
            f"{s.master or 'local[2]'}"
        )
        with _server(self.root / "server-data") as url:
            self.url = url
            self.console.print(f"topic server: {url} (data in {self.root / 'server-data'})")
            columns = (
                TextColumn("[progress.description]{task.description:<28}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>14}"),
                TimeElapsedColumn(),
            )
            with Progress(*columns, console=self.console) as progress:
                self.progress = progress
                job = self._start_job()  # Spark needs ~10 s to start: produce meanwhile
                try:
                    stream = Stream(s.events, s.users, s.seed)
                    self._produce(stream)
                    ok_job = self._follow(job)
                finally:
                    self.job.kill()  # a no-op once it has exited; never leave a driver behind
            if not ok_job:
                if self.job.process.returncode:  # else _follow said what went wrong
                    self.console.print(f"[red]the Spark job failed[/red]; its log: {self.job_log}")
                    self._tail_log()
                return False
            checks = self._verify(stream.truth)
        wall = time.perf_counter() - began
        return self._report(checks, wall)

    # --- producing ------------------------------------------------------------------------
    def _produce(self, stream: Stream) -> None:
        import httpx

        s = self.s
        task = self.progress.add_task("producing demo.clicks", total=s.events, rate="")
        chunks = iter(range(0, s.events, s.batch))
        lock = threading.Lock()
        errors: list[BaseException] = []
        began = time.perf_counter()

        def producer() -> None:
            with httpx.Client(base_url=self.url, timeout=60) as http:
                while True:
                    with lock:
                        lo = next(chunks, None)
                    if lo is None or errors:
                        return
                    hi = min(lo + s.batch, s.events)
                    try:
                        response = http.post(
                            f"/v0/topics/{INPUT_TOPIC}/records",
                            content=stream.body(lo, hi),
                            headers={"content-type": "application/json"},
                        )
                        response.raise_for_status()
                    except BaseException as e:  # surfaced after the join
                        errors.append(e)
                        return
                    done = hi - lo
                    elapsed = time.perf_counter() - began
                    with lock:
                        progress = self.progress
                        progress.advance(task, done)
                        completed = progress.tasks[task].completed
                    progress.update(task, rate=f"{completed / elapsed:,.0f} ev/s")

        threads = [threading.Thread(target=producer) for _ in range(s.producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise SystemExit(f"a producer failed: {errors[0]!r}")  # message on stderr, exit 1
        self.timeline.produced_s = time.perf_counter() - began
        self.timeline.produce_rate = s.events / self.timeline.produced_s

    # --- the Spark job ------------------------------------------------------------------------
    def _job_args(self) -> list[str]:
        from waymark.spark.demo_job import JobConfig

        cfg = JobConfig(self.url, INPUT_TOPIC, OUTPUT_TOPIC, self.fold_spec,
                        str(self.checkpoint), self.s.max_per_trigger, self.s.events,
                        self.s.master)  # fmt: skip
        return [sys.executable, "-m", "waymark.spark.demo_job", *cfg.args()]

    def _start_job(self) -> SparkDriver:
        task = getattr(self, "spark_task", None)
        if task is None:
            self.spark_task = self.progress.add_task(
                "spark: starting driver", total=self.s.events, rate=""
            )
        else:
            self.progress.update(task, description="spark: restarting driver")
        self.job = SparkDriver(self._job_args(), self.job_log)
        return self.job

    def _follow(self, job: SparkDriver) -> bool:
        """Show the job's batches; SIGKILL it at ``kill_at`` and restart it once."""
        s = self.s
        job_began = time.perf_counter()
        killed = s.kill_at == 0
        last_ms = 500
        while True:
            event = job.next_event()
            if event is None:  # the driver exited
                code = job.wait()
                self.timeline.job_s = time.perf_counter() - job_began
                if code != 0:
                    return False
                if not killed:
                    self.console.print(
                        "[red]the job finished before the kill point[/red]: lower --kill-at or "
                        "--max-per-trigger so the kill lands mid-run"
                    )
                    return False
                return True
            kind = event["event"]
            if kind == "ready":
                self.timeline.driver_starts.append(event["seconds"])
                self.progress.update(self.spark_task, description="spark: aggregating")
                self.progress.console.print(
                    f"spark driver pid {job.pid} ready in {event['seconds']:.1f}s"
                )
            elif kind == "batch":
                self.timeline.batches += 1
                last_ms = event.get("ms") or last_ms
                self.progress.update(self.spark_task, completed=event["seq"],
                                     rate=f"batch {event['batch']}")  # fmt: skip
                steps = event.get("steps") or {}
                replay = [
                    what
                    for what, flag in (
                        ("topic: already published", "topic_replayed"),
                        ("fold: already folded, skipped", "fold_skipped"),
                    )
                    if steps.get(flag)
                ]
                if replay:
                    self.timeline.replayed = f"batch {event['batch']}: " + "; ".join(replay)
                self.progress.console.print(
                    f"  batch {event['batch']:>3}: {event['rows']:>9,} events -> "
                    f"{steps.get('users', 0):>7,} user deltas in {last_ms / 1000:5.2f}s "
                    f"(aggregate {steps.get('aggregate_s', 0):.2f}s, topic "
                    f"{steps.get('topic_s', 0):.2f}s, fold {steps.get('fold_s', 0):.2f}s)"
                    + (f" [yellow]replay: {'; '.join(replay)}[/yellow]" if replay else "")
                )
                if not killed and s.kill_at * s.events <= event["seq"] < s.events:
                    # Land inside the next batch: somewhere in its read, aggregate, topic
                    # publish or fold apply, wherever the random delay falls.
                    time.sleep(random.uniform(0.1, 0.8) * last_ms / 1000)
                    job.kill()
                    killed = True
                    self._after_kill(event["batch"])
                    job = self._start_job()

    def _after_kill(self, last_reported: int) -> None:
        """What the SIGKILL left behind: which of the batch's steps had happened."""
        from waymark.kv.stores import open_store

        offsets = _latest(self.checkpoint / "offsets")
        commits = _latest(self.checkpoint / "commits")
        store = open_store(self.fold_spec)
        try:
            cursor = store.cursor
            folded = None if cursor.is_none else cursor.as_u64()
        finally:
            store.close()
        published = max((r["batch"] for r in _read_topic(self.url, OUTPUT_TOPIC)), default=None)
        state = (f"offsets/{offsets} written, commits/{commits} last; output topic has batch "
                 f"{published}; fold at batch {folded}")  # fmt: skip
        self.timeline.kill = f"during batch {last_reported + 1}: {state}"
        if offsets is not None and offsets != commits:
            self.timeline.replayed = f"batch {offsets}: Spark replays it (same id and offsets)"
        self.progress.console.print(f"[bold red]SIGKILL[/bold red] the driver: {state}")

    def _tail_log(self) -> None:
        try:
            lines = self.job_log.read_text(errors="replace").splitlines()
        except OSError:
            return
        for line in [x for x in lines if not x.startswith("\tat ")][-25:]:
            self.console.print(line, markup=False, highlight=False)

    # --- verification ----------------------------------------------------------------------
    def _verify(self, truth: Truth) -> list[Check]:
        from waymark.kv.stores import open_store

        rows = _read_topic(self.url, OUTPUT_TOPIC)
        topic = verify_rows(truth, rows)
        store = open_store(self.fold_spec)
        try:
            fold = verify_fold(truth, {e.key: json.loads(e.value) for e in store.range()})
        finally:
            store.close()
        return [topic, fold]

    def _report(self, checks: list[Check], wall: float) -> bool:
        from rich.table import Table

        s, t = self.s, self.timeline
        ok = all(c.ok for c in checks)
        run = Table(title="waymark demo: the run", title_justify="left")
        run.add_column("", style="bold")
        run.add_column("")
        run.add_row("events", f"{s.events:,} clicks over {s.users:,} users")
        run.add_row("produced", f"{t.produced_s:.2f}s by {s.producers} producers, "
                    f"{s.batch:,} per POST: {t.produce_rate:,.0f} events/s "
                    "(alongside the Spark driver's start-up)")  # fmt: skip
        run.add_row("Spark master", s.master or "local[2] (in the driver's process)")
        starts = " + ".join(f"{x:.1f}s" for x in t.driver_starts)
        run.add_row("Spark job", f"{t.job_s:.1f}s incl. driver start-ups {starts}; "
                    f"{t.batches} micro-batches of <= {s.max_per_trigger:,}")  # fmt: skip
        run.add_row("pipeline rate", f"{s.events / t.job_s:,.0f} events/s over the job, "
                    f"{s.events / wall:,.0f} events/s end to end")  # fmt: skip
        run.add_row("driver SIGKILL", t.kill)
        run.add_row("replayed on restart", t.replayed)
        run.add_row("wall time", f"{wall:.1f}s")
        self.console.print(run)
        table = Table(title="verified against the producer's ground truth", title_justify="left")
        for name in ("output", "rows", "events counted", "lost", "duplicated", "users wrong",
                     "verdict"):  # fmt: skip
            table.add_column(name, justify="left" if name in ("output", "verdict") else "right")
        for c in checks:
            table.add_row(
                c.name, f"{c.rows:,}", f"{c.counted:,}", _red(c.lost), _red(c.duplicated),
                _red(c.users_wrong), "[green]exactly once[/green]" if c.ok else "[red]FAILED[/red]",
            )  # fmt: skip
        self.console.print(table)
        for c in checks:
            for problem in c.problems[:5]:
                self.console.print(f"[red]{c.name}[/red]: {problem}")
        self.console.print(
            "[bold green]records lost = 0, duplicated = 0[/bold green]"
            if ok
            else "[bold red]verification failed[/bold red]"
        )
        return ok


def _red(n: int) -> str:
    return f"{n:,}" if n == 0 else f"[red]{n:,}[/red]"


@dataclass
class Check:
    name: str
    rows: int = 0
    counted: int = 0  # events the output accounts for
    lost: int = 0  # events of the truth the output misses
    duplicated: int = 0  # events the output counts more often than they happened
    users_wrong: int = 0  # users whose purchases or cents differ from the truth
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.users_wrong or self.problems)


def _compare(check: Check, truth: Truth, got: dict[str, list[int]]) -> Check:
    """Fill lost/duplicated/users_wrong from per-user ``[events, purchases, cents]``."""
    known = {user_name(i): i for i in range(len(truth.events))}
    for user in got.keys() - known.keys():
        check.problems.append(f"user {user!r} is not in the stream")
        check.duplicated += got[user][0]
    for user, i in known.items():
        events, purchases, cents = got.get(user, (0, 0, 0))
        want = int(truth.events[i])
        check.counted += events
        check.lost += max(0, want - events)
        check.duplicated += max(0, events - want)
        if purchases != int(truth.purchases[i]) or cents != int(truth.cents[i]):
            check.users_wrong += 1
    return check


def verify_rows(truth: Truth, rows: list[dict[str, Any]]) -> Check:
    """The output topic: per-(batch, user) deltas; each pair once, sums equal to the truth."""
    check = Check(f"topic {OUTPUT_TOPIC}", rows=len(rows))
    seen: set[tuple[int, str]] = set()
    got: dict[str, list[int]] = {}
    for row in rows:
        key = (row["batch"], row["user"])
        if key in seen:
            check.problems.append(f"batch {key[0]} user {key[1]} appears twice")
        seen.add(key)
        total = got.setdefault(row["user"], [0, 0, 0])
        total[0] += row["events"]
        total[1] += row["purchases"]
        total[2] += row["cents"]
    return _compare(check, truth, got)


def verify_fold(truth: Truth, values: dict[str, dict[str, int]]) -> Check:
    """The fold: per-user totals equal to the truth."""
    got = {k: [v["events"], v["purchases"], v["cents"]] for k, v in values.items()}
    return _compare(Check("fold (per-user totals)", rows=len(values)), truth, got)


# --- processes and HTTP -------------------------------------------------------------------


class SparkDriver:
    """The Spark driver as a child process in its own process group (JVM and workers too)."""

    def __init__(self, args: list[str], log: Path) -> None:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
        with log.open("ab") as err:
            self.process = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True
            )
        self.pid = self.process.pid
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(b"{"):
                self.events.put(json.loads(line))
        self.events.put(None)

    def next_event(self) -> dict[str, Any] | None:
        return self.events.get()

    def kill(self) -> None:
        """SIGKILL the driver's whole process group (JVM and Python workers too)."""
        if self.process.poll() is None:  # never signal a group id that may be reused
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()

    def wait(self) -> int:
        return self.process.wait()


def _latest(directory: Path) -> int | None:
    ids = [int(p.name) for p in directory.glob("[0-9]*") if p.name.isdigit()]
    return max(ids, default=None)


def _read_topic(url: str, topic: str) -> list[dict[str, Any]]:
    """Every record's data in the topic, in seq order."""
    from waymark.client import ApiError, Client, ErrorCode
    from waymark.protocol import MAX_DIFF_LIMIT

    out: list[dict[str, Any]] = []
    cursor = 0
    with Client(url, timeout=60) as client:
        while True:
            try:
                page = client.diff(topic, cursor, limit=MAX_DIFF_LIMIT)
            except ApiError as error:
                if error.code == ErrorCode.TOPIC_NOT_FOUND:
                    return out
                raise
            out += [r.data for r in page.records]
            if page.caught_up:
                return out
            cursor = page.next_from_seq


@contextmanager
def _server(data_dir: Path) -> Iterator[str]:
    with (data_dir.parent / "server.log").open("ab") as log:
        yield from _serve(data_dir, log)


def _serve(data_dir: Path, log: Any) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", "from waymark.cli import main; main()", "serve",
         "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("waymark listening on "):
            raise SystemExit(f"the topic server did not start: {line!r}")
        yield line.split()[-1]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
