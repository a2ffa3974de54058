"""Prometheus metrics for ``GET /metrics``.

The request path only bumps plain integers (a dict increment and a bisect per
request); prometheus-client turns them into the exposition format when scraped,
through a custom collector. That keeps its per-sample locks off the hot path.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

# Seconds; an append on this machine is ~50-100 µs end to end, a long-poll up to a minute.
BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
FIRST_BUCKET = BUCKETS[0]
CONTENT_TYPE = CONTENT_TYPE_LATEST.encode()


class _Latency:
    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last slot is +Inf
        self.total = 0.0


class Metrics(Collector):
    def __init__(
        self,
        topic_count: Callable[[], int],
        replay_backlog: Callable[[], tuple[int, int]],
        dead_letters: Callable[[], tuple[int, int]],
    ) -> None:
        self._topic_count = topic_count
        self._replay_backlog = replay_backlog  # (topics, frames) gradual replay has left
        self._dead_letters = dead_letters  # (jobs parked now, dead-letter moves refused)
        self.requests: dict[tuple[str, int], int] = {}
        self.latency: dict[str, _Latency] = {}
        self.records_appended = 0
        self.records_read = 0
        self.watchers = 0
        self.long_polls = 0  # diffs waiting for a commit (wait_ms)
        self.seals = 0
        self.seal_failures = 0  # seals that failed (a full disk, say) and were retried
        self.jobs_claimed = 0  # queues (docs/semantics/topics.md §10)
        self.jobs_acked = 0
        self.jobs_released = 0
        self.jobs_redriven = 0
        # docs/security.md: refusals of auth and of the limits, by error code
        self.refusals: dict[str, int] = {}
        self.connections = 0  # open HTTP connections under the connection limit
        self.idle_closed = 0  # kept-alive connections closed for idleness
        # Metrics other parts of the server collect themselves (fold and recovery reports).
        self.collectors: list[Callable[[], Iterable[Metric]]] = []
        # WAL shards whose writer thread failed (docs/durability.md, "A failed WAL
        # writer"); none without a data directory.
        self.wal_writer_failures: Callable[[], int] = lambda: 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def observe(self, route: str, status: int, seconds: float) -> None:
        key = (route, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        latency = self.latency.get(route)
        if latency is None:
            latency = self.latency[route] = _Latency()
        # Most requests end inside the first bucket: they skip the bisect.
        latency.counts[0 if seconds <= FIRST_BUCKET else bisect_left(BUCKETS, seconds)] += 1
        latency.total += seconds

    def refused(self, code: str) -> None:
        self.refusals[code] = self.refusals.get(code, 0) + 1

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "waymark_http_requests", "HTTP requests by route and status", labels=["route", "status"]
        )
        for (route, status), n in sorted(self.requests.items()):
            requests.add_metric([route, str(status)], n)
        yield requests

        latency = HistogramMetricFamily(
            "waymark_http_request_duration_seconds",
            "Time from request to response head (SSE: to stream start)",
            labels=["route"],
        )
        for route, hist in sorted(self.latency.items()):
            cumulative, buckets = 0, []
            for bound, n in zip((*map(str, BUCKETS), "+Inf"), hist.counts, strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            latency.add_metric([route], buckets, hist.total)
        yield latency

        yield CounterMetricFamily(
            "waymark_records_appended", "Records committed by appends", value=self.records_appended
        )
        yield CounterMetricFamily(
            "waymark_seals",
            "Seals completed (tail sealed, WAL trimmed)",
            value=self.seals,
        )
        yield CounterMetricFamily(
            "waymark_seal_failures",
            "Seals that failed (the next interval tries again; the WAL keeps everything)",
            value=self.seal_failures,
        )
        yield CounterMetricFamily(
            "waymark_wal_writer_failures",
            "WAL shards whose writer thread failed: each refuses writes until a restart",
            value=self.wal_writer_failures(),
        )
        yield CounterMetricFamily(
            "waymark_records_read", "Records delivered by diff and SSE", value=self.records_read
        )
        for what, value in (
            ("claimed", self.jobs_claimed),
            ("acked", self.jobs_acked),
            ("released", self.jobs_released),
            ("redriven", self.jobs_redriven),
        ):
            yield CounterMetricFamily(
                f"waymark_queue_jobs_{what}", f"Queue jobs {what}", value=value
            )  # fmt: skip
        parked, refused = self._dead_letters()
        yield CounterMetricFamily(
            "waymark_queue_dead_letter_refused",
            "Claim passes whose dead-letter move the dead-letter topic refused",
            value=refused,
        )
        yield GaugeMetricFamily(
            "waymark_queue_jobs_parked",
            "Dead jobs waiting for their dead-letter topic to accept them", value=parked,
        )  # fmt: skip
        yield GaugeMetricFamily("waymark_topics", "Topics that exist", value=self._topic_count())
        # Gradual replay's backlog under the names /metrics has always given it: a public
        # contract (docs/durability.md, memory topics), like the topics' "recovering".
        topics, frames = self._replay_backlog()
        yield GaugeMetricFamily(
            "waymark_recovering_topics",
            "memory topics still recovering after a restart",
            value=topics,
        )
        yield GaugeMetricFamily(
            "waymark_recovering_frames",
            "WAL frames of recovering memory topics not applied yet",
            value=frames,
        )
        yield GaugeMetricFamily(
            "waymark_sse_streams", "Open SSE watch streams", value=self.watchers
        )
        refusals = CounterMetricFamily(
            "waymark_refusals",
            "Requests and connections refused by auth or a limit, by error code",
            labels=["code"],
        )
        for code, n in sorted(self.refusals.items()):
            refusals.add_metric([code], n)
        yield refusals
        yield GaugeMetricFamily(
            "waymark_connections", "Open HTTP connections", value=self.connections
        )
        yield CounterMetricFamily(
            "waymark_idle_closed",
            "Kept-alive connections closed for idleness",
            value=self.idle_closed,
        )
        yield GaugeMetricFamily(
            "waymark_long_polls",
            "diff requests waiting for a commit (wait_ms)",
            value=self.long_polls,
        )
        for collector in self.collectors:
            yield from collector()
