"""Gradual replay of memory-class topics (docs/semantics/topics.md §2.2): it never blocks
readiness.

Recovery sets a memory topic's WAL frames aside and returns a usable engine; the
frames are applied by steps, or all at once by the first use of the topic, in the
order they were written. The last test does it with a real server: SIGKILL after
300k records, restart, ready before the memory topic has recovered.
"""

from __future__ import annotations

import signal
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec
import pytest

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Durability, Engine, RecordIn, TagMatch
from waymark.log.config import StorageConfig
from waymark.log.storage.restore import RestoreReport, open_engine
from waymark.log.storage.store import Store
from waymark.protocol import QueueCounts

MEMORY = ConfigPatch(durability=Durability.MEMORY)


def reopen(data_dir: Path, **kwargs) -> tuple[Engine, Store, RestoreReport]:
    return open_engine(StorageConfig(data_dir), **kwargs)


def crash(store: Store) -> None:
    """Stop as a SIGKILL would once the WAL is on disk: no exact heads, no seal."""
    store.sync_blocking()
    store.close()


def pages(engine: Engine, topic: str) -> list[bytes]:
    """Every diff page of ``topic`` from the start (reading finishes its recovery)."""
    out, cursor = [], 0
    while True:
        page = engine.diff(topic, cursor, limit=1000)
        out.append(page.to_json())
        cursor = page.next_from_seq
        if page.caught_up:
            return out


def data(engine: Engine, topic: str) -> list[object]:
    found, cursor = [], 0
    while True:
        page = engine.diff(topic, cursor, limit=1000)
        found += [r["data"] for r in page.records()]
        cursor = page.next_from_seq
        if page.caught_up:
            return found


def recovering(engine: Engine) -> list[str]:
    return [state.name for state in engine.list_topics() if state.recovering]


def fill(engine: Engine, topic: str, n: int, batch: int = 10, start: int = 0) -> None:
    for i in range(start, start + n, batch):
        engine.append(topic, [RecordIn.of(j, tag=f"k{j % 3}") for j in range(i, i + batch)])


def written(tmp_path: Path) -> list[bytes]:
    """2000 records of a memory topic and 500 of a disk topic, in the WAL only; returns
    the memory topic's pages (a crash adds a ``lost`` hole to the disk topic's)."""
    engine, store, _ = reopen(tmp_path)
    engine.put_topic("mem", MEMORY)
    fill(engine, "mem", 2000)
    fill(engine, "disk", 500)
    expected = pages(engine, "mem")
    crash(store)
    return expected


def test_the_engine_is_usable_before_the_memory_topic_has_recovered(tmp_path: Path) -> None:
    mem_pages = written(tmp_path)
    engine, store, report = reopen(tmp_path)
    assert (report.deferred_topics, report.deferred_frames) == (1, 200)
    # The disk topic is whole at once; the memory topic exists with its config, not its records.
    assert not engine.get_topic("disk").recovering and engine.get_topic("disk").count == 500
    state = engine.get_topic("mem")
    assert state.recovering and state.config.durability is Durability.MEMORY
    assert (state.head_seq, state.count) == (0, 0)
    assert recovering(engine) == ["mem"]
    assert msgspec.to_builtins(engine.get_topic("mem"))["recovering"] is True
    assert data(engine, "disk") == list(range(500))
    # Steps apply it in order, a bounded slice at a time: counts only grow.
    assert engine.replaying is not None
    counts, steps = [], 0
    while engine.replaying is not None:
        more = engine.replaying.step(max_bytes=4096)
        counts.append(engine.get_topic("mem", touch=False).count)
        steps += 1
        assert more == (engine.replaying is not None)
    assert steps > 10 and counts == sorted(counts) and counts[-1] == 2000
    assert recovering(engine) == []
    assert "recovering" not in msgspec.to_builtins(engine.get_topic("mem"))
    assert pages(engine, "mem") == mem_pages
    crash(store)


USES: dict[str, tuple[Callable[[Engine], object], int]] = {
    # what touches the topic, and its count afterwards
    "diff": (lambda e: e.diff("mem", 0), 2000),
    "append": (lambda e: e.append("mem", [RecordIn.of("new")]), 2001),
    "delete": (lambda e: e.delete("mem", match=TagMatch.parse("k0")), 1333),
    "delete_seqs": (lambda e: e.delete_seqs("mem", [5]), 1999),
    "reconfigure": (lambda e: e.put_topic("mem", ConfigPatch(cap_records=1500)), 1500),
    "router": (lambda e: e.put_router("r", "mem", "copy"), 2000),
}


@pytest.mark.parametrize("use", USES)
def test_using_a_recovering_topic_first_applies_the_rest_of_it(tmp_path: Path, use: str) -> None:
    call, count = USES[use]
    written(tmp_path)
    engine, store, _ = reopen(tmp_path)
    assert engine.replaying is not None
    engine.replaying.step(max_bytes=4096)  # part-way
    assert 0 < engine.get_topic("mem").count < 2000
    call(engine)
    assert recovering(engine) == [] and engine.replaying is None
    assert engine.get_topic("mem").count == count
    if use == "router":
        assert engine.get_router("r").cursor == 2000  # it starts after every old record
    crash(store)
    engine, store, _ = reopen(tmp_path)
    assert engine.get_topic("mem").count in (0, count)  # the same recovery, later
    assert len(data(engine, "mem")) == count
    crash(store)


def test_an_append_during_recovery_never_reuses_a_recovered_seq(tmp_path: Path) -> None:
    written(tmp_path)
    engine, store, _ = reopen(tmp_path)
    assert engine.append("mem", [RecordIn.of("new")]).seqs == [2001]
    assert data(engine, "mem") == [*range(2000), "new"]
    crash(store)
    engine, store, _ = reopen(tmp_path)
    assert data(engine, "mem") == [*range(2000), "new"]  # and the order survives a restart
    crash(store)


def test_deletions_apply_in_order(tmp_path: Path) -> None:
    clock = ManualClock()
    engine, store, _ = reopen(tmp_path, clock=clock)
    engine.put_topic("mem", MEMORY)
    fill(engine, "mem", 300)
    store.seal(engine)  # some records in segments, deleted by WAL frames later
    fill(engine, "mem", 300, start=300)
    engine.delete("mem", before_seq=100)
    engine.delete("mem", match=TagMatch.parse("k1"))
    fill(engine, "mem", 300, start=600)  # k1 records after the delete stay
    engine.delete_seqs("mem", [601, 602, 850])
    clock.advance(5)
    fill(engine, "mem", 30, start=900)
    expected = pages(engine, "mem")
    state = engine.get_topic("mem")
    crash(store)
    engine, store, report = reopen(tmp_path, clock=clock)
    assert report.deferred_topics == 1
    assert engine.replaying is not None
    while engine.replaying is not None:
        engine.replaying.step(max_bytes=1024)
    assert pages(engine, "mem") == expected
    after = engine.get_topic("mem")
    assert (after.head_seq, after.earliest_seq, after.count, after.bytes) == (
        state.head_seq, state.earliest_seq, state.count, state.bytes)  # fmt: skip
    crash(store)


def test_a_recovering_topic_shows_its_latest_config_and_expires_nothing_early(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    engine, store, _ = reopen(tmp_path, clock=clock)
    engine.put_topic("mem", ConfigPatch(durability=Durability.MEMORY, ttl_ms=1000))
    fill(engine, "mem", 100)
    clock.advance(10)
    engine.put_topic("mem", ConfigPatch(ttl_ms=0, priority=5))  # kept for good after all
    crash(store)
    clock.advance(60_000)  # long past the first TTL
    engine, store, _ = reopen(tmp_path, clock=clock)
    assert engine.replaying is not None
    engine.replaying.step(max_bytes=1)  # some records applied, under the first TTL
    state = engine.get_topic("mem")  # looks, does not finish
    assert state.recovering and (state.config.ttl_ms, state.config.priority) == (0, 5)
    assert state.count == 10
    assert data(engine, "mem") == list(range(100))
    crash(store)


def test_dropping_or_recreating_a_recovering_topic(tmp_path: Path) -> None:
    engine, store, _ = reopen(tmp_path)
    engine.put_topic("mem", MEMORY)
    fill(engine, "mem", 200)
    engine.put_topic("mem", ConfigPatch(cap_records=150))  # a config frame in the backlog
    fill(engine, "mem", 50, start=200)
    crash(store)
    engine, store, _ = reopen(tmp_path)
    assert engine.replaying is not None
    engine.replaying.step(max_bytes=2048)
    engine.delete_topic("mem")
    assert engine.replaying is None or engine.replaying.step() is False
    assert engine.list_topics() == []  # nothing set aside brings it back
    assert engine.append("mem", [RecordIn.of("again")], config=MEMORY).seqs == [1]
    state = engine.get_topic("mem")
    assert state.epoch == 2 and state.config.cap_records == 0 and not state.recovering
    crash(store)
    engine, store, _ = reopen(tmp_path)
    assert data(engine, "mem") == ["again"] and engine.get_topic("mem").epoch == 2
    crash(store)


def test_drops_and_recreations_in_the_wal(tmp_path: Path) -> None:
    engine, store, _ = reopen(tmp_path)
    for name in ("gone", "mem"):
        engine.put_topic(name, MEMORY)
        fill(engine, name, 100)
    engine.delete_topic("gone")
    engine.delete_topic("mem")
    engine.put_topic("mem", MEMORY)
    fill(engine, "mem", 30, start=500)
    crash(store)
    engine, store, report = reopen(tmp_path)
    assert [t.name for t in engine.list_topics()] == ["mem"]
    assert (report.deferred_topics, report.deferred_frames) == (1, 3)
    assert engine.get_topic("mem").epoch == 3
    assert data(engine, "mem") == list(range(500, 530))
    crash(store)


def test_class_changes_in_the_wal(tmp_path: Path) -> None:
    """A topic that is no longer memory at the end of the WAL recovers whole at once; a
    disk topic turned memory defers only what came after."""
    engine, store, _ = reopen(tmp_path)
    engine.put_topic("was-mem", MEMORY)
    fill(engine, "was-mem", 100)
    engine.put_topic("was-mem", ConfigPatch(durability=Durability.DISK))
    fill(engine, "was-mem", 100, start=100)
    fill(engine, "now-mem", 100)
    engine.put_topic("now-mem", MEMORY)
    fill(engine, "now-mem", 100, start=100)
    crash(store)
    engine, store, report = reopen(tmp_path)
    assert report.deferred_topics == 1 and recovering(engine) == ["now-mem"]
    was = engine.get_topic("was-mem")
    assert was.count == 200 and was.config.durability is Durability.DISK
    assert engine.get_topic("now-mem").count == 100
    assert data(engine, "now-mem") == list(range(200))
    assert data(engine, "was-mem") == list(range(200))
    crash(store)


def test_a_router_endpoint_recovers_before_readiness(tmp_path: Path) -> None:
    """A router resumes from what its source and dest hold: neither may be part-way."""
    engine, store, _ = reopen(tmp_path)
    for name in ("src", "dst", "alone"):
        engine.put_topic(name, MEMORY)
        fill(engine, name, 100)
    engine.put_router("r", "src", "dst")
    crash(store)
    engine, store, report = reopen(tmp_path)
    assert report.deferred_topics == 1 and recovering(engine) == ["alone"]
    assert engine.get_topic("src").count == 100 and engine.get_topic("dst").count == 100
    crash(store)


def test_a_seal_during_recovery_loses_nothing_set_aside(tmp_path: Path) -> None:
    mem_pages = written(tmp_path)
    engine, store, _ = reopen(tmp_path)
    assert engine.replaying is not None
    engine.replaying.step(max_bytes=4096)
    engine.append("disk", [RecordIn.of("new")])
    store.seal(engine)  # trims the WAL files holding the rest: they apply first
    assert engine.replaying is None
    crash(store)
    engine, store, report = reopen(tmp_path)
    assert report.deferred_topics == 0 and report.segments >= 2
    assert pages(engine, "mem") == mem_pages
    assert data(engine, "disk")[-1] == "new"
    crash(store)


def test_queue_leases_and_publish_ledgers_of_memory_logs(tmp_path: Path) -> None:
    """A queue's leases log is memory by default: its claims are all back before any
    job is handed out again. A memory topic's publish ledger is whole before a publish."""
    from waymark.log.writers import PartKey
    from waymark.protocol import TopicType

    engine, store, _ = reopen(tmp_path)
    engine.put_topic("q", ConfigPatch(lease_ms=3_600_000), TopicType.QUEUE)
    engine.append("q", [RecordIn.of(i) for i in range(20)])
    claimed = engine.claim("q", "w", 5)
    held = [job.seq for job in claimed]
    engine.put_topic("out", MEMORY)
    epoch = engine.writers.open_writer("sink")
    part = PartKey(0, 0)
    engine.writers.stage("out", "sink", epoch, 1, part, [RecordIn.of("a"), RecordIn.of("b")])
    first = engine.writers.publish("out", "sink", epoch, 1, [(part, 1)])
    crash(store)
    engine, store, report = reopen(tmp_path)
    assert report.deferred_topics == 2  # q$leases and out
    assert engine.get_topic("q").queue == QueueCounts(
        15, 5, 0, earliest_lease_deadline=min(job.deadline for job in claimed)
    )
    assert not set(held) & {job.seq for job in engine.claim("q", "w2", 20)}
    again = engine.writers.publish("out", "sink", epoch, 1, [(part, 1)])
    assert (again.first_seq, again.replayed) == (first.first_seq, True)
    assert data(engine, "out") == ["a", "b"]
    crash(store)


def test_recovery_steps_one_topic_at_a_time_with_the_priority_it_recovers_to(
    tmp_path: Path,
) -> None:
    """The server schedules recovery per topic by priority (docs/topics.md): a step applies only its
    topic, and the topic ranks with the config it is recovering to."""
    engine, store, _ = reopen(tmp_path)
    for name in ("low", "high"):
        engine.put_topic(name, MEMORY)
        fill(engine, name, 200)
    engine.put_topic("high", ConfigPatch(priority=1000))  # set aside behind its records
    crash(store)
    engine, store, _ = reopen(tmp_path)
    assert engine.replaying is not None and engine.replaying.names() == ["low", "high"]
    now = engine.clock.now_ms()
    assert engine.delivery_priority("high", now, now) == 1000
    assert engine.delivery_priority("low", now, now) == 0
    steps = 0
    while engine.replaying.step_topic("high", max_bytes=1024):
        steps += 1
    assert steps > 3 and recovering(engine) == ["low"]
    assert engine.get_topic("low").count == 0  # untouched by high's steps
    assert not engine.replaying.step_topic("high")  # nothing left: a no-op
    assert data(engine, "high") == list(range(200)) and data(engine, "low") == list(range(200))
    assert engine.replaying is None
    crash(store)


# --- a real server ---------------------------------------------------------------------


def same_shard(name: str, shards: int = 2) -> str:
    """A topic name on ``name``'s WAL shard: an fsync ack there means the shard's earlier
    frames are on disk too."""
    for i in range(1000):
        other = f"sync-{i}"
        if zlib.crc32(other.encode()) % shards == zlib.crc32(name.encode()) % shards:
            return other
    raise AssertionError("no name on that shard")


def test_a_restarted_server_is_ready_before_its_memory_topic_recovers(
    tmp_path: Path, spawn_server
) -> None:
    records, batch = 300_000, 10_000
    server = spawn_server(tmp_path, "--seal-interval-s", "3600")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.put("/v0/topics/mem", json={"durability": "memory"}).status_code == 201
        for start in range(0, records, batch):
            body = {"records": [{"data": i} for i in range(start, start + batch)]}
            assert client.post("/v0/topics/mem/records", json=body).status_code == 200
        client.post("/v0/topics/disk/records", json={"records": [{"data": "d"}]})
        fence = same_shard("mem")
        client.put(f"/v0/topics/{fence}", json={"durability": "fsync"})
        client.post(f"/v0/topics/{fence}/records", json={"records": [{"data": 1}]})
    server.stop(signal.SIGKILL)

    started = time.monotonic()
    server = spawn_server(tmp_path, "--seal-interval-s", "3600")
    ready = time.monotonic() - started
    with httpx.Client(base_url=server.url, timeout=30) as client:
        state = client.get("/v0/topics/mem").json()  # looking does not finish it
        disk = client.get("/v0/topics/disk").json()
        metrics = client.get("/metrics").text
        assert state["recovering"] is True and state["count"] < records
        assert state["config"]["durability"] == "memory"
        assert disk["count"] == 1 and "recovering" not in disk
        assert "waymark_recovering_topics 1.0" in metrics
        # The background steps finish it without any request touching it.
        deadline = time.monotonic() + 15
        while client.get("/v0/topics/mem").json().get("recovering"):
            assert time.monotonic() < deadline, "memory recovery did not finish"
            time.sleep(0.05)
        recovered = time.monotonic() - started
        assert client.get("/v0/topics/mem").json()["count"] == records
        page = client.post("/v0/topics/mem/diff", json={"from_seq": 0, "limit": 10_000}).json()
        assert [r["data"] for r in page["records"]] == list(range(10_000))
        last = client.post("/v0/topics/mem/diff", json={"from_seq": records - 1}).json()
        assert [r["$seq"] for r in last["records"]] == [records]
        assert "waymark_recovering_frames 0.0" in client.get("/metrics").text
    assert ready < recovered
