"""Routers (docs/semantics/topics.md §8) in-process: the definition rules, forwarding,
backpressure, hop-capped cycles, and router definitions and cursors through the WAL and
a seal."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Engine, ErrorCode, RecordIn, TopicError
from waymark.log.config import StorageConfig
from waymark.log.router import HOP_CAP
from waymark.log.storage.restore import open_engine
from waymark.protocol import Discard


@pytest.fixture
def engine() -> Engine:
    return Engine(clock=ManualClock())


def produce(engine: Engine, topic: str, *data: object, node: str | None = None) -> None:
    engine.append(topic, [RecordIn.of(d, node=node) for d in data])


def dest_data(engine: Engine, topic: str) -> list[object]:
    """Every record's data, across pages (a restart leaves a crash hole to page past)."""
    data: list[object] = []
    cursor = 0
    while True:
        page = engine.diff(topic, cursor, limit=10_000)
        data += [r["data"] for r in page.records()]
        if page.next_from_seq >= page.head_seq:
            return data
        cursor = page.next_from_seq


def refused(call: object, code: ErrorCode) -> dict[str, object]:
    with pytest.raises(TopicError) as info:
        call()  # type: ignore[operator]
    assert info.value.code is code
    return info.value.detail


def test_a_copy_keeps_node_tag_meta_data_and_gets_dests_own_seq(engine: Engine) -> None:
    produce(engine, "b", "direct")  # dest seqs are dest's own counter
    engine.put_router("r", "a", "b")
    engine.append("a", [RecordIn.of({"x": [1, 2]}, tag="t", node="n1", meta={"k": "v"})])
    assert dest_data(engine, "b") == ["direct"]  # nothing until forwarding runs
    assert engine.forward().copies == 1
    copy = engine.diff("b", 0).records()[1]
    assert copy["$seq"] == 2
    assert (copy["$node"], copy["$tag"], copy["meta"], copy["data"]) == (
        "n1", "t", {"k": "v"}, {"x": [1, 2]})  # fmt: skip


def test_preserve_flags_off_drop_node_and_tag(engine: Engine) -> None:
    engine.put_router("r", "a", "b", preserve_node=False, preserve_tag=False)
    engine.append("a", [RecordIn.of(1, tag="t", node="n")])
    engine.forward()
    copy = engine.diff("b", 0).records()[0]
    assert "$node" not in copy and "$tag" not in copy


def test_per_source_fifo_across_pages(engine: Engine) -> None:
    engine.put_router("r", "a", "b")
    for start in range(0, 250, 50):
        produce(engine, "a", *range(start, start + 50))
    while engine.forward(max_records=7).pending:
        pass
    assert dest_data(engine, "b") == list(range(250))
    assert engine.get_router("r").cursor == 250


def test_a_new_router_forwards_what_commits_after_it(engine: Engine) -> None:
    produce(engine, "a", "before")
    engine.put_router("r", "a", "b")
    produce(engine, "a", "after")
    engine.forward()
    assert dest_data(engine, "b") == ["after"]


def test_lazy_create_and_create_dest_false(engine: Engine) -> None:
    detail = refused(lambda: engine.put_router("r", "a", "b", create_dest=False),
                     ErrorCode.TOPIC_NOT_FOUND)  # fmt: skip
    assert detail == {"topic": "a"}
    assert engine.list_topics() == []  # a refused router creates nothing
    engine.put_router("r", "a", "b")
    assert [t.name for t in engine.list_topics()] == ["a", "b"]


def test_fan_in_from_a_different_source_is_refused(engine: Engine) -> None:
    engine.put_router("r1", "a", "d")
    engine.put_router("r2", "a", "d")  # the same source again is no fan-in
    detail = refused(lambda: engine.put_router("r3", "c", "d"),
                     ErrorCode.TOPIC_EXISTS_INCOMPATIBLE)  # fmt: skip
    assert detail["reason"] == "router_dest_fan_in"


def test_a_cycle_is_refused_with_its_path(engine: Engine) -> None:
    engine.put_router("ab", "a", "b")
    engine.put_router("bc", "b", "c")
    detail = refused(lambda: engine.put_router("ca", "c", "a"), ErrorCode.ROUTER_CYCLE)
    assert detail == {"cycle": ["c", "a", "b", "c"]}
    assert refused(lambda: engine.put_router("aa", "a", "a"), ErrorCode.ROUTER_CYCLE) == {
        "cycle": ["a", "a"]}  # fmt: skip
    assert [r.name for r in engine.list_routers()] == ["ab", "bc"]


def test_allow_cycle_terminates_at_the_hop_cap(engine: Engine) -> None:
    engine.put_router("ab", "a", "b", allow_cycle=True)
    engine.put_router("ba", "b", "a", allow_cycle=True)
    produce(engine, "a", "x")
    passes = 0
    while engine.forward().copies:
        passes += 1
        assert passes < 100, "forwarding around the cycle did not terminate"
    # The original, then copies bouncing a->b->a... until a copy has HOP_CAP hops.
    total = len(dest_data(engine, "a")) + len(dest_data(engine, "b"))
    assert total == 1 + HOP_CAP


def forward_to_quiescence(engine: Engine, topics: str) -> int:
    """Forward until nothing moves; the records in ``topics`` then."""
    for _ in range(100):
        step = engine.forward()
        if not (step.copies or step.pending):
            return sum(len(dest_data(engine, t)) for t in topics)
    raise AssertionError("forwarding around the cycle did not terminate")


def test_a_cycle_through_plain_routers_terminates_at_the_hop_cap(engine: Engine) -> None:
    # Only the closing router has allow_cycle; the copies still go round through the
    # plain ones, so those count hops too.
    engine.put_router("ab", "a", "b")
    engine.put_router("bc", "b", "c")
    engine.put_router("ca", "c", "a", allow_cycle=True)
    produce(engine, "a", "x", "y")
    assert forward_to_quiescence(engine, "abc") == 2 * (1 + HOP_CAP)
    # And in the other order the plain router would close it: refused.
    engine.put_router("ed", "e", "d", allow_cycle=True)
    assert refused(lambda: engine.put_router("de", "d", "e"), ErrorCode.ROUTER_CYCLE) == {
        "cycle": ["d", "e", "d"]}  # fmt: skip


def test_a_mixed_cycle_still_terminates_after_a_restart(tmp_path: Path) -> None:
    clock = ManualClock()
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    engine.put_router("ab", "a", "b")
    engine.put_router("ba", "b", "a", allow_cycle=True)
    store.sync_blocking()
    store.close()  # the definitions come back from the WAL
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    try:
        produce(engine, "a", "x")
        assert forward_to_quiescence(engine, "ab") == 1 + HOP_CAP
    finally:
        store.close()


def test_allow_cycle_routers_off_any_cycle_forward_past_the_hop_cap(engine: Engine) -> None:
    # A chain is no cycle: its routers count no hops, whatever their allow_cycle.
    chain = [f"t{i}" for i in range(HOP_CAP + 3)]
    for source, dest in pairwise(chain):
        engine.put_router(f"{source}-{dest}", source, dest, allow_cycle=True)
    produce(engine, "t0", "x")
    while engine.forward().copies:
        pass
    assert dest_data(engine, chain[-1]) == ["x"]


def test_identical_put_is_idempotent_and_a_different_one_conflicts(engine: Engine) -> None:
    assert engine.put_router("r", "a", "b")[1] is True
    assert engine.put_router("r", "a", "b")[1] is False
    refused(lambda: engine.put_router("r", "a", "c"), ErrorCode.TOPIC_EXISTS_INCOMPATIBLE)


def test_delete_router_stops_forwarding_and_copies_remain(engine: Engine) -> None:
    engine.put_router("r", "a", "b")
    produce(engine, "a", 1)
    engine.forward()
    engine.delete_router("r")
    produce(engine, "a", 2)
    engine.forward()
    assert dest_data(engine, "b") == [1]
    refused(lambda: engine.get_router("r"), ErrorCode.ROUTER_NOT_FOUND)


@pytest.mark.parametrize("dropped", ["a", "b"])
def test_deleting_either_topic_deletes_its_routers(engine: Engine, dropped: str) -> None:
    engine.put_router("r", "a", "b")
    engine.put_router("other", "x", "y")
    engine.delete_topic(dropped)
    assert [r.name for r in engine.list_routers()] == ["other"]


def test_deletes_do_not_propagate(engine: Engine) -> None:
    engine.put_router("r", "a", "b")
    produce(engine, "a", 1, 2)
    engine.forward()
    engine.delete("a", before_seq=3)
    engine.forward()
    assert dest_data(engine, "b") == [1, 2]


def test_reject_dest_backpressures_without_loss(engine: Engine) -> None:
    engine.put_topic("b", ConfigPatch(cap_records=3, discard=Discard.REJECT))
    engine.put_router("r", "a", "b")
    produce(engine, "a", *range(5))
    passes = 1
    while not engine.forward().blocked:
        passes += 1
        assert passes < 10, "a full reject dest never pushed back"
    assert dest_data(engine, "b") == [0, 1, 2]  # a too-big page still fills dest one by one
    assert engine.get_router("r").cursor == 3  # held at the first refused record
    assert engine.forward().blocked  # still full: nothing skipped
    engine.delete("b", before_seq=3)
    while engine.forward().pending:
        pass
    assert dest_data(engine, "b") == [2, 3, 4]  # 0 and 1 deleted: room for the held two


def test_source_records_evicted_before_forwarding_are_counted(engine: Engine) -> None:
    engine.put_topic("a", ConfigPatch(cap_records=2))
    engine.put_router("r", "a", "b")
    produce(engine, "a", *range(5))  # 1..3 evicted before the router ran
    engine.forward()
    assert dest_data(engine, "b") == [3, 4]
    assert engine.get_router("r").trimmed == 3


def test_definitions_and_cursors_survive_restart(tmp_path: Path) -> None:
    clock = ManualClock()
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    engine.put_router("r", "a", "b")
    engine.put_router("gone", "a", "c")
    engine.delete_router("gone")
    produce(engine, "a", 1, 2)
    engine.forward()
    store.sync_blocking()
    store.close()  # no seal: the WAL alone carries the definitions
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    assert [r.name for r in engine.list_routers()] == ["r"]
    assert engine.get_router("r").cursor == 0  # the cursor is only in seals
    assert dest_data(engine, "b") == []  # derived: never journaled (docs/semantics/topics.md §8.1)
    while engine.forward().pending:
        pass
    assert dest_data(engine, "b") == [1, 2]  # re-derived from the cursor
    store.seal(engine)
    store.close()
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    try:
        # From the catalog, in one cut with dest's sealed copies.
        assert engine.get_router("r").cursor == engine.get_topic("a").head_seq
        produce(engine, "a", 3)
        engine.forward()
        assert dest_data(engine, "b") == [1, 2, 3]
        engine.delete_topic("b")
        store.sync_blocking()
    finally:
        store.close()
    engine, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    try:
        assert engine.list_routers() == []  # the drop replays and takes its router with it
    finally:
        store.close()


def test_forwarding_does_not_make_the_source_look_consumed() -> None:
    engine = Engine(clock=ManualClock())
    engine.put_router("r", "src", "dst")
    produce(engine, "src", 1, 2)
    engine.forward()
    assert dest_data(engine, "dst") == [1, 2]
    state = engine.get_topic("src", touch=False)
    # docs/semantics/topics.md §3: no consumer read it, so no recency bonus either (and
    # no time passed: no aging).
    assert (state.last_read_ts, state.effective_priority) == (0, 0)
