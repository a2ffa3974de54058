"""Every tombstone reason the server can send decodes through the shipped client, sync
and async, on diff and on watch; so does a reason this client has never heard of.

The gaps are real: ``lost`` comes from a ``waymark serve`` killed with SIGKILL and
restarted, ``source_trim`` from a router whose source evicted unforwarded records,
``ttl`` and ``mixed`` from a real HTTP server whose clock the test moves.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
import uvicorn

from waymark.client import (
    AsyncClient,
    Client,
    RecordEvent,
    TombstoneEvent,
    TombstoneReason,
    WatchEvent,
)
from waymark.clock import ManualClock
from waymark.server import App
from waymark.server.serving import listen

FUTURE = "a_reason_from_a_newer_server"
IDLE = ("lost-idle-sync", "lost-idle-async")  # lost gaps with no record after them yet


@dataclass(frozen=True)
class Gap:
    """A topic whose read from ``from_seq`` (in ``epoch``) meets a ``reason`` tombstone
    over ``[gap_from, gap_to]``, then the record ``after``."""

    url: str
    topic: str
    from_seq: int
    epoch: int
    reason: str
    gap_from: int
    gap_to: int
    after: int
    future: bool = False  # read through the FutureServer fault injector

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, transport=self._transport())

    def client(self) -> Client:
        return Client(self.url, http=self.http())

    def async_client(self) -> AsyncClient:
        http = httpx.AsyncClient(base_url=self.url, transport=self._transport())
        return AsyncClient(self.url, http=http)

    def _transport(self) -> Any:
        return FutureServer(self.url) if self.future else None


class FutureServer(httpx.MockTransport):
    """Fault injector: the real server's answers, with each ``cap`` tombstone's reason
    renamed to one no waymark release sends yet (what a newer server could send). A watch
    stream is cut after its first event."""

    def __init__(self, url: str) -> None:
        self._upstream = httpx.Client(base_url=url, timeout=10)
        super().__init__(self._forward)

    def _forward(self, request: httpx.Request) -> httpx.Response:
        forwarded = ("accept", "last-event-id", "content-type")
        headers = {k: v for k, v in request.headers.items() if k in forwarded}
        path = request.url.raw_path.decode()
        with self._upstream.stream(
            request.method, path, content=request.content, headers=headers
        ) as upstream:
            if upstream.headers["content-type"] == "text/event-stream":
                lines = []
                for line in upstream.iter_lines():
                    lines.append(line)
                    if not line and any(seen.startswith("event:") for seen in lines):
                        break
                body = "\n".join(lines).encode() + b"\n"
            else:
                body = upstream.read()
        body = body.replace(b'"reason":"cap"', f'"reason":"{FUTURE}"'.encode())
        return httpx.Response(upstream.status_code, headers=upstream.headers, content=body)


class ClockedServer:
    """The app on uvicorn in a thread: a real HTTP server whose time moves only when
    the test says (``clock.advance``), for TTL tombstones without waiting."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.app = App(clock=self.clock)
        sock = listen("127.0.0.1", 0)  # listening now: requests queue until uvicorn runs
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, lifespan="on", log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=asyncio.run, args=(self.server.serve([sock]),), daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Router forwarding runs after the source's ack: wait (bounded) for it."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


def ok(response: httpx.Response) -> Any:
    assert response.status_code in (200, 201), response.text
    return response.json()


def append(http: httpx.Client, topic: str, *data: Any, **body: Any) -> list[int]:
    records = [{"data": d} for d in data]
    return ok(http.post(f"/v0/topics/{topic}/records", json={"records": records, **body}))["seqs"]


def state(http: httpx.Client, topic: str) -> dict[str, Any]:
    return ok(http.get(f"/v0/topics/{topic}", params={"touch": "false"}))


def epoch(http: httpx.Client, topic: str) -> int:
    return state(http, topic)["epoch"]


def crash_gaps(url_before: Callable[[], str], kill_and_restart: Callable[[], str]) -> list[Gap]:
    """``lost`` (a SIGKILL), ``cap``, ``recreated`` and ``source_trim`` on one server."""
    with httpx.Client(base_url=url_before(), timeout=10) as http:
        # The first append to a disk topic syncs a seq ceiling 4096 above it; the crash
        # leaves those seqs unaccounted for, so they read as a `lost` gap.
        for topic in ("lost", *IDLE):
            ok(http.put(f"/v0/topics/{topic}", json={"durability": "disk"}))
            assert append(http, topic, 1, 2, 3) == [1, 2, 3]
    url = kill_and_restart()
    gaps = []
    with httpx.Client(base_url=url, timeout=10) as http:
        [after] = append(http, "lost", 4)
        gaps.append(Gap(url, "lost", 3, epoch(http, "lost"), "lost", 4, after - 1, after))
        # Nothing after the gap yet: a watch's last event is the tombstone.
        for topic in IDLE:
            gaps.append(Gap(url, topic, 0, epoch(http, topic), "lost", 4, after - 1, after))

        append(http, "cap", 1, 2, 3, 4, config={"cap_records": 2})
        gaps.append(Gap(url, "cap", 0, epoch(http, "cap"), "cap", 1, 2, 3))

        append(http, "recreated", 1, 2, 3)
        old = epoch(http, "recreated")
        ok(http.delete("/v0/topics/recreated"))
        append(http, "recreated", "new")
        gaps.append(Gap(url, "recreated", 3, old, "recreated", 1, 1, 1))

        # The dest refuses while full, so the source (cap 3) evicts 3 and 4 unforwarded.
        ok(http.put("/v0/topics/src", json={"cap_records": 3}))
        ok(http.put("/v0/topics/dst", json={"cap_records": 2, "discard": "reject"}))
        ok(http.put("/v0/routers/r", json={"source": "src", "dest": "dst"}))
        append(http, "src", 1, 2)
        wait_for(lambda: state(http, "dst")["count"] == 2, "the first copies")
        append(http, "src", 3, 4, 5, 6, 7)
        # The router passes the trimmed 3 and 4 at once (dest seqs 3..4), full or not.
        wait_for(lambda: state(http, "dst")["head_seq"] >= 4, "the trim")
        # Room again; the deletion takes seq 5 for itself (docs/semantics/topics.md §7.1),
        # which a reader passes silently on its way to the copy of 5 at seq 6.
        ok(http.post("/v0/topics/dst/delete", json={"before_seq": 3}))
        wait_for(lambda: state(http, "dst")["head_seq"] >= 7, "the copies")
        gaps.append(Gap(url, "dst", 2, epoch(http, "dst"), "source_trim", 3, 4, 6))
    return gaps


def clocked_gaps(server: ClockedServer) -> list[Gap]:
    """``ttl`` and ``mixed``, with time moved by the test."""
    url, clock = server.url, server.clock
    with httpx.Client(base_url=url, timeout=10) as http:
        # Long enough that the mixed topic's clock moves below leave "new" alive.
        ok(http.put("/v0/topics/ttl", json={"ttl_ms": 100_000}))
        append(http, "ttl", "old")
        clock.advance(100_001)
        append(http, "ttl", "new")
        ok(http.put("/v0/topics/mixed", json={"ttl_ms": 1000, "cap_records": 2}))
        append(http, "mixed", 0)
        append(http, "mixed", 1)
        append(http, "mixed", 2)  # seq 1 falls to the cap
        clock.advance(600)
        append(http, "mixed", 3)  # seq 2 falls to the cap
        clock.advance(401)  # seq 3 expires; seq 4 lives
        return [
            Gap(url, "ttl", 0, epoch(http, "ttl"), "ttl", 1, 1, 2),
            Gap(url, "mixed", 0, epoch(http, "mixed"), "mixed", 1, 3, 4),
        ]


@pytest.fixture(scope="module")
def gaps(spawn_module_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    data = tmp_path_factory.mktemp("crashed")
    # No idle trim of the seq ceilings before the SIGKILL (docs/durability.md): the lead
    # the first appends raised is the `lost` gap, however long the kill takes to come.
    servers = [spawn_module_server(data, "--ceiling-trim-s", "3600")]

    def kill_and_restart() -> str:
        assert servers[-1].stop(signal.SIGKILL) == -signal.SIGKILL
        servers.append(spawn_module_server(data))
        return servers[-1].url

    found = crash_gaps(lambda: servers[0].url, kill_and_restart)
    clocked = ClockedServer()
    try:
        found += clocked_gaps(clocked)
        # By reason; the idle lost gaps by topic.
        by_key = {(gap.topic if gap.topic in IDLE else gap.reason): gap for gap in found}
        by_key[FUTURE] = replace(by_key["cap"], reason=FUTURE, future=True)
        yield by_key
    finally:
        clocked.stop()


REASONS = [*TombstoneReason, FUTURE]


def test_the_known_reasons_are_what_the_server_sends() -> None:
    assert {str(r) for r in TombstoneReason} == {
        "cap", "ttl", "mixed", "recreated", "lost", "source_trim"}  # fmt: skip
    assert TombstoneReason.LOST == "lost" and FUTURE not in set(TombstoneReason)


def check_tombstone(gap: Gap, tomb: Any) -> None:
    assert tomb is not None
    assert (tomb.type, tomb.reason, tomb.gap_from, tomb.gap_to) == (
        "tombstone", gap.reason, gap.gap_from, gap.gap_to)  # fmt: skip


def check_watch(gap: Gap, events: list[WatchEvent]) -> None:
    tomb = events[0]
    assert isinstance(tomb, TombstoneEvent)
    check_tombstone(gap, tomb.tombstone)
    if not gap.future:  # the injector cuts the stream after the tombstone
        assert isinstance(events[1], RecordEvent) and events[1].record.seq == gap.after


@pytest.mark.parametrize("reason", REASONS)
def test_diff_decodes_every_reason(gaps: dict[str, Gap], reason: str) -> None:
    gap = gaps[reason]
    with gap.client() as client:
        page = client.diff(gap.topic, gap.from_seq, epoch=gap.epoch)
    check_tombstone(gap, page.tombstone)
    if not gap.future:
        assert page.records[0].seq == gap.after


@pytest.mark.parametrize("reason", REASONS)
async def test_async_diff_decodes_every_reason(gaps: dict[str, Gap], reason: str) -> None:
    gap = gaps[reason]
    async with gap.async_client() as client:
        page = await client.diff(gap.topic, gap.from_seq, epoch=gap.epoch)
    check_tombstone(gap, page.tombstone)
    if not gap.future:
        assert page.records[0].seq == gap.after


@pytest.mark.parametrize("reason", REASONS)
def test_watch_decodes_every_reason(gaps: dict[str, Gap], reason: str) -> None:
    gap = gaps[reason]
    with gap.client() as client:
        events = client.watch(gap.topic, from_seq=gap.from_seq, epoch=gap.epoch, read_timeout=5)
        taken = [next(events) for _ in range(1 if gap.future else 2)]
        events.close()
    check_watch(gap, taken)


@pytest.mark.parametrize("reason", REASONS)
async def test_async_watch_decodes_every_reason(gaps: dict[str, Gap], reason: str) -> None:
    gap = gaps[reason]
    async with gap.async_client() as client:
        events = client.watch(gap.topic, from_seq=gap.from_seq, epoch=gap.epoch, read_timeout=5)
        taken = [await anext(events) for _ in range(1 if gap.future else 2)]
        await events.aclose()
    check_watch(gap, taken)


@pytest.mark.parametrize("reason", REASONS)
def test_the_raw_diff_spark_reads_with_decodes_every_reason(
    gaps: dict[str, Gap], reason: str
) -> None:
    # The Spark source's path: waymark.spark.connect() is this client, its pages raw.
    gap = gaps[reason]
    with gap.client() as client:
        page = client.diff_raw(gap.topic, gap.from_seq, limit=100, epoch=gap.epoch)
    assert page.tombstone is not None
    assert (page.tombstone.reason, page.tombstone.gap_from, page.tombstone.gap_to) == (
        gap.reason, gap.gap_from, gap.gap_to)  # fmt: skip


def check_resumed_after_the_gap(gap: Gap, before: list[WatchEvent], after: WatchEvent,
                                new: int) -> None:  # fmt: skip
    *records, tomb = before
    assert [r.record.seq for r in records if isinstance(r, RecordEvent)] == [1, 2, 3]
    assert isinstance(tomb, TombstoneEvent) and tomb.tombstone.reason == "lost"
    # The reconnect resumed after the gap: no record replayed, the gap not reported again.
    assert isinstance(after, RecordEvent) and after.record.seq == new, after
    assert tomb.cursor == f"{gap.epoch}:{tomb.tombstone.gap_to}"  # right after the gap


def test_watch_reconnects_after_a_mid_topic_gap_without_replaying(gaps, proxy_to) -> None:
    gap = gaps[IDLE[0]]
    proxy = proxy_to(gap.url)
    with Client(proxy.url) as client, httpx.Client(base_url=gap.url) as direct:
        events = client.watch(gap.topic, read_timeout=5)
        before = [next(events) for _ in range(4)]  # the tombstone is the last event sent
        proxy.cut()  # the network drops the stream
        [new] = append(direct, gap.topic, "after the gap")
        after = next(events)
        events.close()
    check_resumed_after_the_gap(gap, before, after, new)
    assert proxy.connections == 2


async def test_async_watch_reconnects_after_a_mid_topic_gap_without_replaying(
    gaps, proxy_to
) -> None:
    gap = gaps[IDLE[1]]
    proxy = proxy_to(gap.url)
    async with AsyncClient(proxy.url) as client:
        events = client.watch(gap.topic, read_timeout=5)
        before = [await anext(events) for _ in range(4)]
        proxy.cut()
        with httpx.Client(base_url=gap.url) as direct:
            [new] = append(direct, gap.topic, "after the gap")
        after = await anext(events)
        await events.aclose()
    check_resumed_after_the_gap(gap, before, after, new)
    assert proxy.connections == 2
