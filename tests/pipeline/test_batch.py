"""The in-flight buffer (waymark.pipeline.batch) against a model of one Python object
per record: append, placement, release of an acknowledged prefix (or middle), the
oldest origin, and the HTTP bodies joined from the buffers, with awkward event ids and
transforms that emit several outputs per input (docs/pipeline.md, "In-flight
records"; docs/semantics/pipeline.md §3.4). Mutants of its guards are caught."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import msgspec
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from waymark.client import RecordIn
from waymark.pipeline import InFlight, Position
from waymark.pipeline.batch import GEN, ITEM_OVERHEAD, PACK, RECORD_OVERHEAD
from waymark.pipeline.window import Window
from waymark.protocol import EDGE_ITEMS, EdgePack


@dataclass
class Rec:
    event: str
    data: bytes
    origin: Position
    born: int
    position: Position | None = None
    first: bool = False  # starts a pack


# Ids with quotes, backslashes, control characters, non-ASCII and the '/' and '@' the
# pipeline puts into derived ids; data any JSON value.
ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                               max_size=3),
    max_leaves=6,
)  # fmt: skip
origins = st.builds(Position, st.integers(0, 3), st.integers(0, 1_000_000))
recs = st.builds(
    Rec, ids, values.map(msgspec.json.encode), origins, st.integers(0, 2**50)
)  # fmt: skip


def of(records: list[Rec]) -> InFlight:
    return InFlight.build(
        [msgspec.json.encode(r.event) for r in records], [r.data for r in records],
        origin_gen=[r.origin.generation for r in records],
        origin_seq=[r.origin.seq for r in records], born_ms=[r.born for r in records],
        generation=[r.position.generation if r.position else 0 for r in records],
        seq=[r.position.seq if r.position else 0 for r in records],
    )  # fmt: skip


def contents(batch: InFlight) -> list[Rec]:
    return [
        Rec(batch.event(i), batch.value(i), batch.origin(i), batch.born(i), batch.position(i),
            bool(batch.ints[PACK, i]))
        for i in range(len(batch))
    ]  # fmt: skip


def packed_model(records: list[Rec], max_items: int, max_bytes: int) -> list[Rec]:
    """``records`` cut into packs one item at a time: a pack ends at ``max_items``
    items, or before the item whose id, data and overhead would pass ``max_bytes``
    (docs/semantics/pipeline.md §3.1)."""
    out, count, size = [], 0, 0
    for r in records:
        item = len(msgspec.json.encode(r.event)) + len(r.data) + ITEM_OVERHEAD
        first = not out or count == max_items or size + item > max_bytes
        count, size = (1, item) if first else (count + 1, size + item)
        out.append(Rec(r.event, r.data, r.origin, r.born, r.position, first))
    return out


def pack_spans(model: list[Rec], start: int = 0) -> list[tuple[int, int]]:
    """The ``(first, end)`` items of the model's packs from item ``start``."""
    firsts = [i for i in range(start, len(model)) if model[i].first]
    return list(zip(firsts, [*firsts[1:], len(model)], strict=False))  # one end more


def edge_packs(body: bytes) -> list[tuple[RecordIn, EdgePack]]:
    return [(r, msgspec.json.decode(bytes(r.data), type=EdgePack)) for r in decoded(body)]


def expected_packs(
    model: list[Rec], start: int, generation: int, end: int | None = None
) -> list[tuple]:
    """Each pack from item ``start`` (to ``end``) as its record id, meta (its generation
    and item count) and items."""
    return [
        (f"{model[lo].event}+{hi - lo}.{pack_crc(model[lo:hi]):08x}@{generation}",
         {GEN: str(generation), EDGE_ITEMS: str(hi - lo)},
         [(m.event, m.born, m.data) for m in model[lo:hi]])
        for lo, hi in pack_spans(model, start)
        if end is None or lo < end
    ]  # fmt: skip


def pack_crc(items: list[Rec]) -> int:
    return zlib.crc32(b"".join(msgspec.json.encode(m.event) for m in items))


def as_sent(body: bytes) -> list[tuple]:
    return [
        (r.id, r.meta, [(msgspec.json.decode(bytes(e)), b, bytes(d))
                        for e, b, d in zip(p.events, p.born_ms, p.items, strict=True)])
        for r, p in edge_packs(body)
    ]  # fmt: skip


def decoded(body: bytes) -> list[RecordIn]:
    try:
        return msgspec.json.decode(b"[" + body + b"]", type=list[RecordIn]) if body else []
    except msgspec.DecodeError as error:
        raise AssertionError(f"not a list of records: {body[:200]!r}") from error


class InFlightMachine(RuleBasedStateMachine):
    """A producer's window (a :class:`Window` of packed pushes, as an edge holds it):
    pushes, writes of whole packs within drawn limits to placements, acknowledgements;
    checked against one Python object per record and against the pushes joined into
    one ``InFlight``."""

    @initialize()
    def start(self) -> None:
        self.batch = Window()
        self.model: list[Rec] = []
        self.generation = 1
        self.next_seq = {1: 0}

    @rule(
        new=st.lists(recs, max_size=6),
        fanout=st.integers(1, 3),
        max_items=st.integers(1, 4),
        max_bytes=st.integers(1, 120),
    )
    def push(self, new: list[Rec], fanout: int, max_items: int, max_bytes: int) -> None:
        # a transform emitting ``fanout`` outputs per input: they share the origin;
        # the push cut into packs as a producer holds them
        outputs = [
            Rec(r.event if k == 0 else f"{r.event}/{k}", r.data, r.origin, r.born)
            for r in new
            for k in range(fanout)
        ]
        self.batch += of(outputs).packed(max_items, max_bytes)
        self.model += packed_model(outputs, max_items, max_bytes)

    # limits that cut a write short, or none: everything from the k-th pack
    @rule(
        data=st.data(),
        max_packs=st.integers(1, 4) | st.just(10**6),
        max_bytes=st.integers(1, 400) | st.just(10**9),
    )
    def write(self, data: st.DataObject, max_packs: int, max_bytes: int) -> None:
        """A successful append of the packs from the ``k``-th one onwards to the bound
        placement, as many as one write carries (it may span pushes)."""
        spans = pack_spans(self.model)
        k = data.draw(st.integers(0, len(spans)))
        start = spans[k][0] if k < len(spans) else len(self.model)
        end = self.batch.write_end(start, max_packs, max_bytes)
        assert end == self.batch.joined().write_end(start, max_packs, max_bytes)
        body = self.batch.edge_packs(start, self.generation, end)
        assert as_sent(body) == expected_packs(self.model, start, self.generation, end)
        written = [span for span in spans[k:] if span[0] < end]
        first = self.next_seq[self.generation] + 1
        seqs = list(range(first, first + len(written)))
        self.next_seq[self.generation] += len(seqs)
        self.batch.place(start, self.generation, seqs, end)
        for (lo, hi), seq in zip(written, seqs, strict=True):
            for m in self.model[lo:hi]:
                m.position = Position(self.generation, seq)

    @rule()
    def move(self) -> None:
        self.generation += 1
        self.next_seq[self.generation] = 0

    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        """The consumer's checkpoint: anywhere in a known generation, past the end too."""
        generation = data.draw(st.integers(1, self.generation))
        seq = data.draw(st.integers(0, self.next_seq[generation] + 2))
        self.batch.forget(Position(generation, seq))
        self.model = [
            m for m in self.model
            if m.position is None or m.position.generation != generation or m.position.seq > seq
        ]  # fmt: skip

    @invariant()
    def same_records_in_push_order(self) -> None:
        assert len(self.batch) == len(self.model)
        assert contents(self.batch.joined()) == self.model
        assert self.batch.written() == sum(m.position is not None for m in self.model)

    @invariant()
    def the_written_prefix_is_where_each_generation_stops(self) -> None:
        for generation in self.next_seq:
            placed = next((i for i, m in enumerate(self.model)
                           if m.position is None or m.position.generation != generation),
                          len(self.model))  # fmt: skip
            assert self.batch.placed(generation) == placed

    @invariant()
    def oldest_origin_is_the_least(self) -> None:
        assert self.batch.oldest_origin() == min((m.origin for m in self.model), default=None)

    @invariant()
    def packs_stay_whole(self) -> None:
        # acknowledged by the pack's seq, a pack is forgotten whole: what is held
        # starts with a pack (docs/semantics/pipeline.md §3.4)
        assert not self.model or self.model[0].first
        assert self.batch.packs() == sum(m.first for m in self.model)

    @invariant()
    def a_replay_writes_everything_in_push_order(self) -> None:
        assert as_sent(self.batch.edge_packs(0, 99)) == expected_packs(self.model, 0, 99)
        assert [RecordIn(msgspec.Raw(m.data), id=m.event) for m in self.model] == decoded(
            self.batch.sink_records()
        )


TestInFlight = InFlightMachine.TestCase
# Derandomized, no example database: the same search in every run, so a mutant is
# caught (or not) the same way in CI as here.
TestInFlight.settings = settings(max_examples=60, stateful_step_count=20, deadline=None,
                                 derandomize=True, database=None)  # fmt: skip
MUTANT = settings(max_examples=300, stateful_step_count=20, deadline=None,
                  derandomize=True, database=None, phases=[Phase.generate])  # fmt: skip


def run_machine() -> None:
    """The machine under a mutant: stop at the first failure, unshrunk."""
    run_state_machine_as_test(InFlightMachine, settings=MUTANT)


# --- awkward cases ------------------------------------------------------------------
def test_an_empty_batch() -> None:
    empty = InFlight.empty()
    assert len(empty) == 0 and not empty
    assert empty.oldest_origin() is None and empty.written() == 0
    assert empty.edge_packs(0, 1) == b"" and empty.sink_records() == b""
    assert empty.packed().packs() == 0 and empty.write_end(0) == 0
    assert len(empty.acknowledged(Position(1, 10))) == 0
    assert contents(empty + InFlight.of([], [])) == []
    one = InFlight.of(["a"], [b"1"])
    assert contents(empty + one) == contents(one + empty) == contents(one)
    with pytest.raises(IndexError):
        empty.event(0)


def test_release_past_the_end_forgets_everything_written_and_keeps_the_rest() -> None:
    batch = InFlight.of(["a", "b", "c"], [b"1", b"2", b"3"]).packed(1)  # a pack each
    batch.place(0, 1, [1, 2, 3])
    batch += InFlight.of(["d"], [b"4"]).packed()  # not written yet
    left = batch.acknowledged(Position(1, 1000))
    assert left.event_ids() == ["d"] and left.position(0) is None
    assert left.value(0) == b"4"


def test_release_in_the_middle_of_one_origins_outputs_keeps_its_origin() -> None:
    # input (1, 7) became three outputs, written as seqs 4, 5, 6; the consumer acknowledged
    # up to 5: the third output is still in flight, so the input is not done
    # (docs/semantics/pipeline.md §4.1).
    batch = InFlight.build(
        [b'"x"', b'"x/1"', b'"x/2"', b'"y"'], [b"1", b"2", b"3", b"4"],
        origin_gen=1, origin_seq=[7, 7, 7, 8],
    ).packed(1)  # fmt: skip
    batch.place(0, 2, [4, 5, 6, 7])
    left = batch.acknowledged(Position(2, 5))
    assert left.event_ids() == ["x/2", "y"]
    assert left.oldest_origin() == Position(1, 7)
    assert left.acknowledged(Position(2, 6)).oldest_origin() == Position(1, 8)


def test_release_leaves_older_generations_and_unwritten_records_in_the_middle() -> None:
    batch = InFlight.of(["a", "b", "c", "d"], [b"1", b"[2]", b'"3"', b"{}"]).packed(1)
    batch.place(0, 1, [1, 2, 3, 4])
    batch.place(2, 2, [1, 2])  # c and d written again in generation 2
    left = batch.acknowledged(Position(2, 1))  # c: in the middle
    assert left.event_ids() == ["a", "b", "d"]
    assert [left.value(i) for i in range(3)] == [b"1", b"[2]", b"{}"]
    assert [left.position(i) for i in range(3)] == [Position(1, 1), Position(1, 2),
                                                    Position(2, 2)]  # fmt: skip


def test_data_that_is_not_one_json_value_is_refused() -> None:
    # it would go into request bodies as is: '1,"id":"x"' would forge a field
    for bad in (b'1,"id":"x"', b"", b"{", b"1 2"):
        with pytest.raises(ValueError, match="data 0 is not one JSON value"):
            InFlight.of(["a"], [bad])


def test_placing_the_wrong_number_of_seqs_is_refused() -> None:
    batch = InFlight.of(["a", "b"], [b"1", b"2"]).packed(1)
    with pytest.raises(ValueError, match="1 seqs for 2 packs"):
        batch.place(0, 1, [1])
    with pytest.raises(ValueError, match="item 1 does not start a pack"):
        InFlight.of(["a", "b"], [b"1", b"2"]).packed().place(1, 1, [1])
    with pytest.raises(ValueError, match="2 event ids for 1 data values"):
        InFlight.build([b'"a"', b'"b"'], [b"1"])


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(st.lists(recs, max_size=12), st.lists(st.booleans(), max_size=12))
def test_keep_selects_any_subset_in_order(records: list[Rec], flags: list[bool]) -> None:
    mask = np.array((flags + [True] * len(records))[: len(records)], dtype=bool)
    kept = of(records).keep(mask)
    assert contents(kept) == [r for r, keep in zip(records, mask, strict=True) if keep]


def outputs_model(records: list[Rec], counts: list[int], stage: str) -> list[Rec]:
    """What a stage's function making ``counts[i]`` outputs of record ``i`` writes, one
    Python object per output: the ``k``-th output past the first ``<event>/<stage>:<k>``,
    origin the record's position, birth the record's (docs/semantics/pipeline.md §5.1)."""
    return [
        Rec(r.event if k == 0 else f"{r.event}/{stage}:{k}", b"[%d,%d]" % (i, k),
            r.position or Position(0, 0), r.born)
        for i, (r, n) in enumerate(zip(records, counts, strict=True))
        for k in range(n)
    ]  # fmt: skip


placed = st.builds(
    Rec, ids, st.just(b"0"), origins, st.integers(0, 2**50),
    st.builds(Position, st.integers(1, 3), st.integers(1, 1_000_000)),
)  # fmt: skip


OUTPUTS = settings(max_examples=50, deadline=None, derandomize=True, database=None)


def check_outputs(records: list[Rec], data: st.DataObject, stage: str) -> None:
    # none, one (the columnar case) or several outputs per record, in any mix
    one_each = data.draw(st.booleans())
    counts = [1] * len(records) if one_each else data.draw(
        st.lists(st.integers(0, 3), min_size=len(records), max_size=len(records)))  # fmt: skip
    model = outputs_model(records, counts, stage)
    source = [i for i, n in enumerate(counts) for _ in range(n)]
    made = of(records).outputs([m.data for m in model], source,
                               msgspec.json.encode(stage)[1:-1])  # fmt: skip
    assert contents(made) == model
    assert made.written() == 0  # not on the output edge yet
    packed = made.packed()  # one pack: every item's id, birth and data, in order
    assert (
        as_sent(packed.edge_packs(0, 7)) == expected_packs(packed_model(model, 10**6, 10**9), 0, 7)
        if model
        else packed.edge_packs(0, 7) == b""
    )


def outputs_test(config: settings) -> None:
    """:func:`check_outputs` over drawn records, output counts and stage names."""
    config(given(st.lists(placed, max_size=8), st.data(), ids)(check_outputs))()


def test_outputs_match_one_object_per_output() -> None:
    outputs_test(OUTPUTS)


def test_outputs_of_a_record_skipped_in_the_middle_are_not_taken_for_one_each() -> None:
    # as many outputs as records, but record 1 made none and record 0 two: the ids must
    # still be derived (the columnar case holds only for one output per record)
    records = [Rec(e, b"0", Position(0, 0), 5, Position(1, s)) for s, e in enumerate("abc", 1)]
    made = of(records).outputs([b"1", b"2", b"3"], [0, 0, 2], b"t")
    assert [made.event(i) for i in range(3)] == ["a", "a/t:1", "c"]
    assert [made.origin(i) for i in range(3)] == [Position(1, 1), Position(1, 1), Position(1, 3)]


def test_outputs_taken_for_one_each_by_their_count_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a mutant of the columnar case's guard: the count alone
    original = InFlight.outputs

    def by_count(self: InFlight, data: list[bytes], source: list[int], stage: bytes) -> InFlight:
        if len(source) == len(self):
            return original(self, data, list(range(len(self))), stage)
        return original(self, data, source, stage)

    monkeypatch.setattr(InFlight, "outputs", by_count)
    with pytest.raises(AssertionError):
        test_outputs_of_a_record_skipped_in_the_middle_are_not_taken_for_one_each()


def test_outputs_that_take_their_inputs_origin_for_its_position_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an output's origin is where its input record sits on the input edge, not where
    # that record came from (what the stage's checkpoint is computed from)
    from waymark.pipeline.batch import ORIGIN_GEN, ORIGIN_SEQ

    original = InFlight.outputs

    def input_origins(self: InFlight, data: list[bytes], source: list[int],
                      stage: bytes) -> InFlight:  # fmt: skip
        made = original(self, data, source, stage)
        made.ints[[ORIGIN_GEN, ORIGIN_SEQ]] = self.ints[[ORIGIN_GEN, ORIGIN_SEQ]][:, source]
        return made

    monkeypatch.setattr(InFlight, "outputs", input_origins)
    with pytest.raises(AssertionError):  # stopped at the first failure, unshrunk
        outputs_test(settings(OUTPUTS, phases=[Phase.generate]))


# --- mutants: each guard broken, the machine fails ------------------------------------
def test_a_release_that_assumes_a_prefix_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def prefix_only(self: InFlight, mask: np.ndarray) -> InFlight:
        return self.after(int(np.count_nonzero(~mask)))

    monkeypatch.setattr(InFlight, "keep", prefix_only)
    with pytest.raises(AssertionError):
        run_machine()


def test_a_release_that_forgets_the_generation_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def any_generation(self: InFlight, acked: Position) -> InFlight:
        from waymark.pipeline.batch import GENERATION, SEQ

        gens, seqs = self.ints[GENERATION], self.ints[SEQ]
        return self.keep(~((gens > 0) & (seqs <= acked.seq)))

    monkeypatch.setattr(InFlight, "acknowledged", any_generation)
    with pytest.raises(AssertionError):
        run_machine()


def test_an_oldest_origin_taken_from_the_front_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(InFlight, "oldest_origin", lambda self: self.origin(0) if self else None)
    with pytest.raises(AssertionError):
        run_machine()


def test_offsets_not_rebased_on_a_middle_release_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(InFlight, "_rebased", lambda self, mask: self.ints[:, mask].copy())
    with pytest.raises(AssertionError):
        run_machine()


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(st.lists(recs, max_size=12), st.integers(1, 5), st.integers(1, 400))
def test_chunks_fit_one_write_and_cover_everything_in_order(
    records: list[Rec], max_records: int, max_bytes: int
) -> None:
    # docs/semantics/pipeline.md §3.7: at most max_records per write, within max_bytes
    # unless a single record alone is larger, every record once, in order.
    batch = of(records)
    start, joined = 0, InFlight.empty()
    while start < len(batch):
        end = batch.chunk_end(start, max_records, max_bytes)
        assert start < end <= start + max_records
        piece = batch.between(start, end)
        size = sum(2 * len(piece.event_json(i)) + len(piece.value(i)) + RECORD_OVERHEAD
                   for i in range(len(piece)))  # fmt: skip
        assert size <= max_bytes or len(piece) == 1
        joined += piece
        start = end
    assert contents(joined) == contents(batch)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    st.lists(recs, max_size=12),
    st.integers(1, 4),
    st.integers(1, 200),
    st.integers(1, 3),
    st.integers(1, 600),
)
def test_writes_carry_whole_packs_within_the_limits(
    records: list[Rec], max_items: int, pack_bytes: int, max_packs: int, max_bytes: int
) -> None:
    # docs/semantics/pipeline.md §3.7: a write holds whole packs, at most max_packs of
    # them, within max_bytes unless a single pack alone is larger; every pack once.
    batch = of(records).packed(max_items, pack_bytes)
    model = packed_model(records, max_items, pack_bytes)
    assert contents(batch) == model
    start, spans = 0, pack_spans(model)
    ends = {hi for _, hi in spans}
    while start < len(batch):
        end = batch.write_end(start, max_packs, max_bytes)
        packs = [(lo, hi) for lo, hi in spans if start <= lo < end]
        assert end in ends and 1 <= len(packs) <= max_packs
        piece = batch.between(start, end)
        size = sum(2 * len(piece.event_json(i)) + len(piece.value(i)) + ITEM_OVERHEAD
                   for i in range(len(piece))) + RECORD_OVERHEAD * len(packs)  # fmt: skip
        assert size <= max_bytes or len(packs) == 1
        start = end


def test_a_pack_placed_item_by_item_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # each item at a seq of its own: a checkpoint could then fall inside a pack
    from waymark.pipeline.batch import GENERATION, SEQ

    def per_item(self: InFlight, start: int, generation: int, seqs: list[int],
                 end: int | None = None) -> None:  # fmt: skip
        end = len(self) if end is None else end
        self.ints[GENERATION, start:end] = generation
        self.ints[SEQ, start:end] = np.arange(end - start) + (seqs[0] if seqs else 0)

    monkeypatch.setattr(InFlight, "place", per_item)
    with pytest.raises(AssertionError):
        run_machine()


def test_packs_cut_by_count_alone_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = InFlight.packed
    monkeypatch.setattr(
        InFlight,
        "packed",
        lambda self, max_items=1000, max_bytes=0: original(self, max_items, 10**9),
    )
    with pytest.raises(AssertionError):
        run_machine()


# --- mutants of the window's shortcuts: each broken, the machine fails ----------------
def test_a_push_taken_as_all_written_after_a_partial_write_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the tag that lets placed() and forget() skip a push's columns, set on any write
    original = Window.place

    def trusting(self: Window, start: int, generation: int, seqs: list[int],
                 end: int | None = None) -> None:  # fmt: skip
        original(self, start, generation, seqs, end)
        for push in self._pushes:
            if push.records.written():
                push.whole = generation

    monkeypatch.setattr(Window, "place", trusting)
    with pytest.raises(AssertionError):
        run_machine()


def test_a_push_forgotten_by_seq_in_another_generation_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a push all written under one generation dropped by its seqs alone, whatever the
    # acknowledged generation (docs/semantics/pipeline.md §3.4)
    original = Window.forget

    def any_generation(self: Window, acked: Position) -> None:
        for push in self._pushes:
            if push.whole:
                push.whole = acked.generation
        original(self, acked)

    monkeypatch.setattr(Window, "forget", any_generation)
    with pytest.raises(AssertionError):
        run_machine()


def test_a_write_spanning_pushes_past_its_bytes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(InFlight, "write_size", lambda self, start, end: 0)
    with pytest.raises(AssertionError):
        run_machine()
