"""What a running stage publishes about itself, for ``waymark pipeline status`` and
the runner's /metrics (docs/pipeline.md, "Metrics"). A Spark stage publishes the
same report (docs/spark.md, "A Spark stage of a pipeline")."""

from __future__ import annotations

import msgspec

from waymark.objstore import ObjectNotFound, ObjectStore


class StageReport(msgspec.Struct, kw_only=True):
    """One stage's counters (``stages/<name>/report.json``)."""

    stage: str
    processed: int = 0
    relocations: int = 0
    rebinds: int = 0
    fenced: int = 0
    replayed: int = 0
    stale_dropped: int = 0
    disconnects: int = 0
    restarts: int = 0
    dead_lettered: int = 0  # poison events sent to the dead-letter topic
    last_error: str = ""  # why the stage last restarted (or stopped)
    recover_s: list[float] = msgspec.field(default_factory=list)
    latency_before_ms: list[int] = msgspec.field(default_factory=list)  # at a sink, sampled
    latency_after_ms: list[int] = msgspec.field(default_factory=list)
    done: bool = False
    updated_ms: int = 0


def report_key(stage: str) -> str:
    return f"stages/{stage}/report.json"


def load_report(store: ObjectStore, stage: str) -> StageReport | None:
    try:
        return msgspec.json.decode(store.get(report_key(stage)).data, type=StageReport)
    except ObjectNotFound:
        return None


def publish_report(store: ObjectStore, report: StageReport) -> None:
    store.put(report_key(report.stage), msgspec.json.encode(report))
