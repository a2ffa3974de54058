"""A relocatable edge against real servers, with time injected: bounded retries and
backoff, time to recover, relocation on a failed push, and the runner's /metrics
(docs/semantics/pipeline.md §3)."""

from __future__ import annotations

import collections
import itertools
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from prometheus_client import generate_latest
from tests.conftest import start_server
from tests.pipeline.conftest import FaultProxy, Fleet

from waymark.client import Client, ConfigPatch, Durability, RecordIn
from waymark.clock import ManualClock
from waymark.faults.processes import free_port
from waymark.objstore import open_store
from waymark.pipeline import (
    EdgeUnavailable,
    HandoffReader,
    InFlight,
    RelocatableQueueEdge,
    Sink,
    Stage,
    StageStateStore,
    client_factory,
    output_event,
)
from waymark.pipeline.demo import deliver, produce
from waymark.pipeline.edge import Connect, EdgeMalformed
from waymark.pipeline.locator import HandoffRolledBack, handoff_key
from waymark.pipeline.runner import PipelineRunner
from waymark.pipeline.spec import PipelineSpec
from waymark.pipeline.stage import StageFunctionFailed
from waymark.pipeline.state import CheckpointedStageState, Position
from waymark.pipeline.window import Window
from waymark.protocol import Limits


def edges(
    fleet: Fleet, tmp_path: Path, clock: ManualClock, candidates: list[str] | None = None
) -> tuple[RelocatableQueueEdge, ...]:
    """A producer and a consumer of a fresh edge on ``candidates`` (default: the fleet's
    first two servers)."""
    store = open_store(tmp_path.as_uri())
    name = f"e-{uuid.uuid4().hex[:8]}"
    sleeps: list[float] = []

    def make() -> RelocatableQueueEdge:
        return RelocatableQueueEdge(
            name, candidates or fleet.urls[:2], store, consumer="c",
            connect=client_factory(2.0, 0.5),
            clock=clock, sleep=lambda s: (sleeps.append(s), clock.advance(int(s * 1000))),
            retries=4, poll_interval_ms=0,
        )  # fmt: skip

    return make(), make()


def one_server(
    fleet: Fleet, tmp_path: Path, clock: ManualClock
) -> tuple[StageStateStore, str, Callable[[str, str, int], RelocatableQueueEdge], Connect]:
    """Stage states, a run id, a maker of edges (name, consumer, capacity) on the first
    server alone and the clients they use, for tests that run stages step by step."""
    store = open_store(tmp_path.as_uri())
    run = uuid.uuid4().hex[:8]
    connect = client_factory(2.0, 0.5)

    def edge(name: str, consumer: str, capacity: int) -> RelocatableQueueEdge:
        return RelocatableQueueEdge(
            f"{name}-{run}", fleet.urls[:1], store, consumer=consumer, capacity=capacity,
            connect=connect, clock=clock, sleep=lambda s: clock.advance(int(s * 1000)),
            retries=2, poll_interval_ms=0,
        )  # fmt: skip

    return StageStateStore(store), run, edge, connect


def items(lo: int, hi: int) -> InFlight:
    return InFlight.of([f"p:{n}" for n in range(lo, hi)], [b'{"n":%d}' % n for n in range(lo, hi)])


def pushed(
    fleet: Fleet, tmp_path: Path, n: int
) -> tuple[RelocatableQueueEdge, RelocatableQueueEdge, FaultProxy]:
    """A producer and a consumer of a fresh edge after pushing events 0..n-1, and the
    proxy of the server the edge was placed on."""
    producer, consumer = edges(fleet, tmp_path, ManualClock())
    producer.push(items(0, n))
    placed = producer.locator
    assert placed is not None
    return producer, consumer, next(p for p in fleet.proxies if p.url == placed.server)


def test_a_push_to_a_dead_server_relocates_and_the_consumer_follows(
    fleet: Fleet, tmp_path: Path
) -> None:
    producer, consumer, dead = pushed(fleet, tmp_path, 5)
    assert producer.generation().value == 1
    assert consumer.pop(100).event_ids() == [f"p:{n}" for n in range(5)]
    dead.down()
    try:
        producer.push(items(5, 8))  # fails, relocates, writes all 8 unacknowledged again
        assert producer.generation().value == 2
        assert producer.locator is not None and producer.locator.server != dead.url
        assert producer.stats.relocations == 1
        assert producer.stats.replayed == 5
        assert producer.stats.recover_s and producer.stats.recover_s[0] > 0  # the backoff
        got = consumer.pop(100)  # the old server fails: it polls and rebinds
        got += consumer.pop(100)
        assert consumer.generation().value == 2
        assert sorted(got.event_ids()) == sorted(f"p:{n}" for n in range(8))
        assert HandoffReader(producer.writer.store, producer.name).current() == producer.locator
    finally:
        dead.up()


def test_a_consumer_takes_whole_packs_and_drops_a_record_without_a_generation(
    fleet: Fleet, tmp_path: Path
) -> None:
    # A pack's items come back as the producer wrote them, the event id as its JSON and
    # the birth time as an int, each item at its pack's position; a record with no
    # generation is stale (docs/semantics/pipeline.md §1.3); a pack of the bound
    # generation with a meta key of its own is taken; a pop takes whole packs.
    producer, consumer, _ = pushed(fleet, tmp_path, 2)
    placed = producer.locator
    assert placed is not None
    pack = {"events": ['q"\\ü', "r"], "born_ms": [7, 8], "items": [{"n": 10}, [1]]}
    with Client(placed.server) as client:
        client.append(placed.topic, [
            RecordIn.of({"n": 9}),
            RecordIn.of(pack, meta={"wm.gen": "1", "k": "v"}),
        ])  # fmt: skip
    got = consumer.pop(1)  # one item asked for: the whole first pack
    assert got.event_ids() == ["p:0", "p:1"]
    got = consumer.pop(4)  # two items a pack: two records, the stale one and a pack
    assert got.event_ids() == ['q"\\ü', "r"]
    assert got.values() == [b'{"n":10}', b"[1]"] and [got.born(i) for i in (0, 1)] == [7, 8]
    assert consumer.stats.stale_dropped == 1
    assert [got.position(i) for i in (0, 1)] == [Position(1, 3)] * 2
    assert consumer.cursor == Position(1, 3)


def test_a_consumer_counts_the_items_of_the_stale_packs_it_drops(
    fleet: Fleet, tmp_path: Path
) -> None:
    # stale_dropped counts items, as a pack's meta gives them, not records: a producer
    # that has not seen a move to the same server writes a pack of 5 stale items
    # there, then follows and writes everything again (docs/semantics/pipeline.md §3.5)
    zombie, consumer = edges(fleet, tmp_path, ManualClock(), fleet.urls[:1])
    mover = RelocatableQueueEdge(zombie.name, fleet.urls[:1], zombie.writer.store,
                                 consumer="c", identity=zombie.identity)  # fmt: skip
    zombie.push(items(0, 4))
    mover.open()
    assert mover.relocate().generation == 2  # back onto the one server
    zombie.push(items(4, 9))  # a pack of 5 under generation 1, then all 9 under 2
    got = consumer.pop(100)
    assert sorted(got.event_ids()) == sorted(f"p:{n}" for n in range(9))
    assert consumer.stats.stale_dropped == 5


def test_a_record_of_the_bound_generation_that_is_not_a_pack_is_refused(
    fleet: Fleet, tmp_path: Path
) -> None:
    # Bad input on the edge's own topic: a clear error naming the seq, never a record
    # taken half-read or skipped (docs/semantics/pipeline.md §3.1).
    producer, consumer, _ = pushed(fleet, tmp_path, 1)
    placed = producer.locator
    assert placed is not None
    with Client(placed.server) as client:
        client.append(placed.topic, [RecordIn.of({"n": 1}, meta={"wm.gen": "1"})])
    with pytest.raises(EdgeMalformed, match=r"the record at seq 2 of generation 1 is not a pack"):
        consumer.pop(100)
    assert consumer.cursor == Position(1, 0)  # not past it, nor past the good pack before it


def test_a_retried_pack_write_in_one_generation_is_absorbed(fleet: Fleet, tmp_path: Path) -> None:
    # A write whose answer was lost is written again with the same packs, whose ids
    # the topic absorbs: the consumer reads each item once
    # (docs/semantics/pipeline.md §3.1).
    producer, consumer = edges(fleet, tmp_path, ManualClock())
    producer.push(items(0, 5))
    placed = producer.locator
    assert placed is not None
    with Client(placed.server) as client:
        twice = producer.unacked.edge_packs(0, placed.generation)
        again = client.append(placed.topic, msgspec.json.decode(b"[" + twice + b"]",
                                                                type=list[RecordIn]))  # fmt: skip
        assert client.get_topic(placed.topic).assigned_head_seq == placed.start_seq + 1
    assert list(again.seqs) == [placed.start_seq + 1]
    # As if its answer was lost (a push that gave up): the next push writes the pack
    # again, as it was cut, ahead of its own (docs/semantics/pipeline.md §3.3).
    producer.unacked.place(0, 0, [0])
    producer.push(items(5, 7))
    got = consumer.pop(100) + consumer.pop(100)
    assert got.event_ids() == [f"p:{n}" for n in range(7)]
    assert not consumer.pop(100)


def test_a_push_larger_than_a_pack_is_cut_into_packs_and_writes(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Packs stay within PACK_ITEMS items and PACK_BYTES, writes within the server's
    # records per write (docs/semantics/pipeline.md §3.7); here all three shrunk.
    monkeypatch.setattr(InFlight.packed, "__defaults__", (3, 100))
    monkeypatch.setattr(Window.write_end, "__defaults__", (2, 1 << 20))
    appends: list[int] = []
    producer, consumer = edges(fleet, tmp_path, ManualClock())
    real = producer.connect

    wrapped: set[str] = set()

    def counting(url: str) -> Client:
        client = real(url)
        if url in wrapped:
            return client
        wrapped.add(url)
        original = client.append

        def append(topic: str, body: object, **kwargs: object) -> object:
            appends.append(body.count(b'"id":') if isinstance(body, bytes) else -1)
            return original(topic, body, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(client, "append", append)
        return client

    producer.connect = counting
    big = InFlight.of([f"p:{n}" for n in range(8)], [b'"%s"' % (b"x" * (30 if n == 4 else 1))
                                                    for n in range(8)])  # fmt: skip
    producer.push(big)
    # 32 bytes an item as packed() counts them, item 4 61: items 0-2 (the limit of 3),
    # 3-4 (5 would pass 100 bytes), 5-7
    assert producer.unacked.packs() == 3
    assert appends == [2, 1]  # two packs per write
    placed = producer.locator
    assert placed is not None
    with Client(placed.server) as client:
        assert client.get_topic(placed.topic).assigned_head_seq == placed.start_seq + 3
    got = consumer.pop(1)  # one item asked for: the whole first pack
    assert got.event_ids() == ["p:0", "p:1", "p:2"]
    got = consumer.pop(5)  # then as many packs as hold about 5 items at 3 a pack
    assert got.event_ids() == [f"p:{n}" for n in range(3, 8)]
    assert [got.position(i).seq for i in range(5)] == [placed.start_seq + s  # type: ignore[union-attr]
                                                      for s in (2, 2, 3, 3, 3)]  # fmt: skip


def test_records_of_a_push_that_gave_up_are_written_by_the_next_one(
    fleet: Fleet, tmp_path: Path
) -> None:
    # A push that runs out of retries leaves its records unwritten; they stay
    # unacknowledged, so the next push must write them before its own: a producer writes
    # every record not yet written under the bound generation (docs/semantics/pipeline.md §3.3).
    producer, consumer, home = pushed(fleet, tmp_path, 3)
    other = next(p for p in fleet.proxies[:2] if p is not home)
    home.down()
    other.down()
    try:
        with pytest.raises(EdgeUnavailable):
            producer.push(items(3, 5))  # nowhere to write nor to move to
    finally:
        home.up()
        other.up()
    producer.push(items(5, 6))  # the first server is back: 3 and 4 go with 5
    assert sorted(consumer.pop(100).event_ids()) == [f"p:{n}" for n in range(6)]
    assert producer.generation().value == 1 and producer.stats.replayed == 0


def test_an_idle_producer_moves_its_edge_off_a_dead_server(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only a producer moves an edge: one with nothing new to write must still notice
    # that its unacknowledged items sit on a dead server (docs/semantics/pipeline.md §3.4).
    producer, consumer, dead = pushed(fleet, tmp_path, 3)
    dead.down()
    try:
        with monkeypatch.context() as mutant:  # the probe removed: the edge stays put
            mutant.setattr(RelocatableQueueEdge, "_reachable", lambda self: True)
            producer.settle()
            assert producer.generation().value == 1
            assert len(consumer.pop(100)) == 0
        producer.settle()
        assert producer.generation().value == 2 and producer.stats.replayed == 3
        got = consumer.pop(100) + consumer.pop(100)
        assert sorted(got.event_ids()) == [f"p:{n}" for n in range(3)]
    finally:
        dead.up()


def test_a_bounded_edge_does_not_fill_up_with_acknowledged_records(
    fleet: Fleet, tmp_path: Path
) -> None:
    # 60 events through an edge of capacity 10 (docs/semantics/pipeline.md §3.6).
    clock = ManualClock()
    states, run, edge, connect = one_server(fleet, tmp_path, clock)
    source = Stage("produce", produce, states=states, output=edge("cap", "sink", 10), events=60,
                   batch=5, clock=clock)  # fmt: skip
    sink = Stage("sink", deliver, states=states, input=edge("cap", "sink", 10), clock=clock,
                 sink=Sink(fleet.sink.url, f"cap-{run}", connect=connect))  # fmt: skip
    source.start()
    sink.start()
    for _ in range(60):
        if source.finished():
            break
        source.step()
        sink.step()
    assert source.finished()
    with Client(fleet.sink.url) as client:
        page = client.diff(f"cap-{run}", 0, limit=1000)
        assert sorted(r.data["event_id"] for r in page.records) == list(range(60))
    with Client(fleet.urls[0]) as client:
        assert client.get_topic(sink.input.topic).count <= 10  # type: ignore[union-attr]


def test_acknowledged_packs_are_deleted_a_tenth_of_the_capacity_in_items_at_a_time(
    fleet: Fleet, tmp_path: Path
) -> None:
    # Capacity counts items: with packs of 100 and a capacity of 1,000 the consumer
    # deletes what it acknowledged every 100 items, one pack, not every 100 packs
    # (10,000 items) (docs/semantics/pipeline.md §3.6).
    clock = ManualClock()
    states, run, edge, connect = one_server(fleet, tmp_path, clock)
    source = Stage("produce", produce, states=states, output=edge("ten", "sink", 1000),
                   events=2000, batch=100, clock=clock)  # fmt: skip
    sink = Stage("sink", deliver, states=states, input=edge("ten", "sink", 1000), clock=clock,
                 batch=100, sink=Sink(fleet.sink.url, f"ten-{run}", connect=connect))  # fmt: skip
    source.start()
    sink.start()
    for _ in range(100):
        if source.finished():
            break
        source.step()
        sink.step()
    assert source.finished()
    with Client(fleet.urls[0]) as client:
        assert client.get_topic(sink.input.topic).count <= 2  # type: ignore[union-attr]


def test_retries_are_bounded_and_backed_off_on_the_injected_clock(
    fleet: Fleet, tmp_path: Path
) -> None:
    clock = ManualClock()
    producer, _ = edges(fleet, tmp_path, clock)
    producer.push(items(0, 1))
    for proxy in fleet.proxies[:2]:
        proxy.down()
    try:
        before = clock.now_ms()
        try:
            producer.push(items(1, 2))
        except EdgeUnavailable:
            pass
        else:
            raise AssertionError("a push with every candidate dead must give up")
        waited = clock.now_ms() - before
        # 4 retries, each at least half its capped exponential ceiling (50 ms base)
        assert waited >= (25 + 50 + 100 + 200)
        assert len(producer.unacked) == 2  # nothing forgotten
    finally:
        for proxy in fleet.proxies[:2]:
            proxy.up()


def test_the_runner_exports_pipeline_metrics(fleet: Fleet, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    spec = PipelineSpec.parse({
        "pipeline": {"handoff": tmp_path.as_uri()},
        "edge": [{"name": f"r{run}", "candidates": fleet.urls[:2]}],
        "stage": [
            {"name": "produce", "function": "waymark.pipeline.demo:produce", "events": 50,
             "output": f"r{run}"},
            {"name": "sink", "function": "waymark.pipeline.demo:deliver", "input": f"r{run}",
             "sink": {"url": fleet.sink.url, "topic": f"m{run}"}},
        ],
    })  # fmt: skip
    runner = PipelineRunner(spec, report_interval_s=0.05)
    runner.start()
    assert runner.wait(60)
    runner.stop()
    text = generate_latest(runner.registry).decode()
    assert 'waymark_pipeline_processed{stage="produce"} 50.0' in text
    assert 'waymark_pipeline_processed{stage="sink"} 50.0' in text
    assert f'waymark_pipeline_edge_generation{{edge="r{run}",server="{fleet.urls[0]}"}} 1.0' in text
    assert f'waymark_pipeline_edge_lag{{edge="r{run}"}} 0.0' in text  # all acknowledged
    assert 'waymark_pipeline_dead_lettered{stage="sink"} 0.0' in text
    assert 'waymark_pipeline_latency_seconds_count{phase="before"} 50.0' in text


def test_the_relocate_demo_reports_exactly_once_as_json() -> None:
    # The demo's source waits at the kill point until the kill landed, so the kill
    # always finds events to write on raw and moves it however loaded the machine is;
    # once half the events were made, everything could be written and acknowledged
    # before the kill, and nothing moved (docs/pipeline.md, "The demo").
    waymark = str(Path(sys.executable).parent / "waymark")
    done = subprocess.run([waymark, "demo", "relocate", "--events", "3000", "--json"],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["events"] == 3000 and summary["lost"] == 0 and summary["duplicated"] == 0
    assert summary["killed"] and summary["relocations"] >= 1
    assert summary["generations"]["raw"] >= 2 and summary["time_to_recover_s"] > 0
    assert {"replayed", "wall_s"} <= summary.keys()


def test_the_relocate_demo_fails_a_run_the_kill_did_not_move() -> None:
    # docs/pipeline.md, "The demo": exit 0 needs the kill, a move of raw, and exactly once
    from waymark.cli.relocate import passed

    good = {"killed": True, "relocations": 1, "generations": {"raw": 2, "enriched": 1},
            "lost": 0, "duplicated": 0}  # fmt: skip
    assert passed(good)
    unmoved = {"relocations": 0, "generations": {"raw": 1, "enriched": 1}}
    for bad in ({"killed": False}, unmoved, {"generations": {"raw": 1, "enriched": 2}},
                {"lost": 3}, {"duplicated": 1}):  # fmt: skip
        assert not passed({**good, **bad}), bad


def test_the_demo_source_holds_its_events_from_the_kill_point_until_released() -> None:
    from waymark.pipeline.demo import HeldSource, produce

    source = HeldSource()
    source.hold(2)
    assert source(1) == produce(1) and not source.reached.is_set()
    later = threading.Thread(target=source, args=(2,))
    later.start()
    assert source.reached.wait(10)
    later.join(0.05)
    assert later.is_alive()  # held
    source.release()
    later.join(10)
    assert not later.is_alive()


def fan_out(event: dict[str, int]) -> list[dict[str, int]]:
    return [{**event, "k": k} for k in range(3)]


def test_several_outputs_per_input_with_awkward_ids_reach_the_sink_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    # Three outputs per input, a stage name JSON must escape, batches and acknowledgements
    # that cut one input's outputs apart: the sink gets each output once, under the id
    # output_event gives it (docs/semantics/pipeline.md §5.1).
    clock = ManualClock()
    states, run, make, connect = one_server(fleet, tmp_path, clock)

    def edge(name: str, consumer: str) -> RelocatableQueueEdge:
        return make(name, consumer, 1000)

    name = 'pr"o\\d/ü'
    source = Stage(name, lambda n: {"n": n}, states=states, output=edge("a", "fan"),
                   events=20, batch=7, clock=clock)  # fmt: skip
    fan = Stage("fan", fan_out, states=states, input=edge("a", "fan"),
                output=edge("b", "sink"), batch=4, clock=clock)  # fmt: skip
    sink = Stage("sink", deliver, states=states, input=edge("b", "sink"), batch=5, clock=clock,
                 sink=Sink(fleet.sink.url, f"fan-{run}", connect=connect))  # fmt: skip
    stages = (source, fan, sink)
    for stage in stages:
        stage.start()
    for _ in range(200):
        if source.finished() and not fan.output.unacked:  # type: ignore[union-attr]
            break
        for stage in stages:
            stage.step()
    assert source.finished()
    expected = [(n, k) for n in range(20) for k in range(3)]
    with Client(fleet.sink.url) as client:
        page = client.diff(f"fan-{run}", 0, limit=1000)
        assert sorted((r.data["n"], r.data["k"]) for r in page.records) == expected
        # each was written under the id output_event gives it: the same ids again are
        # absorbed by the sink's idempotency window, and a new one is not
        ids = [output_event(source.identity.event(name, n), "fan", k) for n, k in expected]
        ids.append("new")
        sink.sink.write(InFlight.of(ids, [b"0"] * len(ids)))  # type: ignore[union-attr]
        assert client.get_topic(f"fan-{run}").count == len(expected) + 1


def test_a_push_and_a_replay_above_the_servers_write_limit_are_written_in_chunks(
    fleet: Fleet, tmp_path: Path
) -> None:
    # The server takes at most Limits.max_records_per_write records per append; a push
    # of more (one batch's fan-out) and the replay after a move are cut to fit
    # (docs/semantics/pipeline.md §3.7).
    over = Limits().max_records_per_write + 2_000
    producer, consumer, dead = pushed(fleet, tmp_path, over)
    assert producer.unacked.written() == over
    dead.down()
    try:
        producer.settle()  # an idle producer moves the edge and writes all of it again
        assert producer.generation().value == 2 and producer.stats.replayed == over
        got = consumer.pop(10_000)  # the dead server: it rebinds
        while len(more := consumer.pop(10_000)):
            got += more
        assert sorted(got.event_ids()) == sorted(f"p:{n}" for n in range(over))
    finally:
        dead.up()


def test_a_fan_out_above_the_write_limit_reaches_the_sink_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    # 500 events, 25 outputs each: one step of the transform pushes 12,500 records; the
    # sink stage doubles what it pops, 10,000 at a time, and writes that in chunks too
    # (docs/semantics/pipeline.md §3.7).
    clock = ManualClock()
    states, run, edge, connect = one_server(fleet, tmp_path, clock)
    source = Stage("produce", produce, states=states, output=edge("src", "fan", 10**6),
                   events=500, batch=500, clock=clock)  # fmt: skip
    fan = Stage("fan", lambda e: [{**e, "k": k} for k in range(25)], states=states,
                input=edge("src", "fan", 10**6), output=edge("out", "sink", 10**6),
                batch=500, clock=clock)  # fmt: skip
    sink = Stage("sink", lambda e: [e, e], states=states, input=edge("out", "sink", 10**6),
                 clock=clock, batch=10_000,
                 sink=Sink(fleet.sink.url, f"wide-{run}", connect=connect))  # fmt: skip
    for stage in (source, fan, sink):
        stage.start()
    for _ in range(20):
        if source.finished() and not fan.output.unacked:  # type: ignore[union-attr]
            break
        for stage in (source, fan, sink):
            stage.step()
    assert source.finished()
    with Client(fleet.sink.url) as client:
        assert client.get_topic(f"wide-{run}").count == 500 * 25 * 2


def test_time_to_recover_counts_from_the_call_a_hung_server_never_answered(
    fleet: Fleet, tmp_path: Path
) -> None:
    # A hung server answers nothing until the client's timeout (0.5 s here): the outage
    # began when the unanswered call did, not when its timeout fired.
    producer = RelocatableQueueEdge(
        f"h-{uuid.uuid4().hex[:8]}", fleet.urls[:2], open_store(tmp_path.as_uri()),
        consumer="c", connect=client_factory(0.5, 0.5), retries=4, poll_interval_ms=0,
    )  # fmt: skip
    producer.push(items(0, 3))
    assert producer.locator is not None
    hung = next(p for p in fleet.proxies if p.url == producer.locator.server)
    hung.hang()
    try:
        producer.push(items(3, 5))  # times out, moves, writes all five again
        assert producer.generation().value == 2
        assert producer.stats.recover_s and producer.stats.recover_s[0] >= 0.5
    finally:
        hung.up()


def test_a_rolled_back_handoff_record_stops_the_consumer_instead_of_stalling_it(
    fleet: Fleet, tmp_path: Path
) -> None:
    producer, consumer, _ = pushed(fleet, tmp_path, 3)
    first = producer.locator
    assert first is not None
    producer.relocate()
    consumer.pop(100)  # follows the move: bound to generation 2
    assert consumer.generation().value == 2
    # the store restored from a backup taken at generation 1
    producer.writer.store.put(handoff_key(producer.name), msgspec.json.encode(first))
    with pytest.raises(HandoffRolledBack, match="holds generation 1, but generation 2"):
        consumer.pop(100)


def test_a_busy_stage_saves_its_checkpoint_at_most_every_interval(
    fleet: Fleet, tmp_path: Path
) -> None:
    # docs/semantics/pipeline.md §4.2: a moving position is saved at most every
    # checkpoint_interval_ms, an idle step saves what moved at once, and a stage saves
    # at least every second (a superseded instance learns it is).
    clock = ManualClock()
    states, run, edge, connect = one_server(fleet, tmp_path, clock)
    sink_states = StageStateStore(states.store)
    saved: list[int] = []
    save = sink_states.save
    sink_states.save = lambda state: (saved.append(clock.now_ms()), save(state))[1]  # type: ignore[method-assign]
    source = Stage("produce", produce, states=states, output=edge("ck", "sink", 10**6),
                   events=100, batch=5, clock=clock, checkpoint_interval_ms=200)  # fmt: skip
    sink = Stage("sink", deliver, states=sink_states, input=edge("ck", "sink", 10**6),
                 batch=5, clock=clock, checkpoint_interval_ms=200,
                 sink=Sink(fleet.sink.url, f"ck-{run}", connect=connect))  # fmt: skip
    source.start()
    sink.start()
    for _ in range(20):  # busy: 5 events a step, 50 ms apart
        source.step()
        assert sink.step() == 5
        clock.advance(50)
    assert 4 <= len(saved) <= 6  # 1 s of steps, one save per 200 ms
    assert all(b - a >= 200 for a, b in itertools.pairwise(saved))
    sink.step()  # idle: what moved is saved at once, and the producer is acknowledged
    source.step()
    assert source.finished() and len(saved) <= 7
    before = len(saved)
    for _ in range(30):  # idle and nothing moves for 2.9 s: a save a second
        sink.step()
        clock.advance(100)
    assert len(saved) - before == 2


def test_a_busy_consumer_saves_once_it_took_save_every_records_within_the_interval(
    fleet: Fleet, tmp_path: Path
) -> None:
    # docs/pipeline.md, "Flow control": a consumer gives its producers credit back before
    # their window fills: once it took save_every records since its last save it saves,
    # though the interval has not passed (the clock stands still here)
    clock = ManualClock()
    states, run, edge, connect = one_server(fleet, tmp_path, clock)
    sink_states = StageStateStore(states.store)
    saved: list[Position | None] = []
    save = sink_states.save
    sink_states.save = lambda state: (saved.append(state.input), save(state))[1]  # type: ignore[method-assign]
    source = Stage("produce", produce, states=states, output=edge("cr", "sink", 10**6),
                   events=100, batch=5, clock=clock, checkpoint_interval_ms=200)  # fmt: skip
    sink = Stage("sink", deliver, states=sink_states, input=edge("cr", "sink", 10**6),
                 batch=5, clock=clock, checkpoint_interval_ms=200, save_every=10,
                 sink=Sink(fleet.sink.url, f"cr-{run}", connect=connect))  # fmt: skip
    source.start()
    sink.start()
    for _ in range(8):  # 40 records, no time passing: the first step's save, then one
        source.step()  # every second step
        assert sink.step() == 5
    assert len(saved) == 4 and saved == sorted(saved)  # by the interval alone: 1


def test_a_stage_writing_two_edges_sends_every_output_down_both(
    fleet: Fleet, tmp_path: Path
) -> None:
    # docs/pipeline.md, "Fan-out": a broadcast to two edges whose sinks write one topic;
    # the second branch's ids differ, so both copies of each event are kept, and the
    # source is done only once both consumers acknowledged.
    run = uuid.uuid4().hex[:6]
    spec = PipelineSpec.parse({
        "pipeline": {"handoff": tmp_path.as_uri(), "servers": fleet.urls[:2]},
        "edge": [{"name": f"in{run}"}, {"name": f"a{run}"}, {"name": f"b{run}"}],
        "stage": [
            {"name": "produce", "function": "waymark.pipeline.demo:produce", "events": 300,
             "batch": 70, "output": f"in{run}"},
            {"name": "fan", "function": "waymark.pipeline.demo:enrich", "input": f"in{run}",
             "output": [f"a{run}", f"b{run}"], "batch": 50},
            *({"name": f"sink{x}", "function": "waymark.pipeline.demo:deliver",
               "input": f"{x}{run}", "sink": {"url": fleet.sink.url, "topic": f"fan{run}"}}
              for x in "ab"),
        ],
    })  # fmt: skip
    assert spec.stages["fan"].outputs == (f"a{run}", f"b{run}")
    runner = PipelineRunner(spec, report_interval_s=0.05)
    runner.start()
    assert runner.wait(60), runner.failure()
    runner.stop()
    seen: collections.Counter[int] = collections.Counter()
    with Client(fleet.sink.url) as client:
        page = client.diff(f"fan{run}", 0, limit=1000)
        seen.update(r.data["event_id"] for r in page.records)
    assert seen == collections.Counter(2 * list(range(300)))


def test_a_poison_event_of_a_source_is_dead_lettered_with_its_number(
    fleet: Fleet, tmp_path: Path
) -> None:
    # docs/semantics/pipeline.md §9.2 for a source stage: its function fails on event 3;
    # once that event is poison, the next instance writes the number to the dead-letter
    # topic and produces the rest.
    clock = ManualClock()
    states, run, edge, connect = one_server(fleet, tmp_path, clock)

    def produce_but_3(n: int) -> dict[str, int]:
        if n == 3:
            raise ValueError("three")
        return produce(n)

    def source(poison: dict[bytes, tuple[int, str]]) -> Stage:
        stage = Stage("produce", produce_but_3, states=states, events=6, batch=6, clock=clock,
                      output=edge("src", "sink", 100), poison=poison,
                      dead_letter=Sink(fleet.sink.url, f"dead-{run}", connect=connect))  # fmt: skip
        stage.start()
        return stage

    with pytest.raises(StageFunctionFailed) as failed:
        source({}).step()
    assert failed.value.error == "ValueError: three"
    poisoned = source({failed.value.event: (3, failed.value.error)})
    sink = Stage("sink", deliver, states=states, input=edge("src", "sink", 100), clock=clock,
                 sink=Sink(fleet.sink.url, f"out-{run}", connect=connect))  # fmt: skip
    sink.start()
    for _ in range(5):
        poisoned.step()
        sink.step()
    assert poisoned.finished() and poisoned.stats.dead_lettered == 1
    with Client(fleet.sink.url) as client:
        assert sorted(r.data["event_id"] for r in client.diff(f"out-{run}", 0).records) == [
            0, 1, 2, 4, 5]  # fmt: skip
        (dead,) = client.diff(f"dead-{run}", 0).records
    assert dead.data == 3 and dead.meta is not None
    assert dead.meta["wm.error"] == "ValueError: three" and dead.meta["wm.attempts"] == "3"
    assert dead.meta["wm.event"] == poisoned.identity.event("produce", 3)


def test_a_stage_takes_no_input_while_an_output_holds_its_window(
    fleet: Fleet, tmp_path: Path
) -> None:
    # docs/pipeline.md, "Flow control": at max_in_flight unacknowledged records the
    # source produces nothing more until its consumer's checkpoint frees the window, and
    # skips no event meanwhile
    clock = ManualClock()
    states, run, edge, connect = one_server(fleet, tmp_path, clock)
    source = Stage("produce", produce, states=states, events=50, batch=10, clock=clock,
                   output=edge("src", "sink", 1000), max_in_flight=20)  # fmt: skip
    source.start()
    assert [source.step(), source.step()] == [10, 10]
    assert source.step() == 0 and source.held_back and source.next_event == 20
    sink = Stage("sink", deliver, states=states, input=edge("src", "sink", 1000), clock=clock,
                 sink=Sink(fleet.sink.url, f"out-{run}", connect=connect))  # fmt: skip
    sink.start()
    for _ in range(60):
        source.step()
        sink.step()
        if source.finished():
            break
    assert source.finished()
    with Client(fleet.sink.url) as client:
        got = [r.data["event_id"] for r in client.diff(f"out-{run}", 0, limit=100).records]
    assert sorted(got) == list(range(50))


def test_an_edges_capacity_holds_the_producer_back_in_items_not_packs(
    fleet: Fleet, tmp_path: Path
) -> None:
    # docs/pipeline.md, "Flow control": capacity counts items, as a user sets it in
    # events; with packs of 500 a capacity of 1,500 holds the source at 1,500
    # unacknowledged items (three packs), never 1,500 packs, and skips nothing
    clock = ManualClock()
    states, run, edge, connect = one_server(fleet, tmp_path, clock)
    source = Stage("produce", produce, states=states, events=5000, batch=500, clock=clock,
                   output=edge("src", "sink", 1500))  # fmt: skip
    source.start()
    assert [source.step() for _ in range(4)] == [500, 500, 500, 0]
    assert source.held_back and len(source.outputs[0].unacked) == 1500
    sink = Stage("sink", deliver, states=states, input=edge("src", "sink", 1500), clock=clock,
                 batch=500, sink=Sink(fleet.sink.url, f"out-{run}", connect=connect))  # fmt: skip
    sink.start()
    most = 0
    for _ in range(60):
        source.step()
        most = max(most, len(source.outputs[0].unacked))
        sink.step()
        if source.finished():
            break
    assert source.finished() and most <= 1500
    with Client(fleet.sink.url) as client:
        got = [r.data["event_id"] for r in client.diff(f"out-{run}", 0, limit=5000).records]
    assert sorted(got) == list(range(5000))


def test_records_a_server_restart_lost_on_an_edge_are_written_again(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A server that comes back without records its producer wrote there (a crash takes
    a `disk` topic's acknowledged tail that was not synced yet; here, deterministically,
    an `ephemeral` edge topic loses everything on a restart) must not be read past in
    silence: the consumer meets the `lost` tombstone, moves the edge, and its producer,
    who still holds every record the consumer did not acknowledge, writes them again
    (docs/semantics/pipeline.md §3.5)."""
    port = free_port()
    server = start_server(tmp_path / "edge-data", port=port)
    try:
        handoff = tmp_path / "handoff"
        handoff.mkdir()
        producer, consumer = edges(fleet, handoff, ManualClock(), [server.url, fleet.urls[0]])
        with Client(server.url) as client:  # the edge's topic, as one a restart empties
            client.put_topic(producer.topic, ConfigPatch(durability=Durability.EPHEMERAL))
        producer.push(items(0, 10))
        assert producer.generation().value == 1
        server.stop()
        server = start_server(tmp_path / "edge-data", port=port)
        producer.push(items(10, 15))  # the server answers again: nothing moves the edge
        assert producer.generation().value == 1
        got = InFlight.empty()
        for _ in range(5):
            got += consumer.pop(100)
            producer.settle()  # follows the consumer's move and writes the rest there
        assert sorted(got.event_ids()) == sorted(f"p:{n}" for n in range(15))
        assert consumer.generation().value == 2
        assert consumer.stats.relocations == 1
    finally:
        server.process.kill()
        server.process.wait()


def test_a_consumer_checkpoint_never_falls_inside_a_pack(fleet: Fleet, tmp_path: Path) -> None:
    # A pop takes whole packs, each item at its pack's position, so the stage's saved
    # input position is a pack's seq: a restart reads a pack whole or not at all
    # (docs/semantics/pipeline.md §3.4), and the sink gets each event once.
    clock = ManualClock()
    states, run, edge, connect = one_server(fleet, tmp_path, clock)
    source = Stage("produce", produce, states=states, output=edge("ck", "sink", 10**6),
                   events=10, batch=5, clock=clock)  # fmt: skip

    def consumer() -> Stage:
        sink = Sink(fleet.sink.url, f"ck-{run}", connect=connect)
        return Stage("sink", deliver, states=states, input=edge("ck", "sink", 10**6),
                     batch=1, clock=clock, sink=sink)  # fmt: skip

    source.start()
    source.step()
    source.step()  # two pushes of five events: two packs
    source.drain()
    assert source.output is not None
    packs = [source.output.unacked.joined().position(i) for i in (0, 5)]
    first = consumer()
    first.start()
    assert first.step() == 5  # one item asked for: the whole first pack
    first.drain()  # its save, after its sink write
    saved = states.load("sink")
    assert saved is not None and saved.input == packs[0]
    first.close()
    again = consumer()  # a restart from the checkpoint: the second pack whole
    again.start()
    assert again.step() == 5
    with Client(fleet.sink.url) as client:
        assert client.get_topic(f"ck-{run}").head_seq == 10
    source.step()
    assert source.finished()


def test_a_replay_after_a_move_repacks_what_is_unacknowledged(fleet: Fleet, tmp_path: Path) -> None:
    # Acknowledged packs are forgotten whole; after a move the rest is written again
    # under the new generation, packed as pushed, with new ids; the consumer reads each
    # unacknowledged item once more and the sink, by event id, holds each event once
    # (docs/semantics/pipeline.md §3.4, §5.2).
    producer, consumer = edges(fleet, tmp_path, ManualClock())
    for lo in (0, 3, 6):
        producer.push(items(lo, lo + 3))  # three packs
    placed = producer.locator
    assert placed is not None
    got = consumer.pop(100)
    assert got.event_ids() == [f"p:{n}" for n in range(9)]
    states = StageStateStore(producer.writer.store)
    state = states.claim(CheckpointedStageState(stage="c", input_edge=producer.name), "c/one")
    state.input = got.position(3)  # the consumer's checkpoint: the first two packs
    states.save(state)
    producer.trim()
    assert producer.unacked.joined().event_ids() == ["p:6", "p:7", "p:8"]
    dead = next(p for p in fleet.proxies if p.url == placed.server)
    dead.down()
    try:
        producer.push(items(9, 10))  # fails, relocates, writes the third pack again
        assert producer.generation().value == 2 and producer.stats.replayed == 3
        assert producer.unacked.packs() == 2
        replayed = consumer.pop(100) + consumer.pop(100)
        assert consumer.generation().value == 2
        assert replayed.event_ids() == ["p:6", "p:7", "p:8", "p:9"]
        assert {replayed.position(i) for i in range(3)} == {Position(2, 1)}
    finally:
        dead.up()
    sink = Sink(fleet.sink.url, f"replay-{uuid.uuid4().hex[:8]}", connect=client_factory())
    sink.open()
    sink.write(got)
    sink.write(replayed)  # 6-8 a second time: absorbed by their ids
    with Client(fleet.sink.url) as client:
        records = client.diff(sink.topic, 0, limit=100).records
    assert sorted(r.data["n"] for r in records) == list(range(10))  # each event once
