"""What a running stage publishes about itself, for ``waymark pipeline status`` and
the runner's /metrics (docs/pipeline.md, "Metrics"). A Spark stage publishes the
same report (docs/spark.md, "A Spark stage of a pipeline"). Reports are fenced by the
stage state's incarnation, as its saves are (docs/semantics/pipeline.md §4.7)."""

from __future__ import annotations

import logging
import threading

import msgspec

from waymark.objstore import (
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
    ObjectVersion,
    PreconditionFailed,
)
from waymark.protocol.pipelines import StageReport

from .errors import PipelineError
from .state import put_mode

log = logging.getLogger(__name__)

__all__ = ["ReportFenced", "StageReport", "load_report", "publish_report", "report_key"]

_decoder = msgspec.json.Decoder(StageReport)


class ReportFenced(PipelineError):
    """A report of a stage instance a newer one superseded: refused, the newer
    instance's report kept (docs/semantics/pipeline.md §4.7)."""

    def __init__(self, mine: StageReport, kept: StageReport) -> None:
        super().__init__(
            f"stage {mine.stage}: its report is refused: incarnation {mine.incarnation} is "
            f"superseded by incarnation {kept.incarnation}, whose report is kept"
        )
        self.kept = kept


def report_key(stage: str) -> str:
    return f"stages/{stage}/report.json"


def _read(store: ObjectStore, stage: str) -> tuple[StageReport | None, ObjectVersion | None]:
    try:
        got = store.get(report_key(stage))
    except ObjectNotFound:
        return None, None
    return _decoder.decode(got.data), got.meta.object_version


def load_report(store: ObjectStore, stage: str) -> StageReport | None:
    return _read(store, stage)[0]


def publish_report(store: ObjectStore, report: StageReport) -> StageReport:
    """Put ``report`` in the store, one ``serial`` above the stored one, unless the
    stored one is of a newer incarnation: then raise :class:`ReportFenced` and change
    nothing. A compare-and-swap on the version read, so a superseded instance paused
    between its read and its write cannot overwrite its successor's report either
    (docs/semantics/pipeline.md §4.7). Returns the report as written."""
    while True:
        stored, version = _read(store, report.stage)
        if stored is not None and stored.incarnation > report.incarnation:
            raise ReportFenced(report, stored)
        serial = stored.serial + 1 if stored is not None else 1
        mine = msgspec.structs.replace(report, serial=serial)
        data = msgspec.json.encode(mine)
        try:
            store.put(report_key(report.stage), data, mode=put_mode(version))
            return mine
        except (ObjectExists, PreconditionFailed):
            # another write came between, or ours landed and its answer was lost
            # (docs/semantics/pipeline.md §10): read again
            landed, _ = _read(store, report.stage)
            if landed is not None and msgspec.json.encode(landed) == data:
                return mine


class ReportPublisher:
    """Puts stage reports in the store from a thread of its own, so a stage does not
    wait for its periodic report (docs/pipeline.md, "Running it"). Per stage only the
    newest report waiting is written, and reports of one stage land in the order they
    were given: a report that must land (a finished stage's) is waited for. A report
    refused as superseded (:class:`ReportFenced`) is logged, and raised to a waiter."""

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
                publish_report(self.store, _decoder.decode(data))
            except ReportFenced as fenced:  # raised to a caller who waits for it
                log.warning("%s", fenced)
                error = fenced
            except Exception as failed:  # raised to a caller who waits for it
                log.warning("stage %s: its report waits for the store: %s", stage, failed)
                error = failed
            with self._lock:
                self._done[stage] = (version, error)
                self._lock.notify_all()
