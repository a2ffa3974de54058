"""Pipeline status reports (docs/pipeline.md, "Running it"; docs/reports.md): report and
read back through the shipped client, the newest per pipeline run, staleness on the
injected clock, forgetting, and refusals that store nothing."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from waymark.client import ApiError, AsyncClient
from waymark.clock import ManualClock
from waymark.protocol import (
    LAG_HISTORY,
    PipelineEdge,
    PipelinePlacement,
    PipelineReport,
    PipelineShard,
    PipelineStage,
    StageReport,
)
from waymark.protocol.reports import STALE_INTERVALS
from waymark.server import App
from waymark.server.reports import PIPELINES_TOPIC

pytestmark = pytest.mark.timeout(60)


def report(run: str = "3f9c0a1b2d4e", processed: int = 10, **kw: object) -> PipelineReport:
    edge = PipelineEdge(edge="raw", generation=2, server="http://b:8080",
                        topic=f"edge.clicks.{run}.raw.0", consumer="deliver.0", lag=3)  # fmt: skip
    return PipelineReport(
        pipeline="clicks", run=run,
        stages={"produce": StageReport(stage="produce", processed=processed), "deliver.0": None},
        edges={"raw.0": edge}, shards={"deliver.0": PipelineShard("deliver[0]/ab", 2)},
        topology={"produce": PipelineStage(outputs=["raw"], events=100),
                  "deliver": PipelineStage(input="raw", sink="out", instances=1)},
        placements=[PipelinePlacement("raw.0", 1, "http://a:8080", 5),
                    PipelinePlacement("raw.0", 2, "http://b:8080", 9)],
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_each_run_keeps_its_edges_lag_history_bounded_oldest_first(
    client: AsyncClient, clock: ManualClock
) -> None:
    # The console's lag charts (docs/console.md, "Pipelines"): each report's lags per
    # edge as placed, the last LAG_HISTORY of a run, oldest first; forgetting a run
    # forgets them.
    def lagging(lag: int | None, run: str = "3f9c0a1b2d4e") -> PipelineReport:
        edges = {k: msgspec.structs.replace(e, lag=lag) for k, e in report(run).edges.items()}
        return msgspec.structs.replace(report(run), edges=edges)

    first_ms = clock.now_ms()
    for n in range(LAG_HISTORY + 5):
        status = await client.report_pipeline(lagging(None if n == LAG_HISTORY else n))
        clock.advance(2000)
    assert len(status.lag_history) == LAG_HISTORY
    await client.report_pipeline(lagging(7, run="000000000001"))
    listed = {p.report.run: p.lag_history for p in await client.list_pipelines()}
    history = listed["3f9c0a1b2d4e"]
    assert [s.lags["raw.0"] for s in history] == [
        *range(5, LAG_HISTORY), None, *range(LAG_HISTORY + 1, LAG_HISTORY + 5)]  # fmt: skip
    assert [s.reported_ms for s in history] == [
        first_ms + 2000 * n for n in range(5, LAG_HISTORY + 5)]  # fmt: skip
    assert [s.lags for s in listed["000000000001"]] == [{"raw.0": 7}]
    (gone,) = await client.forget_pipeline("clicks", ["3f9c0a1b2d4e"])
    assert len(gone.lag_history) == LAG_HISTORY
    again = await client.report_pipeline(lagging(1))
    assert [s.lags for s in again.lag_history] == [{"raw.0": 1}]


async def test_a_pipeline_report_reads_back_newest_per_run(
    app: App, client: AsyncClient, clock: ManualClock
) -> None:
    status = await client.report_pipeline(report(interval_ms=1000))
    assert status.report == report(interval_ms=1000)
    assert not status.stale
    await client.report_pipeline(report(processed=20, interval_ms=1000))
    await client.report_pipeline(report(run="000000000001"))
    listed = await client.list_pipelines()
    assert [(p.report.run, p.report.stages["produce"].processed) for p in listed] == [  # type: ignore[union-attr]
        ("000000000001", 10), ("3f9c0a1b2d4e", 20)]  # fmt: skip
    assert app.engine.get_topic(PIPELINES_TOPIC, touch=False).count == 2  # one per run
    clock.advance(STALE_INTERVALS * 1000 + 1)
    stale = {p.report.run: p.stale for p in await client.list_pipelines()}
    assert stale == {"3f9c0a1b2d4e": True, "000000000001": False}  # its interval is 5 s
    gone = await client.forget_pipeline("clicks", ["3f9c0a1b2d4e"])
    assert [p.report.run for p in gone] == ["3f9c0a1b2d4e"]
    assert [p.report.run for p in await client.forget_pipeline("clicks")] == ["000000000001"]
    assert await client.list_pipelines() == []
    with pytest.raises(ApiError) as refused:
        await client.forget_pipeline("clicks")
    assert (refused.value.status, refused.value.code) == (404, "not_found")


BAD = {
    "unknown field": {**msgspec.to_builtins(report()), "colour": "red"},
    "no edges": {k: v for k, v in msgspec.to_builtins(report()).items() if k != "edges"},
    "bad name": {**msgspec.to_builtins(report()), "pipeline": "no spaces"},
    "interval too short": {**msgspec.to_builtins(report()), "interval_ms": 5},
    "negative lag": {**msgspec.to_builtins(report()),
                     "edges": {"raw": {**msgspec.to_builtins(report().edges["raw.0"]), "lag": -1}}},
}  # fmt: skip


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
async def test_a_bad_pipeline_report_is_refused_and_stores_nothing(
    app: App, client: AsyncClient, body: dict[str, object]
) -> None:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://waymark")
    async with http:
        answer = await http.post("/v0/pipelines", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_request"
    assert await client.list_pipelines() == []
    assert app.engine.get_topic(PIPELINES_TOPIC, touch=False).count == 0


async def test_a_report_older_than_the_kept_one_is_refused_and_the_newer_one_kept(
    client: AsyncClient,
) -> None:
    # docs/semantics/pipeline.md §4.7: a runner paused between reading the store and
    # posting (a shard holder SIGSTOPped, taken over, woken) sends what the store said
    # before the kept report was read: refused, said so, the newer one kept.
    def fenced(incarnation: int, serial: int, epoch: int, generation: int = 2,
               done: bool = False) -> PipelineReport:  # fmt: skip
        base = report()
        edges = {k: msgspec.structs.replace(e, generation=generation)
                 for k, e in base.edges.items()}  # fmt: skip
        stage = StageReport(stage="deliver.0", incarnation=incarnation, serial=serial, done=done)
        return msgspec.structs.replace(
            base, stages={**base.stages, "deliver.0": stage}, edges=edges,
            shards={"deliver.0": PipelineShard("deliver[1]/cd", epoch)},
        )  # fmt: skip

    final = fenced(4, 7, 3, done=True)
    await client.report_pipeline(final)
    for older, part in ((fenced(3, 9, 3), "stage deliver.0"), (fenced(4, 6, 3), "stage deliver.0"),
                        (fenced(4, 7, 2), "shard deliver.0"), (fenced(4, 7, 3, 1), "edge raw.0"),
                        (report(), "stage deliver.0")):  # fmt: skip
        with pytest.raises(ApiError) as refused:
            await client.report_pipeline(older)
        assert (refused.value.status, refused.value.code) == (409, "fenced")
        assert refused.value.detail["reason"] == "report_stale"
        assert refused.value.detail["older"][0] == part, refused.value.detail
    (kept,) = await client.list_pipelines()
    assert kept.report == final
    # the same state read again later, or a newer one, is taken
    await client.report_pipeline(fenced(4, 7, 3, done=True))
    newer = fenced(5, 8, 4, generation=3, done=True)
    await client.report_pipeline(newer)
    (kept,) = await client.list_pipelines()
    assert kept.report == newer
