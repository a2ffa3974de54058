"""``waymark ship`` end to end: a real server, a real faulty collector, real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from .collector_harness import (
    CollectorProcess,
    append,
    committed,
    read_all,
    start_collector,
    start_ship,
    status,
    wait_until,
)

STALLED_SAVE = (sys.executable, str(Path(__file__).with_name("stalled_save.py")))


@pytest.fixture
def collectors(tmp_path: Path) -> Iterator[list[CollectorProcess]]:
    started: list[CollectorProcess] = []
    yield started
    for collector in started:
        collector.process.kill()
        collector.process.wait()


@pytest.fixture
def server(waymark_server: Any) -> str:
    return waymark_server.url


@pytest.fixture
def topic() -> str:
    return f"ship-{uuid.uuid4().hex[:10]}"


def collector(collectors: list[CollectorProcess], tmp: Path, *args: str) -> CollectorProcess:
    started = start_collector(tmp, *args)
    collectors.append(started)
    return started


def finish(process: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def fill(server: str, topic: str, count: int, poison: set[int] = frozenset()) -> list[int]:
    """Append ``count`` records, those whose index is in ``poison`` tagged for a 413."""
    records = [
        {"data": {"i": i}, **({"tag": "poison"} if i in poison else {})} for i in range(count)
    ]
    return append(server, topic, records, create=True)


def dead_lettered(server: str, topic: str) -> dict[int, dict[str, Any]]:
    records = read_all(server, f"{topic}.dead-letter")
    return {r["data"]["record"]["$seq"]: r["data"] for r in records}


def test_once_delivers_everything_through_faults_and_dead_letters_rejects(
    server: str, topic: str, tmp_path: Path, collectors: list[CollectorProcess]
) -> None:
    seqs = fill(server, topic, 3000, poison={137, 2203})
    sink = collector(collectors, tmp_path, "--jitter-ms", "25", "--fail-rate", "0.15",
                     "--drop-rate", "0.05", "--reject-tag", "poison")  # fmt: skip
    state = tmp_path / "state"
    code, out = finish(
        start_ship(server, topic, sink, state, "--once", "--in-flight", "8",
                   "--batch-records", "50"),
        timeout=30,
    )  # fmt: skip
    assert code == 0, out

    received, dead = sink.received(), dead_lettered(server, topic)
    # Nothing silently dropped: every record reached the collector or the dead letters,
    # and exactly the batches holding a poison record were rejected, whole.
    assert received | set(dead) == set(seqs)
    assert sorted(dead) == [*range(seqs[100], seqs[149] + 1), *range(seqs[2200], seqs[2249] + 1)]
    assert not received & set(dead)
    first = dead[seqs[137]]
    assert first["status"] == 413 and "413" in first["reason"]
    assert first["record"]["data"] == {"i": 137} and first["record"]["$tag"] == "poison"

    assert committed(state, topic) == seqs[-1]
    final = status(state)
    assert final["state"] == "stopped" and final["committed_seq"] == seqs[-1]
    # The faults really happened and acks really came out of order: otherwise this
    # test would prove nothing about retries and ordering.
    assert final["retries"] > 0 and final["status_counts"]["503"] > 0
    assert final["status_counts"]["transport"] > 0
    firsts = [batch[0] for batch in sink.acked()]
    assert firsts != sorted(firsts)


def test_once_saves_the_final_checkpoint_even_when_a_save_was_on_the_disk_at_the_end(
    server: str, topic: str, tmp_path: Path, collectors: list[CollectorProcess]
) -> None:
    """A save still in its fsync when the last batches resolve (a loaded machine) is
    followed by the final save: ``--once`` exits with the head committed on disk, in
    status.json and in what it prints. The fault injector holds the first save until
    the tracker has drained; the collector's 300 ms per batch, three rounds deep, makes
    that first save (at 0.2 s) hold a checkpoint below the head."""
    seqs = fill(server, topic, 60)
    sink = collector(collectors, tmp_path, "--delay-ms", "300")
    state = tmp_path / "state"
    code, out = finish(
        start_ship(server, topic, sink, state, "--once", "--in-flight", "2",
                   "--batch-records", "10", launcher=STALLED_SAVE),
        timeout=30,
    )  # fmt: skip
    assert code == 0, out
    assert sink.received() == set(seqs)
    held = orjson.loads(out.split("the stalled save held ")[1].splitlines()[0])
    assert held is not None and held.get(topic, [0, 0])[1] < seqs[-1], out

    assert committed(state, topic) == seqs[-1], out
    assert status(state)["committed_seq"] == seqs[-1]
    assert f"committed $seq {seqs[-1]}" in out


def test_sigkill_mid_run_then_restart_loses_nothing(
    server: str, topic: str, tmp_path: Path, collectors: list[CollectorProcess]
) -> None:
    seqs = fill(server, topic, 6000, poison={1500})
    sink = collector(collectors, tmp_path, "--delay-ms", "10", "--jitter-ms", "40",
                     "--fail-rate", "0.1", "--drop-rate", "0.03",
                     "--reject-tag", "poison")  # fmt: skip
    state = tmp_path / "state"
    args = ("--in-flight", "4", "--batch-records", "20")
    shipper = start_ship(server, topic, sink, state, *args)
    wait_until(lambda: committed(state, topic) >= seqs[2000], 20, "a committed checkpoint")
    shipper.kill()
    shipper.wait()
    at_kill = committed(state, topic)
    assert at_kill < seqs[-1], "the kill must land mid-run for this test to mean anything"

    # The invariant: every record at or below the committed checkpoint was delivered
    # (acked by the collector, or dead-lettered once rejected).
    delivered = sink.received() | set(dead_lettered(server, topic))
    assert {s for s in seqs if s <= at_kill} <= delivered

    code, out = finish(start_ship(server, topic, sink, state, "--once", *args), timeout=30)
    assert code == 0, out
    assert sink.received() | set(dead_lettered(server, topic)) == set(seqs)
    assert set(dead_lettered(server, topic)) == set(range(seqs[1500 // 20 * 20], seqs[1519] + 1))
    assert committed(state, topic) == seqs[-1]
    # The restart resumed from the checkpoint instead of starting over.
    assert status(state)["records_read"] <= seqs[-1] - at_kill


def test_sigterm_drains_and_exits_cleanly_then_follows_live(
    server: str, topic: str, tmp_path: Path, collectors: list[CollectorProcess]
) -> None:
    seqs = fill(server, topic, 600)
    sink = collector(collectors, tmp_path, "--delay-ms", "100", "--jitter-ms", "100")
    state = tmp_path / "state"
    args = ("--in-flight", "4", "--batch-records", "20", "--wait-ms", "200")
    shipper = start_ship(server, topic, sink, state, *args)
    wait_until(lambda: committed(state, topic) >= seqs[100], 20, "a committed checkpoint")
    shipper.send_signal(signal.SIGTERM)
    code, out = finish(shipper, timeout=5)
    assert code == 0, out
    assert "Traceback" not in out

    stopped = status(state)
    at_stop = committed(state, topic)
    assert stopped["state"] == "stopped" and stopped["in_flight"] == 0
    assert at_stop < seqs[-1], "SIGTERM must land mid-run for this test to mean anything"
    assert stopped["committed_seq"] == at_stop
    # Drained: every batch that was on the wire at SIGTERM was answered and committed,
    # so the final checkpoint covers everything the collector acked.
    assert max(sink.received()) <= at_stop
    assert {s for s in seqs if s <= at_stop} <= sink.received()

    # Live by default: a restart catches up, then ships records appended while it runs.
    shipper = start_ship(server, topic, sink, state, *args)
    wait_until(lambda: committed(state, topic) == seqs[-1], 20, "catching up")
    later = fill(server, topic, 30)
    wait_until(lambda: committed(state, topic) == later[-1], 20, "following live")
    shipper.send_signal(signal.SIGINT)
    code, out = finish(shipper, timeout=5)
    assert code == 0, out
    assert sink.received() == set(seqs) | set(later)


def test_ships_on_across_a_lost_gap_after_the_server_is_killed(
    spawn_server: Any, topic: str, tmp_path: Path, collectors: list[CollectorProcess]
) -> None:
    data = tmp_path / "waymark-data"
    server = spawn_server(data, "--ceiling-trim-s", "3600")
    port = server.url.rsplit(":", 1)[1]
    first = append(server.url, topic, [{"data": i} for i in range(3)], create=True,
                   config={"durability": "disk"})  # fmt: skip
    sink = collector(collectors, tmp_path)
    state = tmp_path / "state"
    shipper = start_ship(server.url, topic, sink, state, "--wait-ms", "200")
    wait_until(lambda: committed(state, topic) == first[-1], 20, "the first records")

    # A disk append above the synced seq ceiling waits for a raised one, which leads the
    # head (docs/durability.md): a SIGKILL then leaves the seqs past the head up to the
    # ceiling as a `lost` tombstone. The first append's ceiling leads it by at most its
    # own 3 records, so a burst of 10 needs a raise. The idle trim, which lowers an idle
    # topic's ceiling to its head 50-100 ms after an append, is off on this server: a
    # kill landing later than that on a loaded machine would find no hole.
    burst = append(server.url, topic, [{"data": i} for i in range(3, 13)])
    assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    # Same port: the shipper retries its long-poll until the server is back.
    server = spawn_server(data, "--port", port)
    later = append(server.url, topic, [{"data": i} for i in range(6, 9)])
    assert later[0] > burst[-1] + 1  # the crash left a hole between them
    wait_until(lambda: shipper.poll() is not None or committed(state, topic) == later[-1], 20,
               "shipping past the gap")  # fmt: skip
    assert shipper.poll() is None, finish(shipper, timeout=5)[1]

    shipper.send_signal(signal.SIGTERM)
    code, out = finish(shipper, timeout=10)
    assert code == 0, out
    # The burst's ack waited for the sync of its new ceiling, so its records survived
    # the SIGKILL: shipped before the crash or after the restart.
    assert sink.received() == set(first) | set(burst) | set(later)
    # The gap is recorded like any other tombstone, not skipped silently.
    [gap] = [orjson.loads(g) for g in (state / "gaps.jsonl").read_bytes().splitlines()]
    assert (gap["reason"], gap["gap_from"], gap["gap_to"]) == ("lost", burst[-1] + 1,
                                                                later[0] - 1)  # fmt: skip
    assert status(state)["tombstones"] == 1


def test_ships_from_a_server_with_tokens(
    start_waymark,
    topic: str,
    tmp_path: Path,
    collectors: list[CollectorProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/security.md: the shipper reads with its token (``--token`` or WAYMARK_TOKEN);
    without one it is refused 401 and ships nothing."""
    import httpx

    tokens = tmp_path / "tokens.toml"
    new = [str(Path(sys.executable).parent / "waymark"), "token", "new"]
    made = {name: subprocess.run([*new, name, "--tokens", str(tokens), *scopes],
                                 capture_output=True, text=True, check=True).stdout.split()[-1]
            for name, scopes in (
                ("producer", ["--scope", f"write:{topic}"]),
                ("shipper", ["--scope", f"read:{topic}", "--scope", f"write:{topic}.dead-letter"]),
            )}  # fmt: skip
    secured = start_waymark("--tokens", str(tokens)).url
    auth = {"authorization": f"Bearer {made['producer']}"}
    response = httpx.post(f"{secured}/v0/topics/{topic}/records", headers=auth,
                          json={"records": [{"data": {"i": i}} for i in range(50)]})  # fmt: skip
    assert response.status_code == 200
    sink = collector(collectors, tmp_path)
    monkeypatch.delenv("WAYMARK_TOKEN", raising=False)
    code, out = finish(start_ship(secured, topic, sink, tmp_path / "a", "--once"), timeout=30)
    assert code != 0 and "unauthorized" in out and sink.received() == set()
    monkeypatch.setenv("WAYMARK_TOKEN", made["shipper"])
    code, out = finish(start_ship(secured, topic, sink, tmp_path / "b", "--once"), timeout=30)
    assert code == 0, out
    assert sink.received() == set(range(1, 51))
    assert made["shipper"] not in out  # never logged
