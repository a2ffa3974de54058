"""The shipper in-process against real server and collector processes: backoff with an
injected sleep (no real waiting), the frozen checkpoint, tombstones, /metrics."""

from __future__ import annotations

import asyncio
import random
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from tests.conftest import readable

from waymark.checkpoint import CheckpointStore
from waymark.checkpoint.shipper import RetriesExhausted, ShipConfig, Shipper
from waymark.checkpoint.verdict import Verdict, verdict
from waymark.clock import Backoff, ManualClock

from .collector_harness import (
    CollectorProcess,
    append,
    committed,
    start_collector,
    start_ship,
    status,
    wait_until,
)
from .stalled_save import StallingStore


@pytest.fixture
def server(waymark_server: Any) -> str:
    return waymark_server.url


@pytest.fixture
def topic() -> str:
    return f"ship-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def collectors() -> Iterator[list[CollectorProcess]]:
    started: list[CollectorProcess] = []
    yield started
    for collector in started:
        collector.process.kill()
        collector.process.wait()


@pytest.mark.parametrize(
    ("status", "expected"),
    [(200, Verdict.ACK), (204, Verdict.ACK), (408, Verdict.TRANSIENT), (429, Verdict.TRANSIENT),
     (500, Verdict.TRANSIENT), (503, Verdict.TRANSIENT), (302, Verdict.TRANSIENT),
     (400, Verdict.REJECT), (413, Verdict.REJECT), (404, Verdict.REJECT)],
)  # fmt: skip
def test_verdict(status: int, expected: Verdict) -> None:
    assert verdict(status) is expected


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    backoff, rng = Backoff(0.1, 2.0), random.Random(7)
    assert [backoff.ceiling(a) for a in range(1, 8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert backoff.ceiling(10_000) == 2.0
    for attempt in range(1, 12):
        delays = {backoff.delay(attempt, rng) for _ in range(50)}
        ceiling = backoff.ceiling(attempt)
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1, "no jitter"
    with pytest.raises(ValueError):
        Backoff(1.0, 0.5)


async def test_transient_failures_back_off_and_freeze_the_checkpoint(
    server: str, topic: str, tmp_path: Path, collectors: list[CollectorProcess]
) -> None:
    seqs = append(server, topic, [{"data": i} for i in range(10)], create=True)
    sink = start_collector(tmp_path, "--fail-first", "9")
    collectors.append(sink)
    config = ShipConfig(server, topic, sink.url, tmp_path / "state", in_flight=1,
                        batch_records=5, once=True, backoff=Backoff(1.0, 8.0))  # fmt: skip
    slept: list[float] = []
    committed_while_failing: list[object] = []

    async def sleep(delay: float) -> None:
        # Nominal delays add up to about a minute; this test waits none of it.
        slept.append(delay)
        committed_while_failing.append(shipper.tracker.committed(topic))
        await asyncio.sleep(0)

    shipper = Shipper(config, sleep=sleep, rng=random.Random(3))
    stats = await asyncio.wait_for(shipper.run(), 20)

    # The first batch failed 9 times in a row: the checkpoint stayed frozen throughout,
    # and each retry waited between half and all of min(8 s, 1 s * 2**(n-1)).
    assert len(slept) == 9 and committed_while_failing == [None] * 9
    ceilings = [1, 2, 4, 8, 8, 8, 8, 8, 8]
    assert all(c / 2 <= d <= c for d, c in zip(slept, ceilings, strict=True)), slept
    assert stats.retries == 9 and stats.records_acked == 10
    assert sink.received() == set(seqs) and committed(config.state_dir, topic) == seqs[-1]


def clocked_sleep(clock: ManualClock) -> Any:
    """An injected sleep that moves the shipper's clock instead of waiting."""

    async def sleep(delay: float) -> None:
        clock.advance(round(delay * 1000))
        await asyncio.sleep(0)

    return sleep


async def test_a_collector_failing_past_the_retry_budget_stops_the_shipper(
    server: str, topic: str, tmp_path: Path, collectors: list[CollectorProcess]
) -> None:
    append(server, topic, [{"data": i} for i in range(10)], create=True)
    sink = start_collector(tmp_path, "--fail-first", "1000")
    collectors.append(sink)
    config = ShipConfig(server, topic, sink.url, tmp_path / "state", in_flight=2,
                        batch_records=5, once=True, backoff=Backoff(1.0, 8.0),
                        retry_budget_s=30.0)  # fmt: skip
    clock = ManualClock()
    shipper = Shipper(config, sleep=clocked_sleep(clock), rng=random.Random(3), clock=clock)
    with pytest.raises(RetriesExhausted, match="retry budget 30 s spent"):
        await asyncio.wait_for(shipper.run(), 20)
    # Given up, not skipped: no batch was acked, the checkpoint never moved.
    assert shipper.stats.records_acked == 0 and shipper.stats.batches_abandoned == 2
    assert committed(config.state_dir, topic) == 0


async def test_a_dead_waymark_server_past_the_retry_budget_stops_the_shipper(
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    config = ShipConfig(dead, "t", "http://127.0.0.1:9/", tmp_path / "state", once=True,
                        backoff=Backoff(1.0, 8.0), retry_budget_s=30.0)  # fmt: skip
    clock = ManualClock()
    shipper = Shipper(config, sleep=clocked_sleep(clock), rng=random.Random(3), clock=clock)
    with pytest.raises(RetriesExhausted, match=f"waymark API at {dead}"):
        await asyncio.wait_for(shipper.run(), 20)
    assert 30_000 <= clock.now_ms() - ManualClock().now_ms() < 30_000 + 8_000


def test_tombstones_are_counted_recorded_and_exported(
    server: str, topic: str, tmp_path: Path, collectors: list[CollectorProcess]
) -> None:
    # A capped topic evicts its oldest records before the shipper ever reads them.
    seqs = append(server, topic, [{"data": i} for i in range(300)], create=True,
                  config={"cap_records": 100})  # fmt: skip
    sink = start_collector(tmp_path)
    collectors.append(sink)
    state = tmp_path / "state"
    shipper = start_ship(server, topic, sink, state, "--metrics-port", "0", "--wait-ms", "200")
    assert shipper.stdout is not None
    ready = readable(shipper.stdout, 15)
    assert ready
    line = shipper.stdout.readline()
    metrics_url = line[line.index("http://") :].split()[0]
    wait_until(lambda: committed(state, topic) == seqs[-1], 15, "the checkpoint to reach the head")

    assert sink.received() == set(seqs[200:])
    [gap] = [orjson.loads(g) for g in (state / "gaps.jsonl").read_bytes().splitlines()]
    assert (gap["gap_from"], gap["gap_to"], gap["reason"]) == (1, seqs[199], "cap")
    assert gap["missed_estimate"] == 200
    metrics = httpx.get(metrics_url).text
    assert f'waymark_ship_tombstones_total{{topic="{topic}"}} 1.0' in metrics
    assert f'waymark_ship_gap_records_total{{topic="{topic}"}} 200.0' in metrics
    assert f'waymark_ship_records_acked_total{{topic="{topic}"}} 100.0' in metrics

    shipper.send_signal(signal.SIGTERM)
    out, _ = shipper.communicate(timeout=5)
    assert shipper.returncode == 0, out
    assert status(state)["tombstones"] == 1 and status(state)["gap_records"] == 200


def test_a_topic_recreated_while_the_shipper_was_down_is_never_skipped_silently(
    server: str, topic: str, tmp_path: Path, collectors: list[CollectorProcess]
) -> None:
    sink = start_collector(tmp_path)
    collectors.append(sink)
    state = tmp_path / "state"
    append(server, topic, [{"data": i} for i in range(5)], create=True)
    first = start_ship(server, topic, sink, state, "--once")
    assert first.wait(30) == 0
    assert committed(state, topic) == 5
    shipped_before = len(sink.acked())
    # Meanwhile the topic is deleted and recreated, and its head passes the old cursor.
    assert httpx.delete(f"{server}/v0/topics/{topic}").status_code == 200
    new = append(server, topic, [{"data": f"new-{i}"} for i in range(8)], create=True)
    second = start_ship(server, topic, sink, state, "--once")
    out, _ = second.communicate(timeout=30)
    assert second.returncode == 0, out
    # The restart presented the old epoch with its cursor: the recreate is a tombstone,
    # and the new instance is shipped from its start, not from seq 6.
    [gap] = [orjson.loads(g) for g in (state / "gaps.jsonl").read_bytes().splitlines()]
    assert gap["reason"] == "recreated"
    after = {seq for batch in sink.acked()[shipped_before:] for seq in batch}
    assert sorted(after) == new == list(range(1, 9))


async def test_the_saver_saves_again_when_the_run_ends_during_a_save(tmp_path: Path) -> None:
    """The exact race behind a ``--once`` that exited with a stale checkpoint: the saver
    snapshots, its save stalls in the disk, the last batch commits and the run finishes
    meanwhile. The saver must not take that earlier save for the final one."""
    config = ShipConfig("http://unused", "t", "http://unused", tmp_path, save_interval_s=0.001)
    shipper = Shipper(config)
    store = shipper.store = StallingStore(shipper.store.path, threading.Event())
    sending = shipper.tracker.create_batch("t", [1, 10]).begin_send()
    saver = asyncio.create_task(shipper._save_loop())  # noqa: SLF001 - the saver alone
    assert await asyncio.to_thread(store.entered.wait, 10)
    assert store.stalled == {}  # the held save predates the ack
    sending.ack()
    await shipper.tracker.drain()
    # What run() does once drained; the held save cannot return before this.
    shipper._finished.set()  # noqa: SLF001
    store.release.set()
    await asyncio.wait_for(saver, 10)
    assert CheckpointStore(store.path).load()["t"].checkpoint == [1, 10]
    assert shipper.stats.committed_seq == 10
