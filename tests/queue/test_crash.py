"""SIGKILL a real ``waymark serve --data-dir`` holding a queue: jobs survive, acked jobs
stay gone, and in-flight jobs become claimable again (docs/semantics/topics.md §10.1, §10.6)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from .conftest import QueueHttp


def _restart(spawn_server: Callable, data_dir: Path, server) -> QueueHttp:  # type: ignore[no-untyped-def]
    server.stop(signal.SIGKILL)
    return QueueHttp(httpx.Client(base_url=spawn_server(data_dir).url, timeout=10))


def test_jobs_survive_and_in_flight_jobs_are_claimable_again(
    spawn_server: Callable, tmp_path: Path
) -> None:
    server = spawn_server(tmp_path)
    api = QueueHttp(httpx.Client(base_url=server.url, timeout=10))
    api.queue("work", durability="fsync")
    api.produce("work", *range(100))
    leased = api.claim("work", "w", 30, lease_ms=500)  # in flight when the server dies
    api.settle("work", "ack", "w", [j["$seq"] for j in leased[:10]])  # fsync: durable now
    api = _restart(spawn_server, tmp_path, server)
    assert api.state("work")["count"] == 90
    time.sleep(0.6)  # whether or not their lease events survived, the leases are over
    jobs = api.claim("work", "after", 1000)
    seqs = [j["$seq"] for j in jobs]
    assert sorted(seqs) == list(range(11, 101))  # nothing lost, nothing acked comes back
    reclaimed = {j["$seq"]: j["delivery"] for j in jobs if j["$seq"] <= 30}
    assert set(reclaimed) == set(range(11, 31))
    assert set(reclaimed.values()) <= {1, 2}  # 2 if the claimed events survived, else 1


def test_durable_leases_keep_holding_across_a_crash(spawn_server: Callable, tmp_path: Path
                                                    ) -> None:  # fmt: skip
    server = spawn_server(tmp_path)
    api = QueueHttp(httpx.Client(base_url=server.url, timeout=10))
    api.queue("work", durability="fsync", leases_durable=True)
    api.produce("work", *range(10))
    held = api.claim("work", "w", 4, lease_ms=60_000)
    time.sleep(0.3)  # the claimed events' group sync
    api = _restart(spawn_server, tmp_path, server)
    assert api.state("work")["queue"]["in_flight"] == 4
    assert [j["$seq"] for j in api.claim("work", "other", 100)] == list(range(5, 11))
    acked = api.settle("work", "ack", "w", [j["$seq"] for j in held],
                       lease_ids=[j["lease_id"] for j in held])  # fmt: skip
    assert acked["acked"] == [1, 2, 3, 4]
