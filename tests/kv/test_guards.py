"""The pure protocol guards, at their boundaries and as properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from waymark.kv.guards import (
    POINTER_ABSENT,
    PointerState,
    delivery_is_gap,
    kept_payloads,
    payload_prunable,
    pointer_publish_allowed,
    resume_window_ok,
    resume_within_stream,
)

seqs = st.integers(min_value=0, max_value=2**64 - 2)


def test_resume_window_boundaries() -> None:
    assert resume_window_ok(10, 11)  # the next sequence is still held
    assert resume_window_ok(10, 1)
    assert not resume_window_ok(10, 12)  # sequence 11 was evicted
    assert resume_window_ok(0, 1)  # no cursor: a full read from the start


@given(revision=seqs, first=seqs)
def test_resume_window_ok_iff_next_sequence_is_retained(revision: int, first: int) -> None:
    """Sound exactly when no sequence in (revision, first) was evicted unseen."""
    # Sequences revision+1 .. first-1 are gone; a sound resume misses none of them.
    missed = max(0, first - (revision + 1))
    assert resume_window_ok(revision, first) == (missed == 0)


@given(revision=seqs, last=seqs)
def test_cursor_beyond_last_sequence_is_refused(revision: int, last: int) -> None:
    assert resume_within_stream(revision, last) == (revision <= last)


@given(frontier=seqs, step=st.integers(min_value=1, max_value=5))
def test_only_a_skip_is_a_gap(frontier: int, step: int) -> None:
    assert delivery_is_gap(frontier, frontier + step) == (step > 1)


def test_pointer_publish_allowed_boundaries() -> None:
    assert pointer_publish_allowed(POINTER_ABSENT, 0)  # an open slot
    assert pointer_publish_allowed(PointerState(True, None), 0)  # corrupt: replaceable
    assert pointer_publish_allowed(PointerState(True, 7), 7)  # equal: allowed
    assert pointer_publish_allowed(PointerState(True, 7), 8)
    assert not pointer_publish_allowed(PointerState(True, 7), 6)  # stale publish refused


@given(current=st.one_of(st.none(), seqs), candidate=seqs)
def test_a_publish_is_refused_exactly_when_it_would_regress(
    current: int | None, candidate: int
) -> None:
    state = PointerState(True, current)
    assert pointer_publish_allowed(state, candidate) == (current is None or candidate >= current)


@given(
    payload=st.one_of(st.none(), seqs),
    pointer=seqs,
    target=st.booleans(),
    aged=st.booleans(),
)
def test_only_an_aged_non_target_payload_strictly_below_the_pointer_is_prunable(
    payload: int | None, pointer: int, target: bool, aged: bool
) -> None:
    prunable = payload_prunable(payload, pointer, target, aged)
    assert prunable == (not target and aged and payload is not None and payload < pointer)
    # Whatever may be pruned can never be published over this pointer afterwards.
    if prunable:
        assert payload is not None
        assert not pointer_publish_allowed(PointerState(True, pointer), payload)


orders = st.integers(min_value=0, max_value=3).flatmap(
    lambda gen: st.integers(min_value=0, max_value=50).map(lambda c: (gen << 64) | c)
)


@given(
    ranks=st.dictionaries(st.sampled_from("abcdefgh"), st.one_of(st.none(), orders)),
    pointer=orders,
    keep=st.integers(min_value=1, max_value=5),
)
def test_keep_spares_the_target_and_the_newest_restorable_payloads(
    ranks: dict[str, int | None], pointer: int, keep: int
) -> None:
    """``--keep N``: the target counts as one; the others kept are the newest of the
    pointer's generation at or below it, and nothing else."""
    ranks.pop("t", None)
    kept = kept_payloads({**ranks, "t": pointer}, pointer, "t", keep)
    restorable = [
        name for name, r in ranks.items()
        if r is not None and r >> 64 == pointer >> 64 and r <= pointer
    ]  # fmt: skip
    assert "t" in kept and len(kept) == 1 + min(keep - 1, len(restorable))
    assert kept - {"t"} <= set(restorable)
    # Newest first: a restorable payload left out is no newer than any kept one.
    for name in set(restorable) - kept:
        assert all(ranks[name] <= ranks[k] for k in kept - {"t"})  # type: ignore[operator]
