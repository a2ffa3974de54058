"""Running a pipeline's stages: one thread per stage, restarts from the checkpoint
after a failure, stats in the rendezvous store for ``waymark pipeline status``, and
Prometheus metrics (docs/pipeline.md, "Metrics")."""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import msgspec
import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from waymark.client import ApiError, Client, ErrorCode, TransportError
from waymark.clock import Clock, SystemClock
from waymark.objstore import ObjectStore, ObjectStoreError, open_store
from waymark.pipeline.behind import Behind
from waymark.pipeline.edge import (
    EdgeOwned,
    EdgeUnavailable,
    RelocatableQueueEdge,
    client_factory,
)
from waymark.pipeline.identity import PipelineIdentity, establish
from waymark.pipeline.locator import HandoffReader, HandoffRolledBack
from waymark.pipeline.patience import PatientStore
from waymark.pipeline.report import ReportFenced, ReportPublisher, StageReport, load_report
from waymark.pipeline.restart import RestartPolicy, Restarts
from waymark.pipeline.shard import ShardedEdge, ShardLeases, check_layout, part_name
from waymark.pipeline.spec import EdgePart, PipelineSpec
from waymark.pipeline.stage import Sink, SinkUnavailable, Stage, StageFunctionFailed
from waymark.pipeline.state import StageFenced, StageStateStore
from waymark.pipeline.status import edge_lag, edge_statuses, pipeline_status

log = logging.getLogger(__name__)

# How long an idle stage waits before it looks again (a consumer's long poll of its
# edge, a finished source's pause between reads of its consumers' acknowledgements): a
# quarter of the time it has been idle, within these bounds. Short after work, so a
# stage sees its upstream finish within about a quarter of the time that took (the
# end of a run is seen hop by hop, each stage waiting on the one before); growing while
# it stays idle, so an idle pipeline asks its servers and store little
# (docs/pipeline.md, "Running it").
IDLE_WAIT_MS = (10, 100)


def idle_wait_ms(idle_ms: int) -> int:
    """The wait of a stage idle for ``idle_ms`` (0 after a busy step)."""
    low, high = IDLE_WAIT_MS
    return min(high, max(low, idle_ms // 4))


# A stage holds at most this many batches unacknowledged on an output edge before it
# waits for its consumer (docs/pipeline.md, "Flow control"); the consumer gives credit
# back, a save, every 1/SAVE_EVERY_PART of that window it takes, so a producer at full
# speed does not run dry while the save is on its way.
IN_FLIGHT_BATCHES = 16
SAVE_EVERY_PART = 2

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def build_stage(
    spec: PipelineSpec,
    name: str,
    store: ObjectStore,
    clock: Clock,
    identity: PipelineIdentity,
    poison: dict[bytes, tuple[int, str]] | None = None,
    shard: int | None = None,
    landed: Callable[[], None] | None = None,
) -> Stage:
    """A stage of ``spec`` (its shard ``shard`` when it has instances) as the runner
    starts it (and starts it again after a failure); ``poison``: the events it
    dead-letters instead of calling its function on them; ``landed``: called after
    each of its checkpoint saves."""
    stage_spec = spec.stages[name]
    connect = client_factory()

    def edge(part: EdgePart) -> RelocatableQueueEdge:
        e = spec.edges[part.edge]
        return RelocatableQueueEdge(part.name, e.candidates, store, consumer=part.consumer,
                                    capacity=e.capacity, connect=connect, clock=clock,
                                    identity=identity)  # fmt: skip

    def output(edge_name: str) -> RelocatableQueueEdge | ShardedEdge:
        parts = spec.parts(edge_name)
        if parts[0].shard is None:
            return edge(parts[0])
        # read by a sharded stage: each record goes to its shard's part
        # (docs/semantics/pipeline.md §11.1)
        return ShardedEdge(edge_name, [edge(p) for p in parts])

    source = spec.parts(stage_spec.input)[shard or 0] if stage_spec.input else None
    sink, dead = stage_spec.sink, spec.dead_letter
    # Saved at least every half of the smallest window a producer of its input holds,
    # so that a producer at full speed hears of acknowledgements before its window is
    # full (docs/pipeline.md, "Flow control").
    windows = [IN_FLIGHT_BATCHES * s.batch for s in spec.stages.values()
               if stage_spec.input is not None and stage_spec.input in s.outputs]  # fmt: skip
    return Stage(
        name, stage_spec.load(), states=StageStateStore(store), clock=clock,
        input=edge(source) if source else None,
        output=[output(o) for o in stage_spec.outputs],
        sink=Sink(sink.url, sink.topic, connect=connect) if sink else None,
        events=stage_spec.events, batch=stage_spec.batch, identity=identity,
        dead_letter=Sink(dead.url, dead.topic, connect=connect) if dead else None, poison=poison,
        checkpoint_interval_ms=spec.checkpoint_interval_ms,
        save_every=min(windows) // SAVE_EVERY_PART if windows else None,
        max_in_flight=IN_FLIGHT_BATCHES * stage_spec.batch,
        # each batch's writes overlap the next one's read (docs/semantics/pipeline.md §4.5)
        behind=Behind(f"stage-{name if shard is None else part_name(name, shard)}-writes",
                      landed),
        key=part_name(name, shard) if shard is not None else None,
    )  # fmt: skip


def physical_edges(stage: Stage) -> list[RelocatableQueueEdge]:
    """The stage's edges as placed: a sharded output's parts one by one."""
    edges = [stage.input] if stage.input is not None else []
    for out in stage.outputs:
        edges += out.parts if isinstance(out, ShardedEdge) else [out]
    return edges


@dataclass
class StageRun:
    """One stage's thread (one per shard of a sharded stage): its current instance
    and the totals over its restarts."""

    name: str  # the state key: the stage, or <stage>.<k> for shard k
    stage_name: str = ""
    shard: int | None = None
    holding: bool = False  # a shard: whether this runner holds its lease
    stage: Stage | None = None
    report: StageReport = field(init=False)
    done: threading.Event = field(default_factory=threading.Event)
    failed: str | None = None  # why the stage stopped for good; the pipeline stops
    restarts: Restarts | None = None
    attempts: Counter[bytes] = field(default_factory=Counter)  # function failures per event
    poison: dict[bytes, tuple[int, str]] = field(default_factory=dict)  # to dead-letter

    def __post_init__(self) -> None:
        self.report = StageReport(stage=self.name)
        self.stage_name = self.stage_name or self.name


class PipelineRunner:
    """Runs the named stages of ``spec`` until each is done (or :meth:`stop`)."""

    def __init__(
        self,
        spec: PipelineSpec,
        stages: Iterable[str] | None = None,
        *,
        clock: Clock | None = None,
        report_interval_s: float = 0.5,
        restart: RestartPolicy | None = None,
        sleep: Callable[[float], object] | None = None,
        rng: random.Random | None = None,
        instance: int | None = None,
        report_to: str | None = None,
        token: str | None = None,
    ) -> None:
        """``restart`` defaults to the pipeline file's; ``sleep`` waits before a restart
        (default: until the delay passes or :meth:`stop`), a test injects one that
        advances a manual ``clock``, and ``rng`` for the jitter. ``instance``: which
        instance of the sharded stages this runner is (it claims that shard at once,
        and others only when their holder stops renewing); default: all of them.
        ``report_to`` (default: the file's): a server the pipeline's status goes to
        every ``report_every_s``, for its console, with ``token``."""
        self.spec = spec
        self.clock = clock or SystemClock()
        self._stop = threading.Event()
        self.sleep = sleep or self._stop.wait
        # Every call to the rendezvous store waits out an outage within its budget
        # (docs/semantics/pipeline.md §10).
        self.store = PatientStore(open_store(spec.handoff), clock=self.clock, sleep=self.sleep,
                                  cancel=self._stop, budget_s=spec.store_budget_s)  # fmt: skip
        # Created once per handoff store: it scopes every topic and id this run makes
        # (docs/semantics/pipeline.md §8).
        self.identity = establish(self.store, spec.name)
        names = (
            list(stages)
            if stages is not None
            else [name for name, stage in spec.stages.items() if not stage.external]
        )
        for name in names:
            if name not in spec.stages:
                raise KeyError(f"no stage {name!r} in pipeline {spec.name!r}")
            if spec.stages[name].external:
                raise KeyError(f"stage {name!r} is external: its own process runs it")
        self.restart = restart or spec.restart
        rng = rng or random.Random()
        self.runs: dict[str, StageRun] = {}
        # Who runs each shard of a sharded stage (docs/semantics/pipeline.md §11.2).
        self.leases: dict[str, ShardLeases] = {}
        for name, stage_spec in spec.stages.items():
            if stage_spec.input is not None:
                # A changed count would route events to shards other than those that
                # hold their records and checkpoints, in whichever process routes or
                # reads them (docs/semantics/pipeline.md §11.4).
                check_layout(self.store, name, stage_spec.instances)
        for name in names:
            stage_spec = spec.stages[name]
            if not stage_spec.sharded:
                self.runs[name] = StageRun(name, restarts=Restarts(self.restart, rng))
                continue
            if instance is not None and not 0 <= instance < stage_spec.instances:
                raise KeyError(f"stage {name!r} has instances 0 to {stage_spec.instances - 1}, "
                               f"not {instance}")  # fmt: skip
            home = range(stage_spec.instances) if instance is None else [instance]
            owner = f"{name}[{'*' if instance is None else instance}]/{uuid.uuid4().hex[:12]}"
            self.leases[name] = ShardLeases(self.store, name, stage_spec.instances, owner=owner,
                                            home=home, clock=self.clock,
                                            lease_ms=int(stage_spec.lease_s * 1000))  # fmt: skip
            for k, key in enumerate(stage_spec.state_keys()):
                self.runs[key] = StageRun(key, stage_name=name, shard=k,
                                          restarts=Restarts(self.restart, rng))  # fmt: skip
        if instance is not None and not self.leases:
            raise KeyError(f"an instance number is for a stage with instances > 1; none of "
                           f"{', '.join(names)} has")  # fmt: skip
        for run in self.runs.values():
            self._resume_report(run)
        self.report_interval_s = report_interval_s
        self.reports = ReportPublisher(self.store)
        self.report_to = report_to or spec.report_to
        self.reporter = (
            Client(self.report_to, timeout=5.0, connect_timeout=1.0, token=token)
            if self.report_to is not None else None
        )  # fmt: skip
        self._ended = threading.Condition()  # a stage finished or failed
        self._progress = threading.Condition()  # a stage's checkpoint save landed
        self._saves = 0  # how many did, under _progress
        self._failed_over = False
        self.registry = CollectorRegistry()
        self.registry.register(PipelineCollector(self))
        self.latency = LatencyHistogram()

    # --- the loop ---------------------------------------------------------------------
    def _upstream_done(self, stage: str) -> bool:
        """Whether every producer of the stage's input edge is done: one this runner
        runs by its run here, since its stored report may be an earlier run's on this
        handoff store (a rerun that resumes, docs/semantics/pipeline.md §11.3); another
        by its stored report."""
        edge = self.spec.stages[stage].input
        if edge is None:
            return True
        for key in self.spec.producer_keys(edge):
            local = self.runs.get(key)
            if local is not None:
                if not local.done.is_set():
                    return False
            elif not ((r := load_report(self.store, key)) is not None and r.done):
                return False
        return True

    def _fold(self, run: StageRun, stage: Stage) -> None:
        """Add a stage instance's counters to the run's totals (at a restart or the end)."""
        r = run.report
        for edge in physical_edges(stage):
            s = edge.stats
            r.relocations += s.relocations
            r.rebinds += s.rebinds
            r.fenced += s.fenced
            r.replayed += s.replayed
            r.stale_dropped += s.stale_dropped
            r.disconnects += s.disconnects
            r.recover_s += s.recover_s
            s.relocations = s.rebinds = s.fenced = s.replayed = s.stale_dropped = 0
            s.disconnects = 0
            s.recover_s = []
        r.processed += stage.stats.processed
        r.dead_lettered += stage.stats.dead_lettered
        stage.stats.processed = stage.stats.dead_lettered = 0
        phase = r.latency_after_ms if self._failed_over else r.latency_before_ms
        phase += stage.stats.latencies_ms[:: max(1, len(stage.stats.latencies_ms) // 50)]
        self.latency.observe_ms("after" if self._failed_over else "before",
                                stage.stats.latencies_ms)  # fmt: skip
        stage.stats.latencies_ms = []
        del r.latency_before_ms[:-500], r.latency_after_ms[:-500]

    def _publish(self, run: StageRun, *, required: bool = False, behind: bool = False) -> None:
        """Put the stage's report in the store. Best effort unless ``required`` (a
        finished stage's: its consumers wait for it); an outage past the store's budget
        is logged and the next report tries again. ``behind``: do not wait for it (the
        periodic report of a running stage)."""
        run.report.updated_ms = self.clock.now_ms()
        try:
            self.reports.publish(run.report, wait=not behind)
        except (ObjectStoreError, ReportFenced):
            if required:
                raise  # else logged, and the next report tries again (or is refused again)

    def _resume_report(self, run: StageRun) -> None:
        """The counters go on from the stage's (or shard's) last report: a restarted
        process, a rerun on the same store or a shard taken over does not reset them
        (docs/pipeline.md, "Running it")."""
        earlier = load_report(self.store, run.name)
        if earlier is not None:
            run.report = msgspec.structs.replace(earlier, done=False)

    def _drop(self, run: StageRun) -> None:
        """Drop the stage instance: its writes in the air end (their error ignored: a
        later instance writes them again from the checkpoint) and its thread with them;
        its counters go into the run's totals."""
        if run.stage is not None:
            run.stage.close()
            self._fold(run, run.stage)
        run.stage = None

    def _restart(self, run: StageRun, error: str) -> bool:
        """Drop the stage instance (and its memory); the next one starts from its
        checkpoint (docs/semantics/pipeline.md §4.3) after the policy's backoff. False
        when the failure-rate limit is passed: the stage ends and the pipeline stops
        (docs/semantics/pipeline.md §9.1)."""
        self._drop(run)
        run.report.last_error = error[:2000]
        assert run.restarts is not None
        wait = run.restarts.failed(self.clock.now_ms())
        if wait is None:
            policy = self.restart
            self._end(run, f"stage {run.name!r} failed more than {policy.max_restarts} times "
                           f"within {policy.window_s:g} s; last error: {error}")  # fmt: skip
            self._publish(run)
            return False
        run.report.restarts += 1
        self._publish(run)
        self.sleep(wait)
        return True

    def _poisoned(self, run: StageRun, failure: StageFunctionFailed) -> bool:
        """Count a function's failure on one event; after ``max_attempts`` the event is
        dead-lettered by the next instance. False when there is no dead-letter topic:
        the stage ends and the pipeline stops (docs/semantics/pipeline.md §9.2)."""
        run.attempts[failure.event] += 1
        attempts = run.attempts[failure.event]
        if attempts < self.restart.max_attempts:
            return True
        if self.spec.dead_letter is None:
            self._end(run, f"{failure}; it failed {attempts} times and the pipeline has no "
                           "dead_letter topic")  # fmt: skip
            self._drop(run)
            run.report.last_error = str(failure)[:2000]
            self._publish(run)
            return False
        run.poison[failure.event] = (attempts, failure.error)
        return True

    def _end(self, run: StageRun, failed: str | None = None) -> None:
        """The stage is over: finished, or ``failed`` for good, which stops every stage."""
        with self._ended:
            run.failed = failed
            run.done.set()
            self._ended.notify_all()
        if failed is not None:
            self._stop.set()

    def _shard_turn(self, run: StageRun) -> bool | None:
        """Whether this runner may step shard ``run`` now: True while it holds the
        shard's lease; False (after a short wait) while another instance does; None once
        the shard is done, by whichever instance ran it (docs/semantics/pipeline.md §11.2)."""
        assert run.shard is not None
        if self.leases[run.stage_name].owns(run.shard):
            if not run.holding:
                run.holding = True
                self._resume_report(run)  # from the report of whoever ran it before
            return True
        if run.holding:
            # Taken over: the instance is dropped, not restarted. Its report is not
            # published: the new holder's counters go on from the last one.
            log.warning("stage %s: the shard is another instance's now; standing by", run.name)
            run.holding = False
            self._drop(run)
        # Done by whichever instance ran it, unless its producers have more for it: a
        # rerun on this store with more events finds the report of the earlier run
        # (docs/semantics/pipeline.md §11.3).
        report = load_report(self.store, run.name)
        if report is not None and report.done and self._upstream_done(run.stage_name):
            return None
        self._stop.wait(0.1)
        return False

    def _hold_leases(self) -> None:
        """Renew the shards this runner holds and take over those nobody renews."""
        if not self.leases:
            return
        interval_s = min(lease.lease_ms for lease in self.leases.values()) / 4000
        while not self._stop.is_set():
            for lease in self.leases.values():
                try:
                    lease.tick()
                except ObjectStoreError as error:  # out past its budget: next round
                    log.warning("shards of %s: the store: %s", lease.stage, error)
            self._stop.wait(interval_s)

    def _run_stage(self, run: StageRun) -> None:
        try:
            self._steps(run)
        finally:
            if run.stage is not None:
                run.stage.close()

    def _steps(self, run: StageRun) -> None:
        last_report_ms: int | None = None
        idle = False
        busy_ms = self.clock.now_ms()  # when the stage last took work
        last_unacked = -1  # a source's unacknowledged records after its last idle step
        while not self._stop.is_set():
            try:
                if run.shard is not None:
                    turn = self._shard_turn(run)
                    if turn is None:
                        self._end(run)
                        return
                    if not turn:
                        continue
                if run.stage is None:
                    run.stage = build_stage(self.spec, run.stage_name, self.store, self.clock,
                                            self.identity, run.poison, run.shard,
                                            self._saved)  # fmt: skip
                    run.stage.start()
                    # its reports carry the incarnation it claimed: once a newer
                    # instance claims the stage, they are refused
                    # (docs/semantics/pipeline.md §4.7)
                    run.report.incarnation = run.stage.state.incarnation
                stage = run.stage
                saves = self._saves  # a save landing after this wakes the wait below
                idle_ms = self.clock.now_ms() - busy_ms if idle else 0
                taken = stage.step(wait_ms=idle_wait_ms(idle_ms) if stage.input is not None else 0)
                idle = taken == 0
                if not idle:
                    busy_ms = self.clock.now_ms()
                report_due = last_report_ms is None or (
                    self.clock.now_ms() - last_report_ms >= self.report_interval_s * 1000
                )
                if report_due:
                    # the report counts the writes in the air too (not their save: a
                    # report need not wait for an fsync, docs/semantics/pipeline.md §4.6)
                    stage.join()
                assert run.restarts is not None
                run.restarts.succeeded()
            except StageFenced as error:
                if run.shard is not None:
                    # another instance took the shard over and runs it now
                    # (docs/semantics/pipeline.md §11.2)
                    log.warning("stage %s: %s; the shard is another instance's", run.name, error)
                    self.leases[run.stage_name].lose(run.shard)
                    continue
                # Another instance of this stage claimed it: it runs the stage now.
                log.error("stage %s: %s; this instance stops", run.name, error)
                self._end(run, f"stage {run.name!r} is superseded: {error}")
                return
            except (EdgeOwned, HandoffRolledBack) as error:
                # Another pipeline's topic, or a handoff store gone back in time: no
                # restart mends either (docs/semantics/pipeline.md §9.3).
                log.error("stage %s: %s", run.name, error)
                self._end(run, f"stage {run.name!r}: {error}")
                return
            except StageFunctionFailed as failure:
                log.warning("%s; restarting it from its checkpoint", failure)
                if not self._poisoned(run, failure) or not self._restart(run, str(failure)):
                    return
                continue
            except (EdgeUnavailable, SinkUnavailable, ObjectStoreError, OSError) as error:
                log.warning("stage %s: %s; restarting it from its checkpoint", run.name, error)
                if not self._restart(run, f"{type(error).__name__}: {error}"):
                    return
                continue
            except Exception as error:  # a bug: logged, retried from the checkpoint
                log.exception("stage %s failed; restarting it from its checkpoint", run.name)
                if not self._restart(run, f"{type(error).__name__}: {error}"):
                    return
                continue
            now_ms = self.clock.now_ms()
            try:
                # after an idle step, which leaves no writes in the air
                finished = idle and (stage.finished() if stage.input is None else (
                    not any(out.unacked for out in stage.outputs)
                    and self._upstream_done(stage.name)
                ))  # fmt: skip
                if finished or report_due:
                    self._fold(run, stage)
                    run.report.done = finished
                    self._publish(run, required=finished, behind=not finished)
                    last_report_ms = now_ms
            except ObjectStoreError as error:
                # the store stayed out past its budget: step on, ask again next time
                # (docs/semantics/pipeline.md §10)
                log.warning("stage %s: the store: %s", run.name, error)
                continue
            except ReportFenced as error:
                # A newer instance claimed the stage: it runs it and reports it; this
                # one's "done" is not the stage's (docs/semantics/pipeline.md §4.7).
                if run.shard is not None:
                    self.leases[run.stage_name].lose(run.shard)
                    continue  # the next turn stands by
                self._end(run, f"stage {run.name!r} is superseded: {error}")
                return
            if finished:
                self._end(run)
                return
            if idle and (stage.input is None or stage.held_back):
                # Everything produced, or an output's window full: wait for the
                # acknowledgements without spinning, woken by a checkpoint save of
                # any stage of this process (only a save acknowledges anything: being
                # woken by every step made a held-back stage step idle thousands of
                # times a run, docs/pipeline.md, "Flow control"); a newly acknowledged
                # record makes the next wait short again.
                unacked = sum(len(edge.unacked) for edge in physical_edges(stage))
                if unacked != last_unacked:
                    busy_ms, last_unacked = now_ms, unacked
                self._wait_for_save(saves, idle_wait_ms(now_ms - busy_ms) / 1000)

    def _wait_for_save(self, seen: int, timeout_s: float) -> None:
        """Wait until a save lands after the ``seen``-th (or ``timeout_s`` passes)."""
        with self._progress:
            if not self._stop.is_set():
                self._progress.wait_for(lambda: self._saves != seen, timeout_s)

    def _saved(self) -> None:
        """A stage's checkpoint save landed: wake the stages waiting for theirs."""
        with self._progress:
            self._saves += 1
            self._progress.notify_all()

    def _watch_generations(self) -> None:
        readers = [HandoffReader(self.store.inner, p.name) for p in self.spec.all_parts()]
        while not self._stop.wait(0.2):
            try:
                moved = any((loc := r.current()) is not None and loc.generation > 1
                            for r in readers)  # fmt: skip
            except ObjectStoreError:
                continue  # an outage: look again later
            if moved:
                self._failed_over = True
                return

    def report_status(self) -> None:
        """Send the pipeline's status to the ``report_to`` server, if any (best effort:
        the console shows the last one, marked stale once they stop)."""
        if self.reporter is None:
            return
        interval_ms = int(self.spec.report_every_s * 1000)
        try:
            self.reporter.report_pipeline(pipeline_status(self.spec, self.store.inner,
                                                   interval_ms=interval_ms))  # fmt: skip
        except ApiError as error:
            if error.code != ErrorCode.FENCED:
                log.warning("pipeline %s: its status report: %s", self.spec.name, error)
            else:  # read before the one the server keeps (docs/semantics/pipeline.md §4.7)
                log.info("pipeline %s: its status report is refused: %s", self.spec.name,
                         error.message)  # fmt: skip
        except (ObjectStoreError, TransportError) as error:
            log.warning("pipeline %s: its status report: %s", self.spec.name, error)

    def _report_statuses(self) -> None:
        while not self._stop.wait(self.spec.report_every_s):
            self.report_status()

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._watch_generations, daemon=True),
                   threading.Thread(target=self._hold_leases, daemon=True)]  # fmt: skip
        if self.reporter is not None:
            threads.append(threading.Thread(target=self._report_statuses, daemon=True))
        threads += [
            threading.Thread(
                target=self._run_stage, args=(run,), name=f"stage-{run.name}", daemon=True
            )
            for run in self.runs.values()
        ]
        for thread in threads:
            thread.start()
        return threads

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether every stage finished within ``timeout_s``; False at once when one
        failed for good (:meth:`failure`)."""
        with self._ended:
            self._ended.wait_for(
                lambda: (
                    self.failure() is not None
                    or all(run.done.is_set() for run in self.runs.values())
                ),
                timeout_s,
            )
        return self.failure() is None and all(run.done.is_set() for run in self.runs.values())

    def failure(self) -> str | None:
        """Why the pipeline stopped: the first stage that failed for good, or None."""
        return next((run.failed for run in self.runs.values() if run.failed), None)

    def stop(self) -> None:
        self._stop.set()


# --- what `status` and /metrics show -------------------------------------------------
class LatencyHistogram:
    """``waymark_pipeline_latency_seconds{phase}``: end-to-end latencies at the sink,
    counted a batch at a time (one ``Histogram.observe`` per event cost a sink stage
    about a fifth of its CPU)."""

    def __init__(self) -> None:
        self._bounds_ms = np.array(LATENCY_BUCKETS_S) * 1000
        self._lock = threading.Lock()
        self._counts: dict[str, np.ndarray] = {}  # per phase: one count per bucket, +Inf last
        self._sums_ms: Counter[str] = Counter()

    def observe_ms(self, phase: str, latencies_ms: list[int]) -> None:
        if not latencies_ms:
            return
        # bucket i counts the latencies at most its bound and above the one before
        buckets = np.searchsorted(self._bounds_ms, latencies_ms, side="left")
        counts = np.bincount(buckets, minlength=len(self._bounds_ms) + 1)
        with self._lock:
            self._counts[phase] = self._counts.get(phase, 0) + counts
            self._sums_ms[phase] += sum(latencies_ms)

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(
            "waymark_pipeline_latency_seconds",
            "End-to-end latency at the sink, before and after the first failover.",
            labels=["phase"],
        )
        with self._lock:
            for phase, counts in sorted(self._counts.items()):
                total = np.cumsum(counts).tolist()
                bounds = [floatToGoString(b) for b in LATENCY_BUCKETS_S] + ["+Inf"]
                family.add_metric([phase], list(zip(bounds, total, strict=True)),
                                  sum_value=self._sums_ms[phase] / 1000)  # fmt: skip
        return family


class PipelineCollector(Collector):
    """``waymark_pipeline_*`` metrics of the runner, read from the stages' reports and
    the handoff records at each scrape."""

    def __init__(self, runner: PipelineRunner) -> None:
        self.runner = runner

    def collect(self) -> Iterator[Metric]:
        runner = self.runner
        counters = {
            "relocations": "Placements of an edge this stage published.",
            "rebinds": "Placements this stage bound to (its own and others').",
            "fenced": "Publishes this stage lost to a concurrent producer.",
            "replayed": "Items this stage wrote again after its output edge moved.",
            "stale_dropped": "Items of an older generation this stage dropped.",
            "disconnects": "Failed requests to an edge server.",
            "restarts": "Restarts of this stage from its checkpoint.",
            "dead_lettered": "Poison events this stage sent to the dead-letter topic.",
            "processed": "Input records (or events) this stage took.",
        }
        for key, doc in counters.items():
            family = GaugeMetricFamily(f"waymark_pipeline_{key}", doc, labels=["stage"])
            for run in runner.runs.values():
                family.add_metric([run.name], getattr(run.report, key))
            yield family
        recover = GaugeMetricFamily(
            "waymark_pipeline_time_to_recover_seconds",
            "Longest time from a disconnect to the next success on an edge.", labels=["stage"],
        )  # fmt: skip
        for run in runner.runs.values():
            recover.add_metric([run.name], max(run.report.recover_s, default=0.0))
        yield recover
        generation = GaugeMetricFamily(
            "waymark_pipeline_edge_generation", "Current generation of each edge.",
            labels=["edge", "server"],
        )  # fmt: skip
        lag = GaugeMetricFamily(
            "waymark_pipeline_edge_lag",
            "Items (events) on each edge's current placement past its consumer's checkpoint.",
            labels=["edge"],
        )  # fmt: skip
        for status in edge_statuses(runner.spec, runner.store.inner):
            if status.locator is not None:
                generation.add_metric([status.edge, status.locator.server],
                                      status.locator.generation)  # fmt: skip
                behind = edge_lag(runner.spec, runner.store.inner, status)
                if behind is not None:
                    lag.add_metric([status.edge], behind.items)
        yield generation
        yield lag
        yield runner.latency.family()
