"""A sink's publish keeps the server responsive (docs/spark.md, "Sink speed").

A publish whose stage frames a seal has meanwhile moved out of the WAL file its frame
goes to writes its records in its own frame instead of naming them. That frame's
header was built with a pyarrow call taking a Python scalar, whose first use makes
pyarrow import pandas: ~1.5 s of imports on the event loop of a server under a
Spark sink's load, every request waiting behind it. A real server, a real seal
between the stages and the publish; the server must never have loaded pandas.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from waymark.client import Client, StagedPart
from waymark.protocol import RecordIn

TOPIC, WRITER = "out", "sink"


def seals(url: str) -> int:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("waymark_seals_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no waymark_seals_total in /metrics")


def mapped(pid: int, name: str) -> list[str]:
    """The files of ``name``'s package the process has mapped (its C extensions)."""
    with open(f"/proc/{pid}/maps") as maps:
        return sorted({line.split()[-1] for line in maps if f"/{name}/" in line})


def test_a_publish_a_seal_moved_off_its_stage_frames_loads_no_pandas(
    tmp_path: Path, spawn_server: Callable[..., Any]
) -> None:
    server = spawn_server(tmp_path / "data", "--seal-interval-s", "0.05")
    rows = [b'{"data":{"i":%d,"pad":"%s"}}' % (i, b"x" * (i % 30)) for i in range(2_000)]
    with Client(server.url) as client:
        epoch = client.open_writer(WRITER).epoch
        for chunk in range(2):
            body = b",".join(rows[chunk * 1_000 : (chunk + 1) * 1_000])
            staged = client.stage(TOPIC, body, writer=WRITER, epoch=epoch, batch_id=0,
                                  partition=0, attempt=0, chunk=chunk)  # fmt: skip
            assert staged.accepted and staged.staged == 1_000
        # Two more seals (a seal runs only after a write: another topic's appends), so
        # one began after the stages: it rotated the WAL away from their file.
        after_stages = seals(server.url)
        deadline = time.monotonic() + 60
        while seals(server.url) < after_stages + 2:
            assert time.monotonic() < deadline, "no seal came"
            client.append("nudge", [RecordIn(data=1)])
            time.sleep(0.01)
        answer = client.publish(TOPIC, writer=WRITER, epoch=epoch, batch_id=0,
                                parts=[StagedPart(0, 0, 2)])  # fmt: skip
        assert (answer.count, answer.replayed) == (2_000, False)
        page = client.diff(TOPIC, answer.first_seq - 1, limit=2_000)
        assert [r.data["i"] for r in page.records] == list(range(2_000))
        assert mapped(server.process.pid, "pyarrow"), "the publish's path loads pyarrow"
        assert mapped(server.process.pid, "pandas") == []
