"""A stage's function in its batch form against the per-event form
(waymark.pipeline.functions; docs/pipeline.md, "Batch functions"): for the same
mapping, a batch function that passes its records through as bytes, selects some of
them or maps each to one value delivers exactly the records, ids, origins and birth
times the per-event function does, and names the same event when it fails. Mutants of
the pass-through are caught."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from waymark.pipeline import InFlight, Position
from waymark.pipeline.batch import BORN_MS, DATA_END, EVENT_END, ORIGIN_GEN, ORIGIN_SEQ
from waymark.pipeline.functions import Events, RecordError, apply, batch_function, is_batch
from waymark.pipeline.spec import PipelineSpec

from .test_batch import Rec, contents, ids, of, origins, values

# records as a consumer pops them: each at a position on its input edge, any value
popped = st.builds(
    Rec, ids, values.map(msgspec.json.encode), origins, st.integers(0, 2**50),
    st.builds(Position, st.integers(1, 3), st.integers(1, 1_000_000)),
)  # fmt: skip

SAME = settings(max_examples=80, deadline=None, derandomize=True, database=None)
STAGE = b"t"


def both(records: list[Rec], keep: list[bool], mapped: bool) -> tuple[InFlight, InFlight]:
    """The outputs of the per-event form and of the batch form of one mapping: keep
    record i when ``keep[i]`` as it is or, ``mapped``, every record as ``{"v": value}``
    (a list is one value per record)."""
    if mapped:
        keep = [True] * len(records)
    flags = iter(keep)  # the per-event form is called once per record, in order

    def each(value: Any) -> Iterator[Any]:
        if next(flags):
            yield {"v": value} if mapped else value

    @batch_function
    def whole(events: Events) -> Events | list[Any]:
        if mapped:
            return [{"v": v} for v in events.values()]
        return events.select(i for i, k in enumerate(keep) if k)

    batch = of(records)
    return apply(each, batch, STAGE), apply(whole, batch, STAGE)


def same(a: InFlight, b: InFlight) -> None:
    assert contents(a) == contents(b)
    assert a.events == b.events and a.data == b.data
    rows = [EVENT_END, DATA_END, ORIGIN_GEN, ORIGIN_SEQ, BORN_MS]
    assert np.array_equal(a.ints[rows], b.ints[rows])
    assert a.sink_records() == b.sink_records()


def check_same(records: list[Rec], data: st.DataObject) -> None:
    keep = data.draw(st.lists(st.booleans(), min_size=len(records), max_size=len(records)))
    each, whole = both(records, keep, data.draw(st.booleans()))
    same(each, whole)


def same_test(config: settings) -> None:
    config(given(st.lists(popped, max_size=10), st.data())(check_same))()


def test_the_batch_form_delivers_exactly_what_the_per_event_form_does() -> None:
    same_test(SAME)


def test_a_pass_through_keeps_each_record_as_it_came() -> None:
    records = [Rec(e, b'{"n":%d}' % i, Position(0, 9), 7 + i, Position(2, 10 + i))
               for i, e in enumerate(["a", 'q"uote', "b/t:1"])]  # fmt: skip
    kept = apply(batch_function(lambda events: events.select([0, 2])), of(records), STAGE)
    assert kept.event_ids() == ["a", "b/t:1"]
    assert [kept.value(i) for i in range(2)] == [b'{"n":0}', b'{"n":2}']
    assert [kept.origin(i) for i in range(2)] == [Position(2, 10), Position(2, 12)]
    assert [kept.born(i) for i in range(2)] == [7, 9]
    assert kept.written() == 0  # not on the output edge yet


def test_events_decode_once_and_select_within_a_selection() -> None:
    events = Events(of([Rec(str(i), b"%d" % i, Position(0, 0), 0) for i in range(5)]))
    assert events.values() is events.values() and events.values() == [0, 1, 2, 3, 4]
    inner = events.select([1, 3, 4]).select([0, 2])
    assert inner.ids() == ["1", "4"] and inner.raw() == [b"1", b"4"] and len(inner) == 2
    for bad in ([2, 1], [0, 5], [-1]):
        with pytest.raises(ValueError, match="increasing indices"):
            events.select(bad)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.lists(popped, min_size=1, max_size=8), st.data())
def test_both_forms_name_the_same_record_when_they_fail(records: list[Rec],
                                                        data: st.DataObject) -> None:  # fmt: skip
    # the batch form's call fails as a whole; each record is then given to it alone, so
    # the record the runner counts (and, past max_attempts, dead-letters) is the same
    # one the per-event form fails on (docs/semantics/pipeline.md §9.2)
    bad = data.draw(st.sets(st.integers(0, len(records) - 1), min_size=1))
    calls = iter(range(len(records)))

    def each(value: Any) -> Iterator[Any]:
        if next(calls) in bad:
            raise ValueError("poison")
        yield value

    @batch_function
    def whole(events: Events) -> list[Any]:
        if any(r in poison for r in events.raw()):
            raise ValueError("poison")
        return events.values()

    batch = of(records)
    # a value equal to a poison one is poison too, in both forms
    poison = {batch.value(i) for i in bad}
    bad = {i for i in range(len(records)) if batch.value(i) in poison}
    with pytest.raises(RecordError) as per_event:
        apply(each, batch, STAGE)
    with pytest.raises(RecordError) as batched:
        apply(whole, batch, STAGE)
    assert per_event.value.index == batched.value.index == min(bad)
    assert isinstance(batched.value.__cause__, ValueError)


def test_a_batch_function_returning_what_it_cannot_fails_on_its_first_record() -> None:
    batch = of([Rec(str(i), b"%d" % i, Position(0, 0), 0, Position(1, i + 1)) for i in range(3)])
    for wrong in (lambda events: [], lambda events: "no",
                  lambda events: Events(batch.between(0, 1))):  # fmt: skip
        with pytest.raises(RecordError) as failed:
            apply(batch_function(wrong), batch, STAGE)
        assert failed.value.index == 0
        assert isinstance(failed.value.__cause__, (TypeError, ValueError))


def test_a_batch_that_fails_whole_but_not_record_by_record_gives_their_outputs() -> None:
    @batch_function
    def at_most_two(events: Events) -> list[Any]:
        if len(events) > 2:
            raise RuntimeError("too many at once")
        return events.values()

    records = [Rec(str(i), b"%d" % i, Position(0, 0), 0, Position(1, i + 1)) for i in range(4)]
    same(apply(at_most_two, of(records), STAGE),
         apply(lambda v: iter([v]), of(records), STAGE))  # fmt: skip


def test_the_demo_sink_is_a_batch_function_and_a_source_cannot_be_one() -> None:
    from waymark.pipeline.demo import deliver, deliver_each, produce

    assert is_batch(deliver) and not is_batch(deliver_each) and not is_batch(produce)
    spec = PipelineSpec.parse({
        "pipeline": {"handoff": "file:///nowhere", "servers": ["http://127.0.0.1:1"]},
        "edge": [{"name": "e"}],
        "stage": [{"name": "p", "function": "waymark.pipeline.demo:deliver", "events": 3,
                   "output": "e"},
                  {"name": "s", "function": "waymark.pipeline.demo:deliver", "input": "e",
                   "sink": {"url": "http://127.0.0.1:1", "topic": "t"}}],
    })  # fmt: skip
    with pytest.raises(Exception, match="is a batch function"):
        spec.stages["p"].load()
    assert spec.stages["s"].load() is deliver


# --- mutants: the pass-through broken, the forms differ -------------------------------
def test_a_pass_through_that_keeps_the_inputs_origin_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an output's origin is its input record's position on the edge (what the stage's
    # checkpoint is computed from), not where that record came from
    original = InFlight.passed

    def input_origins(self: InFlight, at: np.ndarray | None = None) -> InFlight:
        made = original(self, at)
        kept = self.ints[[ORIGIN_GEN, ORIGIN_SEQ]]
        made.ints[[ORIGIN_GEN, ORIGIN_SEQ]] = kept if at is None else kept[:, at]
        return made

    monkeypatch.setattr(InFlight, "passed", input_origins)
    with pytest.raises(AssertionError):  # stopped at the first failure, unshrunk
        same_test(settings(SAME, phases=[Phase.generate]))


def test_a_selection_of_a_selection_taken_from_the_batch_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def flat(self: Events, indices: Any) -> Events:
        return Events(self._records, np.fromiter(indices, np.intp))

    monkeypatch.setattr(Events, "select", flat)
    with pytest.raises(AssertionError):
        test_events_decode_once_and_select_within_a_selection()
