"""What a running stage publishes about itself, for ``waymark pipeline status`` and
the runner's /metrics (docs/pipeline.md, "Metrics"). A Spark stage publishes the
same report (docs/spark.md, "A Spark stage of a pipeline")."""

from __future__ import annotations

import logging
import threading

import msgspec

from waymark.objstore import ObjectNotFound, ObjectStore
from waymark.protocol.pipelines import StageReport

log = logging.getLogger(__name__)

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


class ReportPublisher:
    """Puts stage reports in the store from a thread of its own, so a stage does not
    wait for its periodic report (docs/pipeline.md, "Running it"). Per stage only the
    newest report waiting is written, and reports of one stage land in the order they
    were given: a report that must land (a finished stage's) is waited for."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._lock = threading.Condition()
        self._waiting: dict[str, tuple[int, bytes]] = {}  # stage -> (version, report)
        self._given: dict[str, int] = {}  # the last version given, per stage
        self._done: dict[str, tuple[int, Exception | None]] = {}  # last written, per stage
        threading.Thread(target=self._work, name="stage-reports", daemon=True).start()

    def publish(self, report: StageReport, *, wait: bool = False) -> None:
        """Publish ``report``; with ``wait``, once it landed (raising the store's error)."""
        data = msgspec.json.encode(report)
        with self._lock:
            version = self._given.get(report.stage, 0) + 1
            self._given[report.stage] = version
            self._waiting[report.stage] = (version, data)
            self._lock.notify_all()
            if not wait:
                return
            self._lock.wait_for(lambda: self._done.get(report.stage, (0, None))[0] >= version)
            error = self._done[report.stage][1]
        if error is not None:
            raise error

    def _work(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: bool(self._waiting))
                stage = next(iter(self._waiting))
                version, data = self._waiting.pop(stage)
            error: Exception | None = None
            try:
                self.store.put(report_key(stage), data)
            except Exception as failed:  # raised to a caller who waits for it
                log.warning("stage %s: its report waits for the store: %s", stage, failed)
                error = failed
            with self._lock:
                self._done[stage] = (version, error)
                self._lock.notify_all()
