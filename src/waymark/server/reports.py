"""Status reports of folds, recovery clients and pipelines (docs/reports.md,
docs/pipeline.md).

The server keeps the newest report of each reporter in memory and in an internal
``disk`` log, one record per report tagged with the reporter: after each report the
reporter's older records are deleted, so the log holds one record per reporter and a
restart reads it back. Staleness and how far a recovery client is behind are worked
out when a report is read, with the engine's clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

import msgspec
from prometheus_client.core import GaugeMetricFamily, Metric

from ..log import CHANGES_TOPIC, Engine, ErrorCode, Limits, TagMatch, TopicError
from ..protocol import (
    Durability,
    FoldList,
    FoldReport,
    FoldStatus,
    LagSample,
    PipelineList,
    PipelineReport,
    PipelineStatus,
    RecordIn,
    RecoveryClient,
    RecoveryClientList,
    RecoveryReport,
)
from ..protocol.pipelines import LAG_HISTORY
from ..protocol.reports import STALE_INTERVALS
from .http import BodyDecoder, Request, Response

FOLDS_TOPIC = "waymark$folds"
RECOVERY_TOPIC = "waymark$recovery"
PIPELINES_TOPIC = "waymark$pipelines"

R = TypeVar("R", FoldReport, RecoveryReport, PipelineReport)
_encode = msgspec.json.encode


class _Kept(msgspec.Struct, Generic[R], array_like=True, frozen=True):
    """What the internal log stores per report: the report and when it arrived."""

    report: R
    reported_ms: int


class _Record(msgspec.Struct, Generic[R]):
    """A record of the internal log as the engine renders it (its ``$`` fields unread)."""

    data: _Kept[R]


class Kept(Generic[R]):
    """The newest report per reporter, durable in the internal log ``name``."""

    def __init__(self, engine: Engine, name: str, kind: type[R]) -> None:
        self.engine, self.name = engine, name
        engine.internal_log(name, Durability.DISK)
        self.latest: dict[str, _Kept[R]] = {}
        decoder: msgspec.json.Decoder[_Record[R]]
        decoder = msgspec.json.Decoder(_Record[kind])  # type: ignore[valid-type]
        cursor = 0
        while True:  # read back what a previous run kept
            page = engine.diff(name, cursor, limit=1000, per_record=True, touch=False)
            for run in page.runs:
                kept = decoder.decode(bytes(run)[:-1]).data
                self.latest[self.tag(kept.report)] = kept
            cursor = page.next_from_seq
            if page.caught_up:
                break

    @staticmethod
    def tag(report: FoldReport | RecoveryReport | PipelineReport) -> str:
        if isinstance(report, FoldReport):
            return f"{report.fold}/{report.node}"
        if isinstance(report, PipelineReport):
            return f"{report.pipeline}/{report.run or ''}"
        return report.client

    def store(self, report: R) -> _Kept[R]:
        """Keep ``report`` as its reporter's newest (not yet durable: see :meth:`keep`)."""
        engine, tag = self.engine, self.tag(report)
        kept = _Kept(report, engine.clock.now_ms())
        record = RecordIn(msgspec.Raw(_encode(kept)), tag=tag)
        seq = engine.append(self.name, [record], create=False).seqs[0]
        # Only the newest record of a reporter is kept (the log stays one per reporter).
        engine.delete(self.name, before_seq=seq, match=TagMatch(True, tag))
        self.latest[tag] = kept
        return kept

    async def keep(self, report: R) -> _Kept[R]:
        """:meth:`store`, answered once it is durable."""
        kept = self.store(report)
        await self._durable()
        return kept

    def drop(self, tags: list[str]) -> list[_Kept[R]]:
        """Forget the reporters ``tags`` (a node or client taken out of service) in memory
        and in the log (not yet durable: see :meth:`forget`)."""
        for tag in tags:
            self.engine.delete(self.name, match=TagMatch(True, tag))
        return [self.latest.pop(tag) for tag in tags]

    async def forget(self, tags: list[str]) -> list[_Kept[R]]:
        """:meth:`drop`, answered once durable: a restart does not bring them back."""
        gone = self.drop(tags)
        await self._durable()
        return gone

    async def _durable(self) -> None:
        commit = self.engine.commit_point(self.name)
        if commit is not None:
            await commit.wait()


def _age(kept: _Kept[R], now: int) -> tuple[int, bool]:
    age = max(now - kept.reported_ms, 0)
    return age, age > STALE_INTERVALS * kept.report.interval_ms


def check_fold(report: FoldReport) -> None:
    """Refuse a fold report the msgspec constraints let through: one whose cursor is
    past the bucket it folds (its lag would be negative)."""
    if report.cursor > report.bucket_seq:
        raise TopicError(ErrorCode.INVALID_REQUEST,
                         "cursor is past bucket_seq: read the cursor, then the bucket",
                         {"cursor": report.cursor, "bucket_seq": report.bucket_seq})  # fmt: skip


def fold_status(kept: _Kept[FoldReport], now: int) -> FoldStatus:
    r = kept.report
    age, stale = _age(kept, now)
    stale = stale and r.stopped is None  # a node that said it ended is not missing
    return FoldStatus(r.fold, r.node, r.backend, r.bucket, r.cursor, r.bucket_seq,
                      r.bucket_seq - r.cursor, r.interval_ms, r.export, kept.reported_ms, age,
                      stale, r.role, r.lease_holder, r.restore, r.stopped)  # fmt: skip


def check_pipeline(sent: PipelineReport, kept: PipelineReport | None) -> None:
    """Refuse a pipeline report older than the one kept for its run: a stage report of
    an older incarnation or serial (or none where one is kept), a shard of an older
    lease epoch, an edge of an older generation. Each only goes up in the pipeline's
    store, so such a report was read from it before the kept one: a runner paused
    between its read and its post (docs/semantics/pipeline.md §4.7)."""
    if kept is None:
        return
    older: list[tuple[str, object, object]] = []  # (what, kept, sent)
    for key, had in kept.stages.items():
        if had is None or key not in sent.stages:  # a stage the file no longer has
            continue
        got = sent.stages[key]
        fence = None if got is None else [got.incarnation, got.serial]
        if fence is None or fence < [had.incarnation, had.serial]:
            older.append((f"stage {key}", [had.incarnation, had.serial], fence))
    for key, lease in kept.shards.items():
        if lease is None or key not in sent.shards:
            continue
        mine = sent.shards[key]
        if mine is None or mine.epoch < lease.epoch:
            older.append((f"shard {key}", lease.epoch, None if mine is None else mine.epoch))
    for key, edge in kept.edges.items():
        if key in sent.edges and sent.edges[key].generation < edge.generation:
            older.append((f"edge {key}", edge.generation, sent.edges[key].generation))
    if older:
        part, has, sends = older[0]
        raise TopicError(
            ErrorCode.FENCED,
            f"a newer report of this pipeline run is kept: {part} is at {has} there, "
            f"{sends} in this one",
            {"reason": "report_stale", "pipeline": sent.pipeline, "run": sent.run,
             "older": [p for p, _, _ in older]},
        )  # fmt: skip


def pipeline_status(
    kept: _Kept[PipelineReport], now: int, history: Iterable[LagSample] = ()
) -> PipelineStatus:
    age, stale = _age(kept, now)
    return PipelineStatus(kept.report, kept.reported_ms, age, stale, list(history))


class ReportsApi:
    def __init__(self, engine: Engine, limits: Limits) -> None:
        self.engine = engine
        self.max_body = limits.max_body_bytes
        self.folds = Kept(engine, FOLDS_TOPIC, FoldReport)
        self.clients = Kept(engine, RECOVERY_TOPIC, RecoveryReport)
        self._fold = BodyDecoder(FoldReport)
        self._client = BodyDecoder(RecoveryReport)
        self.pipelines = Kept(engine, PIPELINES_TOPIC, PipelineReport)
        self._pipeline = BodyDecoder(PipelineReport)
        # Per pipeline run, the edges' lags of its last reports, for the console's
        # charts: in memory only, bounded (docs/console.md, "Pipelines").
        self.lag_history: dict[str, deque[LagSample]] = {}

    # --- folds ----------------------------------------------------------------------
    async def report_fold(self, request: Request) -> Response:
        report = self._fold.decode(await request.body(self.max_body))
        check_fold(report)
        kept = await self.folds.keep(report)
        return Response(_encode(fold_status(kept, self.engine.clock.now_ms())))

    def fold_list(self, fold: str | None = None) -> list[FoldStatus]:
        now = self.engine.clock.now_ms()
        return [fold_status(k, now) for _, k in sorted(self.folds.latest.items())
                if fold is None or k.report.fold == fold]  # fmt: skip

    async def list_folds(self, request: Request) -> Response:
        return Response(_encode(FoldList(self.fold_list())))

    async def get_fold(self, request: Request) -> Response:
        name = request.params["fold"]
        found = self.fold_list(name)
        if not found:
            raise TopicError(ErrorCode.NOT_FOUND, f"no fold {name!r} has reported",
                             {"fold": name})  # fmt: skip
        return Response(_encode(FoldList(found)))

    async def forget_fold(self, request: Request) -> Response:
        name, nodes = request.params["fold"], request.query.get("node")
        tags = [self.folds.tag(k.report) for k in self.folds.latest.values()
                if k.report.fold == name and (nodes is None or k.report.node in nodes)]  # fmt: skip
        if not tags:
            raise TopicError(ErrorCode.NOT_FOUND, "no such fold node has reported",
                             {"fold": name, "node": nodes})  # fmt: skip
        now = self.engine.clock.now_ms()
        gone = await self.folds.forget(sorted(tags))
        return Response(_encode(FoldList([fold_status(k, now) for k in gone])))

    # --- recovery clients -----------------------------------------------------------
    def newest_checkpoint(self) -> int | None:
        if not self.engine.tracks_changes:
            return None
        head = self.engine.get_topic(CHANGES_TOPIC, touch=False).head_seq
        return head or None

    def client_status(
        self, kept: _Kept[RecoveryReport], now: int, newest: int | None
    ) -> RecoveryClient:
        r = kept.report
        age, stale = _age(kept, now)
        behind = max((newest or 0) - (r.watermark or 0), 0)
        return RecoveryClient(r.client, r.watermark, r.range_receipts, r.pending,
                              r.interval_ms, behind, kept.reported_ms, age, stale,
                              r.failed)  # fmt: skip

    def client_list(self) -> RecoveryClientList:
        now, newest = self.engine.clock.now_ms(), self.newest_checkpoint()
        clients = [self.client_status(k, now, newest)
                   for _, k in sorted(self.clients.latest.items())]  # fmt: skip
        return RecoveryClientList(clients, newest)

    async def report_recovery(self, request: Request) -> Response:
        report = self._client.decode(await request.body(self.max_body))
        kept = await self.clients.keep(report)
        status = self.client_status(kept, self.engine.clock.now_ms(), self.newest_checkpoint())
        return Response(_encode(status))

    async def list_recovery_clients(self, request: Request) -> Response:
        return Response(_encode(self.client_list()))

    async def forget_recovery_client(self, request: Request) -> Response:
        client = request.params["client"]
        if client not in self.clients.latest:
            raise TopicError(ErrorCode.NOT_FOUND, f"no client {client!r} has reported",
                             {"client": client})  # fmt: skip
        now, newest = self.engine.clock.now_ms(), self.newest_checkpoint()
        (gone,) = await self.clients.forget([client])
        return Response(_encode(self.client_status(gone, now, newest)))

    # --- pipelines (docs/pipeline.md) ---------------------------------------------------
    async def report_pipeline(self, request: Request) -> Response:
        report = self._pipeline.decode(await request.body(self.max_body))
        tag = self.pipelines.tag(report)
        had = self.pipelines.latest.get(tag)
        check_pipeline(report, had.report if had is not None else None)
        kept = await self.pipelines.keep(report)
        history = self.lag_history.get(tag)
        if history is None:
            history = self.lag_history[tag] = deque(maxlen=LAG_HISTORY)
        history.append(LagSample(kept.reported_ms, {k: e.lag for k, e in report.edges.items()}))
        return Response(_encode(pipeline_status(kept, self.engine.clock.now_ms(), history)))

    async def list_pipelines(self, request: Request) -> Response:
        now = self.engine.clock.now_ms()
        found = [pipeline_status(k, now, self.lag_history.get(tag, ()))
                 for tag, k in sorted(self.pipelines.latest.items())]  # fmt: skip
        return Response(_encode(PipelineList(found)))

    async def forget_pipeline(self, request: Request) -> Response:
        name, runs = request.params["pipeline"], request.query.get("run")
        tags = [
            self.pipelines.tag(k.report) for k in self.pipelines.latest.values()
            if k.report.pipeline == name and (runs is None or k.report.run in runs)
        ]  # fmt: skip
        if not tags:
            raise TopicError(ErrorCode.NOT_FOUND, "no such pipeline run has reported",
                             {"pipeline": name, "run": runs})  # fmt: skip
        now = self.engine.clock.now_ms()
        gone = await self.pipelines.forget(sorted(tags))
        histories = [self.lag_history.pop(tag, ()) for tag in sorted(tags)]
        found = [pipeline_status(k, now, h) for k, h in zip(gone, histories, strict=True)]
        return Response(_encode(PipelineList(found)))

    # --- /metrics ---------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        folds = self.fold_list()
        lag = GaugeMetricFamily(
            "waymark_fold_lag",
            "Updates in a fold's bucket not folded yet, as of the fold node's newest report",
            labels=["fold", "node"],
        )
        stale = GaugeMetricFamily("waymark_fold_stale", "1 when a fold node stopped reporting",
                                  labels=["fold", "node"])  # fmt: skip
        ended = GaugeMetricFamily(
            "waymark_fold_stopped",
            "1 when a fold node's final report says it ended, by outcome (stopped, failed)",
            labels=["fold", "node", "outcome"],
        )
        for f in folds:
            lag.add_metric([f.fold, f.node], f.lag)
            stale.add_metric([f.fold, f.node], int(f.stale))
            if f.stopped is not None:
                ended.add_metric([f.fold, f.node, f.stopped.outcome], 1)
        yield lag
        yield stale
        yield ended
        clients = self.client_list().clients
        behind = GaugeMetricFamily("waymark_recovery_client_behind",
                                   "Change checkpoints above a recovery client's watermark",
                                   labels=["client"])  # fmt: skip
        for c in clients:
            behind.add_metric([c.client], c.behind)
        yield behind
        yield GaugeMetricFamily("waymark_recovery_clients_behind",
                                "Recovery clients behind the newest change checkpoint",
                                value=sum(1 for c in clients if c.behind > 0))  # fmt: skip
