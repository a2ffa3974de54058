"""The store's patience on an injected clock (docs/semantics/pipeline.md §10): an
outage is retried with growing jittered waits until the budget, answers are not
retried, a write whose answer was lost is found by its caller, and a stopped runner
stops waiting."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from tests.pipeline.conftest import StoreFaults

from waymark.clock import ManualClock
from waymark.objstore import CREATE, ObjectExists, ObjectNotFound, ObjectStoreError, open_store
from waymark.pipeline.patience import PatientStore
from waymark.pipeline.report import ReportPublisher, StageReport, load_report
from waymark.pipeline.state import CheckpointedStageState, StageStateStore


def patient(
    tmp_path: Path, ends_after: int = 3, **kwargs: object
) -> tuple[PatientStore, StoreFaults, list[float]]:
    """A patient store over a fault-injected one; an outage ends after ``ends_after``
    waits."""
    clock = ManualClock()
    faults, waits = StoreFaults(), []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(int(seconds * 1000))
        if len(waits) == ends_after:
            faults.down = False

    store = PatientStore(faults.wrap(open_store(tmp_path.as_uri())), clock=clock, sleep=sleep,
                         **kwargs)  # type: ignore[arg-type]  # fmt: skip
    return store, faults, waits


def test_an_outage_shorter_than_the_budget_is_waited_out(tmp_path: Path) -> None:
    store, faults, waits = patient(tmp_path, budget_s=60.0)
    store.put("k", b"1")
    faults.down = True
    assert store.get("k").data == b"1"
    assert len(waits) == 3 and waits[0] < waits[2]  # backing off
    assert store.waiting_since_ms() is None  # no one waits any more


def test_an_outage_longer_than_the_budget_fails_and_answers_never_wait(tmp_path: Path) -> None:
    store, faults, waits = patient(tmp_path, ends_after=100, budget_s=1.0)
    faults.down = True
    with pytest.raises(ObjectStoreError, match="injected outage"):
        store.get("k")
    assert 0 < len(waits) < 100 and sum(waits) < 1.0 + 2.0  # the budget, plus one wait
    waits.clear()
    faults.down = False
    with pytest.raises(ObjectNotFound):
        store.get("missing")
    store.put("once", b"1", mode=CREATE)
    with pytest.raises(ObjectExists):
        store.put("once", b"2", mode=CREATE)
    assert waits == []


def test_a_stopped_runner_stops_waiting(tmp_path: Path) -> None:
    cancel = threading.Event()
    store, faults, waits = patient(tmp_path, budget_s=60.0, cancel=cancel)
    faults.down = True
    cancel.set()
    with pytest.raises(ObjectStoreError):
        store.get("k")
    assert waits == []


def test_a_save_whose_answer_was_lost_is_found_as_its_own(tmp_path: Path) -> None:
    # The write lands, its answer is lost, the retry's If-Match fails: the stage state
    # reads back its own incarnation and owner and goes on (docs/semantics/pipeline.md §10).
    store, faults, _ = patient(tmp_path, budget_s=60.0)
    states = StageStateStore(store)
    state = states.claim(CheckpointedStageState(stage="s"), "s/one")
    state.source_offset = 7
    faults.lose = 1
    states.save(state)
    state.source_offset = 9
    states.save(state)  # its version is known again: no StageFenced
    loaded = states.load("s")
    assert loaded is not None and loaded.source_offset == 9 and loaded.owner == "s/one"


def test_reports_published_behind_land_in_order_and_a_waited_one_raises(tmp_path: Path) -> None:
    # docs/pipeline.md, "Running it": a running stage's periodic report does not wait
    # for the store; a finished stage's is waited for and lands after every earlier one.
    faults = StoreFaults()
    store = faults.wrap(open_store(tmp_path.as_uri()))
    reports = ReportPublisher(store)
    for n in range(50):
        reports.publish(StageReport(stage="s", processed=n))
    reports.publish(StageReport(stage="s", processed=50, done=True), wait=True)
    landed = load_report(store, "s")
    assert landed is not None and landed.processed == 50 and landed.done
    faults.down = True
    with pytest.raises(ObjectStoreError, match="injected outage"):
        reports.publish(StageReport(stage="s", processed=51), wait=True)
    reports.publish(StageReport(stage="s", processed=52))  # not waited for: logged only
    faults.down = False
    reports.publish(StageReport(stage="t"), wait=True)  # the worker goes on
    landed = load_report(store, "s")
    assert landed is not None and landed.processed in (50, 52)
