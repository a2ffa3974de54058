"""Stage reports are fenced like stage states (docs/semantics/pipeline.md §4.7): the
report of an instance a newer one superseded (a shard holder paused, taken over and
woken) is refused instead of overwriting its successor's, and says so."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from waymark.objstore import open_store
from waymark.pipeline.report import ReportFenced, ReportPublisher, StageReport, load_report


def test_a_superseded_instances_report_never_overwrites_its_successors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(tmp_path.as_uri())
    old, new = ReportPublisher(store), ReportPublisher(store)  # two runner processes
    old.publish(StageReport(stage="deliver.1", incarnation=3, processed=10), wait=True)
    # the shard taken over: its new holder claimed incarnation 4, finished and said so
    new.publish(StageReport(stage="deliver.1", incarnation=4, processed=30, done=True), wait=True)
    # the old holder, woken, reports what it had before its pause
    with pytest.raises(ReportFenced, match=r"incarnation 3 is superseded by incarnation 4"):
        old.publish(StageReport(stage="deliver.1", incarnation=3, processed=12), wait=True)
    with caplog.at_level(logging.WARNING):
        old.publish(StageReport(stage="deliver.1", incarnation=3, processed=13))  # not waited
        old.publish(StageReport(stage="other", incarnation=1), wait=True)  # lands after it
    assert "deliver.1: its report is refused" in caplog.text
    kept = load_report(store, "deliver.1")
    assert kept is not None
    assert (kept.incarnation, kept.processed, kept.done, kept.serial) == (4, 30, True, 2)
    # the successor goes on; each report one serial above the last
    new.publish(StageReport(stage="deliver.1", incarnation=4, processed=31, done=True), wait=True)
    kept = load_report(store, "deliver.1")
    assert kept is not None and (kept.processed, kept.serial) == (31, 3)
