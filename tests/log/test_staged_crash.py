"""Crash tests of a sink's journaled stages (docs/durability.md, "Staged chunks"): a
real server on one data directory, SIGKILLed again and again at one of three moments —
after a batch is staged and before its publish is sent, while its publish is in flight,
and after its publish is acknowledged. In half the runs a whole seal (a WAL rotation,
then the trim of the older files) lands between the last batch's stages and its
publish: that publish must not name stage frames the trim removed.

After every restart the topic holds each published batch once, whole, at the seqs its
publish answered; nothing of a batch whose publish was never sent; a batch whose publish
was in flight either whole at contiguous seqs (and its publish then answers those seqs,
``replayed``) or not at all (and its publish is refused until it is staged again).
Publishing any batch again appends nothing.
"""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from waymark.log.storage.frames import FrameKind, read_file

TOPIC = "out"
WRITER = "sink"
PARTS, CHUNKS, PER_CHUNK = 2, 3, 400
ROWS = PARTS * CHUNKS * PER_CHUNK
CYCLES = 6  # each moment (cycle % 3) with and without seals (cycle % 2)


def rows(batch: int) -> list[bytes]:
    """Batch ``batch``'s rows in publish order (partition 0's chunks, then 1's)."""
    return [b'{"b":%d,"i":%d,"pad":"%b"}' % (batch, i, b"x" * (i % 40)) for i in range(ROWS)]


def stage(client: httpx.Client, epoch: int, batch: int) -> None:
    """Stage ``batch`` as the sink's tasks do: compact bodies of data-only records (the
    columnar path, whose chunks are journaled as they are staged)."""
    data = rows(batch)
    for partition in range(PARTS):
        for chunk in range(CHUNKS):
            lo = (partition * CHUNKS + chunk) * PER_CHUNK
            records = b",".join(b'{"data":%b}' % d for d in data[lo : lo + PER_CHUNK])
            body = orjson.dumps({"writer": WRITER, "epoch": epoch, "batch_id": batch,
                                 "partition": partition, "attempt": 0, "chunk": chunk,
                                 "records": orjson.Fragment(b"[" + records + b"]")})  # fmt: skip
            response = client.post(
                f"/v0/topics/{TOPIC}/stage",
                content=body,
                headers={"content-type": "application/json"},
            )
            assert response.status_code == 200, response.text
            assert response.json()["staged"] == PER_CHUNK


def publish(client: httpx.Client, epoch: int, batch: int) -> httpx.Response:
    parts = [{"partition": p, "attempt": 0, "chunks": CHUNKS} for p in range(PARTS)]
    body = {"writer": WRITER, "epoch": epoch, "batch_id": batch, "parts": parts}
    return client.post(f"/v0/topics/{TOPIC}/publish", json=body)


def read_all(client: httpx.Client) -> dict[int, bytes]:
    records: dict[int, bytes] = {}
    cursor = 0
    while True:
        page = client.post(f"/v0/topics/{TOPIC}/diff",
                           json={"from_seq": cursor, "limit": 1000}).json()  # fmt: skip
        assert page["tombstone"] is None, page["tombstone"]  # (nothing is ever lost)
        for record in page["records"]:
            records[record["$seq"]] = orjson.dumps(record["data"])
        cursor = page["next_from_seq"]
        if page["caught_up"]:
            return records


def open_writer(client: httpx.Client) -> int:
    response = client.post("/v0/writers", json={"writer": WRITER})
    assert response.status_code == 200, response.text
    return int(response.json()["epoch"])


def seals(client: httpx.Client) -> int:
    """Seals the server completed (each rotated the WAL when it began, then trimmed it)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("waymark_seals_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no waymark_seals_total in /metrics")


def batches_present(present: dict[int, bytes]) -> dict[int, list[int]]:
    """batch -> the seqs holding its rows, in seq order."""
    found: dict[int, list[int]] = {}
    for seq in sorted(present):
        found.setdefault(orjson.loads(present[seq])["b"], []).append(seq)
    return found


def publish_frames(data_dir: Path) -> int:
    """Publish frames naming stage frames in the WAL now (before a restart replays it)."""
    return sum(f.kind is FrameKind.PUBLISH for path in sorted(data_dir.glob("wal/*/*.wal"))
               for f in read_file(path)[0])  # fmt: skip


@pytest.mark.slow
def test_sigkill_around_journaled_stages(tmp_path: Path,
                                         spawn_server: Callable[..., Any]) -> None:  # fmt: skip
    rng = random.Random(11)
    data_dir = tmp_path / "data"
    published: dict[int, int] = {}  # batch -> first seq its publish answered
    never_sent: set[int] = set()  # staged, killed before the publish was sent
    in_flight: set[int] = set()  # killed while the publish was on its way
    by_reference = 0
    batch = 0
    for cycle in range(CYCLES):
        sealing = cycle % 2 == 1
        server = spawn_server(data_dir, *(("--seal-interval-s", "0.3") if sealing else ()))
        with httpx.Client(base_url=server.url, timeout=30) as client:
            if not cycle:  # (fsync: a restart moves past the seq ceiling without a gap)
                response = client.put(f"/v0/topics/{TOPIC}", json={"durability": "fsync"})
                assert response.status_code == 201, response.text
            epoch = open_writer(client)
            present = read_all(client)
            found = batches_present(present)
            for b, seqs in found.items():
                want = [orjson.dumps(orjson.loads(d)) for d in rows(b)]
                assert [present[s] for s in seqs] == want, f"batch {b} is not whole, once"
                assert seqs == list(range(seqs[0], seqs[0] + ROWS)), f"batch {b} not contiguous"
                assert b in published or b in in_flight, f"batch {b} was never published"
            for b, first in published.items():
                assert found.get(b, [None])[0] == first, f"acked batch {b} moved or lost"
            assert not never_sent & set(found), "a batch only staged appeared"
            for b in sorted(in_flight):  # its publish either landed whole, or not at all
                again = publish(client, epoch, b)
                if b in found:
                    assert again.status_code == 200, again.text
                    assert again.json()["replayed"] and again.json()["first_seq"] == found[b][0]
                    published[b] = found[b][0]
                else:
                    assert again.status_code == 404, again.text  # its stages died with it
                    never_sent.add(b)
            in_flight.clear()
            for b, first in published.items():  # a replayed publish appends nothing
                again = publish(client, epoch, b)
                assert again.status_code == 200 and again.json()["replayed"], again.text
                assert again.json()["first_seq"] == first
            head = client.get(f"/v0/topics/{TOPIC}").json()["head_seq"] if cycle else 0
            # A few batches published and acknowledged, then the kill at its moment.
            for _ in range(rng.randrange(1, 4)):
                batch += 1
                stage(client, epoch, batch)
                answer = publish(client, epoch, batch)
                assert answer.status_code == 200, answer.text
                assert answer.json()["first_seq"] > head and not answer.json()["replayed"]
                published[batch] = head = answer.json()["first_seq"]
            batch += 1
            stage(client, epoch, batch)
            if sealing:  # a whole seal between the stages and the publish: their file trimmed
                after_stages = seals(client)
                deadline = time.monotonic() + 60
                while seals(client) < after_stages + 2:
                    assert time.monotonic() < deadline, "no seal came"
                    time.sleep(0.01)
            moment = ("staged", "in flight", "acked")[cycle % 3]
            if moment == "staged":
                never_sent.add(batch)
            elif moment == "acked":
                answer = publish(client, epoch, batch)
                assert answer.status_code == 200, answer.text
                published[batch] = answer.json()["first_seq"]
            else:
                sent = threading.Event()
                request = threading.Thread(target=_publish_until_dead,
                                           args=(server.url, epoch, batch, sent))  # fmt: skip
                request.start()
                assert sent.wait(30)
                in_flight.add(batch)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        if moment == "in flight":
            request.join(30)
        if not sealing:
            by_reference += publish_frames(data_dir)
    assert by_reference, "no publish named its stage frames: the journaled path went untested"
    server = spawn_server(data_dir)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        found = batches_present(read_all(client))
    assert set(found) >= set(published)
    assert not never_sent & set(found)


def _publish_until_dead(url: str, epoch: int, batch: int, sent: threading.Event) -> None:
    """Write ``batch``'s whole publish request to the server, tell the test (which kills
    the server at once: the publish is then being read, applied or synced), and wait
    for an answer that may never come."""
    parsed = httpx.URL(url)
    parts = [{"partition": p, "attempt": 0, "chunks": CHUNKS} for p in range(PARTS)]
    body = orjson.dumps({"writer": WRITER, "epoch": epoch, "batch_id": batch, "parts": parts})
    head = (f"POST /v0/topics/{TOPIC}/publish HTTP/1.1\r\nHost: {parsed.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    with socket.create_connection((parsed.host, parsed.port), timeout=30) as connection:
        connection.sendall(head.encode() + body)
        sent.set()
        with contextlib.suppress(OSError):
            connection.recv(65536)
