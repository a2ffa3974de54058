"""Restarts of a real ``waymark serve`` process, checked over HTTP: what readers at old
cursors are told afterwards, and which seqs new records get (docs/durability.md).

- ``ephemeral``: a clean restart (SIGTERM: exact heads, a seal) brings the topic
  back empty with its head kept; records live before the restart read as a ``lost``
  gap to a reader that had not passed them, and deleted ones stay silent.
- ``disk``: a SIGKILL while the topic is idle loses nothing, so readers are told of
  no loss: the seq ceiling of an idle topic is its exact head.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from waymark.log.journal import decode_records
from waymark.log.storage.frames import FrameKind, scan


def diff(http: httpx.Client, topic: str, from_seq: int) -> dict[str, Any]:
    response = http.post(f"/v0/topics/{topic}/diff", json={"from_seq": from_seq})
    assert response.status_code == 200, response.text
    return response.json()


def first_event(http: httpx.Client, topic: str, from_seq: int) -> tuple[str, dict[str, Any]]:
    """The first SSE event of a watch from ``from_seq``: (event name, data)."""
    timeout = httpx.Timeout(10, read=5)
    with http.stream("GET", f"/v0/topics/{topic}/watch", params={"from_seq": from_seq},
                     timeout=timeout) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if line and not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
            elif not line and fields:
                return fields["event"], json.loads(fields["data"])
    raise AssertionError("the stream ended before its first event")


def test_an_ephemeral_topic_after_a_clean_restart(
    tmp_path: Path, spawn_server: Callable[..., Any]
) -> None:
    data_dir = tmp_path / "data"
    server = spawn_server(data_dir)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        put = http.put("/v0/topics/e", json={"durability": "ephemeral"})
        assert put.status_code == 201
        body = {"records": [{"data": i} for i in range(1, 7)]}
        assert http.post("/v0/topics/e/records", json=body).json()["seqs"] == [1, 2, 3, 4, 5, 6]
        deleted = http.post("/v0/topics/e/delete", json={"before_seq": 3}).json()
        assert deleted["deleted"] == 2  # 1 and 2 are gone on purpose, before the restart
        assert deleted["head_seq"] == 7  # the deletion's own seq, born deleted
    assert server.stop(signal.SIGTERM) == 0  # exact heads, then a seal
    server = spawn_server(data_dir)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        # A reader that had read up to 4: told that 5 and 6 went, then caught up.
        page = diff(http, "e", 4)
        assert page["records"] == [] and page["caught_up"]
        tombstone = page["tombstone"]
        assert (tombstone["reason"], tombstone["gap_from"], tombstone["gap_to"]) == ("lost", 5, 6)
        state = http.get("/v0/topics/e").json()
        assert (state["head_seq"], state["count"], state["earliest_seq"]) == (7, 0, 8)
        # A reader from the start: the deleted 1 and 2 pass silently, 3..6 read as lost.
        page = diff(http, "e", 0)
        assert page["tombstone"] is None and page["records"] == []
        page = diff(http, "e", page["next_from_seq"])
        assert (page["tombstone"]["gap_from"], page["tombstone"]["gap_to"]) == (3, 6)
        assert page["caught_up"]
        # A reader that had read everything is told of nothing (7 was never a record).
        page = diff(http, "e", 6)
        assert page["tombstone"] is None and page["records"] == [] and page["caught_up"]
        # SSE sees the same: the gap first, from a stale cursor.
        event, data = first_event(http, "e", 4)
        assert event == "tombstone" and (data["gap_from"], data["gap_to"]) == (5, 6)
        # New records continue above the old head: no seq is handed out twice.
        after = http.post("/v0/topics/e/records", json={"records": [{"data": "new"}]}).json()
        assert after["seqs"] == [8]
        event, data = first_event(http, "e", 6)
        assert event == "record" and (data["$seq"], data["data"]) == (8, "new")


def test_deleted_records_between_and_after_live_ones_stay_silent_after_a_restart(
    tmp_path: Path, spawn_server: Callable[..., Any]
) -> None:
    """Deleted by tag, not from the front: records 2 and 4 were removed on purpose, so a
    restart loses only 1, 3 and 5, and a reader past one of those is told of no other."""
    data_dir = tmp_path / "data"
    server = spawn_server(data_dir)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        assert http.put("/v0/topics/e", json={"durability": "ephemeral"}).status_code == 201
        records = [{"data": i, "tag": "keep" if i % 2 else "drop"} for i in range(1, 6)]
        assert http.post("/v0/topics/e/records", json={"records": records}).status_code == 200
        deleted = http.post("/v0/topics/e/delete", json={"match": "drop"}).json()
        assert deleted["deleted"] == 2
    assert server.stop(signal.SIGTERM) == 0
    server = spawn_server(data_dir)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        told: dict[int, list[tuple[int, int]]] = {}
        for cursor in range(6):
            page, gaps = diff(http, "e", cursor), []
            while True:
                assert page["records"] == []
                if page["tombstone"]:
                    gaps.append((page["tombstone"]["gap_from"], page["tombstone"]["gap_to"]))
                if page["caught_up"]:
                    break
                page = diff(http, "e", page["next_from_seq"])
            told[cursor] = gaps
        assert told == {
            0: [(1, 1), (3, 3), (5, 5)],
            1: [(3, 3), (5, 5)],
            2: [(3, 3), (5, 5)],
            3: [(5, 5)],
            4: [(5, 5)],
            5: [],
        }


def journaled(data_dir: Path, topic: str) -> tuple[int | None, int]:
    """What the server's WAL holds for ``topic`` (what a SIGKILL keeps: it loses only
    frames the server never wrote): its last seq ceiling, and the highest seq of a
    records frame."""
    ceiling, written = None, 0
    for path in sorted((data_dir / "wal").glob("shard-*/*.wal")):
        frames, _ = scan(path.read_bytes(), path)
        for frame in frames:
            if frame.kind is FrameKind.HEAD and orjson.loads(frame.payload)["name"] == topic:
                ceiling = orjson.loads(frame.payload)["ceiling"]
            elif frame.kind is FrameKind.RECORDS:
                records = decode_records(frame.payload)
                if records.name == topic:
                    written = max(written, records.first_seq + len(records.records) - 1)
    return ceiling, written


def test_a_sigkill_while_idle_reports_nothing_lost(
    tmp_path: Path, spawn_server: Callable[..., Any]
) -> None:
    data_dir = tmp_path / "data"
    server = spawn_server(data_dir, "--seal-interval-s", "3600")  # all in the WAL
    expected = []
    with httpx.Client(base_url=server.url, timeout=10) as http:
        for batch in range(6):  # a burst: the ceiling runs ahead of the head meanwhile
            body = {"records": [{"data": [batch, i]} for i in range(50)]}
            response = http.post("/v0/topics/d/records", json=body)
            assert response.status_code == 200 and response.json()["durability"] == "disk"
            expected += body["records"]
        head = response.json()["head_seq"]
    assert head == 300
    # Idle now: the server writes the exact head within a few trim passes (50 ms each).
    # A disk append is acknowledged once queued for the WAL, so wait for the records too:
    # a kill before they are written would lose them for real (docs/durability.md).
    deadline = time.monotonic() + 10
    while journaled(data_dir, "d") != (head, head):
        assert time.monotonic() < deadline, f"the WAL holds {journaled(data_dir, 'd')}"
        time.sleep(0.02)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    server = spawn_server(data_dir)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        records, cursor = [], 0
        while True:
            page = diff(http, "d", cursor)
            assert page["tombstone"] is None, f"told of a loss that never happened: {page}"
            records += page["records"]
            cursor = page["next_from_seq"]
            if page["caught_up"]:
                break
        assert [r["$seq"] for r in records] == list(range(1, 301))
        assert [r["data"] for r in records] == [r["data"] for r in expected]
        after = http.post("/v0/topics/d/records", json={"records": [{"data": "next"}]})
        assert after.json()["seqs"] == [301]  # continues right above the head
