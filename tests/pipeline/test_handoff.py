"""Fence epochs, the handoff record on file:// and a real S3 (moto), and stage state
(docs/semantics/pipeline.md §1, §2, §4)."""

from __future__ import annotations

import pytest
from tests.objstore.s3 import moto_s3, s3_url, store_url  # noqa: F401

from waymark.objstore import open_store
from waymark.pipeline import (
    CheckpointedStageState,
    Fenced,
    FenceEpoch,
    HandoffReader,
    HandoffWriter,
    Position,
    QueueLocator,
    StageStateStore,
)


def loc(gen: int, server: str = "http://a") -> QueueLocator:
    return QueueLocator(edge="e", server=server, topic="edge.e", generation=gen, capacity=10)


def test_fence_epochs_order_and_fence() -> None:
    g = FenceEpoch(1)
    assert g.bump() == FenceEpoch(2)
    assert g.is_stale(g.bump())
    assert not g.bump().is_stale(g)
    assert not g.is_stale(g)
    with pytest.raises(ValueError):
        FenceEpoch(-1)


def test_two_producers_racing_for_one_generation_one_wins(store_url: str) -> None:  # noqa: F811
    store = open_store(store_url)
    first, second = HandoffWriter(store, "e"), HandoffWriter(store, "e")
    first.publish(loc(1))
    seen_by_first, seen_by_second = first.observe(), second.observe()
    assert first.try_publish(seen_by_first, loc(2, "http://b")) == loc(2, "http://b")
    # the second read generation 1 too: its conditional write no longer lands
    assert second.try_publish(seen_by_second, loc(2, "http://c")) is None
    with pytest.raises(Fenced) as fenced:
        second.publish(loc(2, "http://c"))
    assert fenced.value.current == loc(2, "http://b")
    assert HandoffReader(store, "e").current() == loc(2, "http://b")


def test_an_older_generation_is_never_published_over_a_newer(store_url: str) -> None:  # noqa: F811
    store = open_store(store_url)
    writer = HandoffWriter(store, "e")
    writer.publish(loc(3))
    for gen in (1, 3):
        with pytest.raises(Fenced):
            writer.publish(loc(gen, "http://b"))
    assert HandoffReader(store, "e").current() == loc(3)


def test_a_reader_polls_only_newer_locators(tmp_path: object) -> None:
    store = open_store(f"file://{tmp_path}")
    reader = HandoffReader(store, "e")
    assert reader.poll() is None
    HandoffWriter(store, "e").publish(loc(1))
    assert reader.poll() == loc(1)
    assert reader.poll() is None
    HandoffWriter(store, "e").publish(loc(2))
    assert reader.poll() == loc(2)
    assert reader.seen == FenceEpoch(2)


def test_stage_state_round_trips_and_positions_order(tmp_path: object) -> None:
    states = StageStateStore(open_store(f"file://{tmp_path}"))
    assert states.load("t") is None
    state = CheckpointedStageState(stage="t", input_edge="a", input=Position(2, 7),
                                   output_edge="b", output=Position(1, 3))  # fmt: skip
    states.save(state)
    assert states.load("t") == state
    assert Position(1, 100) < Position(2, 0) < Position(2, 1)
