"""What a running stage publishes about itself, for ``waymark pipeline status`` and
the runner's /metrics (docs/pipeline.md, "Metrics"). A Spark stage publishes the
same report (docs/spark.md, "A Spark stage of a pipeline")."""

from __future__ import annotations

import msgspec

from waymark.objstore import ObjectNotFound, ObjectStore
from waymark.protocol.pipelines import StageReport

__all__ = ["StageReport", "load_report", "publish_report", "report_key"]


def report_key(stage: str) -> str:
    return f"stages/{stage}/report.json"


def load_report(store: ObjectStore, stage: str) -> StageReport | None:
    try:
        return msgspec.json.decode(store.get(report_key(stage)).data, type=StageReport)
    except ObjectNotFound:
        return None


def publish_report(store: ObjectStore, report: StageReport) -> None:
    store.put(report_key(report.stage), msgspec.json.encode(report))
