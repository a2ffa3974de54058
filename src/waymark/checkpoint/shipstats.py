"""What a shipper has done so far: counters, the status file, the gaps list, /metrics."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson


@dataclass
class ShipStats:
    """Counters of one shipper run; read by the live display, the status file and /metrics."""

    topic: str
    records_read: int = 0
    batches_sent: int = 0
    batches_acked: int = 0
    records_acked: int = 0
    batches_rejected: int = 0
    records_dead_lettered: int = 0
    retries: int = 0
    batches_abandoned: int = 0
    in_flight: int = 0
    tombstones: int = 0
    gap_records: int = 0
    read_seq: int = 0
    committed_seq: int = 0
    head_seq: int = 0
    checkpoint_saves: int = 0
    status_counts: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def count_status(self, status: int | str) -> None:
        key = str(status)
        self.status_counts[key] = self.status_counts.get(key, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        elapsed = time.monotonic() - out.pop("started")
        out["elapsed_s"] = round(elapsed, 3)
        out["records_per_s"] = round(self.records_acked / elapsed, 1) if elapsed > 0 else 0.0
        return out


def write_status(path: Path, stats: ShipStats, state: str) -> None:
    """Replace the status file atomically; no fsync: it is a view, not a commitment."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps({"state": state, **stats.as_dict()}, option=orjson.OPT_INDENT_2))
    os.replace(tmp, path)


def append_gap(path: Path, gap: dict[str, Any]) -> None:
    """One JSON line per tombstone met. A restart may read the same tombstone again
    before its checkpoint was saved, so a gap can be listed twice, never missed."""
    with path.open("ab") as file:
        file.write(orjson.dumps(gap) + b"\n")


class StatsCollector:
    """A prometheus-client collector that reads the counters at scrape time."""

    _COUNTERS = (
        ("records_read", "records read from the topic"),
        ("batches_sent", "POST attempts to the collector"),
        ("batches_acked", "batches acknowledged with 2xx"),
        ("records_acked", "records in acknowledged batches"),
        ("batches_rejected", "batches permanently rejected (dead-lettered)"),
        ("records_dead_lettered", "records written to the dead-letter topic"),
        ("retries", "transient failures retried"),
        ("batches_abandoned", "batches given up at shutdown, to be re-read on restart"),
        ("tombstones", "tombstones met while reading"),
        ("gap_records", "estimated records lost to eviction before they were read"),
    )
    _GAUGES = (
        ("in_flight", "batches being posted now"),
        ("read_seq", "the read cursor"),
        ("committed_seq", "the committed checkpoint (last shipped $seq)"),
        ("head_seq", "the topic head last seen"),
    )

    def __init__(self, stats: ShipStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["topic"]
        for name, doc in self._COUNTERS:
            family = CounterMetricFamily(f"waymark_ship_{name}", doc, labels=labels)
            family.add_metric([self.stats.topic], getattr(self.stats, name))
            yield family
        for name, doc in self._GAUGES:
            gauge = GaugeMetricFamily(f"waymark_ship_{name}", doc, labels=labels)
            gauge.add_metric([self.stats.topic], getattr(self.stats, name))
            yield gauge


def serve_metrics(stats: ShipStats, port: int, host: str = "127.0.0.1") -> int:
    """Serve /metrics on a daemon thread; returns the bound port (0 picks one)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(StatsCollector(stats))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_address[1])
