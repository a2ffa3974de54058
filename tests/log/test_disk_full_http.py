"""A full disk and crashes, on a real ``waymark serve`` process read through the client
(docs/durability.md, "Full disk, I/O errors" and "What a reader sees after a crash").

- A write the server refused (503 ``storage_unavailable``) never becomes readable, and
  a write it accepted is never refused afterwards: it is answered once its frame is
  stored, however long the disk refuses. Every acknowledged record survives a SIGKILL.
- An ``fsync`` topic reports no loss after any number of crashes: the restart that moves
  past the seq ceiling's lead journals it, so the next restart does not take the
  skipped seqs for lost ones (found by the fault campaign, docs/faults.md).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from waymark.client import ApiError, Client, RecordIn, TransportError
from waymark.faults.disk import TmpfsDisk
from waymark.protocol import ConfigPatch, Durability, ErrorCode, Tombstone

Outcome = tuple[str, int]  # ("acked", seq), ("refused", 0) or ("unknown", 0)


def read_all(client: Client, topic: str) -> tuple[dict[str, int], list[Tombstone]]:
    """Every record of ``topic`` as id (its data) -> seq, and every tombstone met."""
    records: dict[str, int] = {}
    tombstones: list[Tombstone] = []
    cursor = 0
    while True:
        page = client.diff(topic, cursor)
        if page.tombstone is not None:
            tombstones.append(page.tombstone)
        records.update({r.data: r.seq for r in page.records})
        cursor = page.next_from_seq
        if page.caught_up:
            return records, tombstones


def kill(server: Any) -> None:
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()


def test_an_fsync_topic_crashed_twice_before_a_seal_reports_no_loss(
    tmp_path: Path, spawn_server: Callable[..., Any]
) -> None:
    data_dir = tmp_path / "data"
    # No seal and no idle trim: both crashes come while the ceiling leads the head.
    flags = ("--seal-interval-s", "3600", "--ceiling-trim-s", "3600")
    server = spawn_server(data_dir, *flags)
    acked: dict[str, int] = {}

    def burst(url: str, run: int) -> None:
        with Client(url, timeout=10) as client:
            for batch in range(6):
                ids = [f"r{run}-{batch}-{i}" for i in range(50)]
                ack = client.append("f", [RecordIn.of(i, id=i) for i in ids])
                acked.update(zip(ids, ack.seqs, strict=True))

    with Client(server.url, timeout=10) as client:
        client.put_topic("f", ConfigPatch(durability=Durability.FSYNC))
    burst(server.url, 0)
    kill(server)
    server = spawn_server(data_dir, *flags)
    with Client(server.url, timeout=10) as client:
        state = client.get_topic("f")
        # The restart moved past the ceiling's lead, silently (what this test is about).
        assert state.head_seq > max(acked.values())
    burst(server.url, 1)  # records above the lead, in the same WAL as those below it
    kill(server)
    server = spawn_server(data_dir, *flags)
    with Client(server.url, timeout=10) as client:
        records, tombstones = read_all(client, "f")
    assert tombstones == [], "an fsync topic told a reader of a loss that never happened"
    assert records == acked


def test_a_refused_write_never_becomes_readable_and_an_accepted_one_is_never_refused(
    tmp_path: Path, spawn_server: Callable[..., Any]
) -> None:
    disk = TmpfsDisk(tmp_path / "data", size_mb=16)  # the campaign's fault injector
    if not disk.mount():
        pytest.skip("the full-disk fault injector mounts a tmpfs, which needs root")
    try:
        server = spawn_server(disk.path, "--seal-interval-s", "3600")
        outcomes: dict[str, Outcome] = {}

        def append(topic: str, rid: str, timeout: float) -> None:
            with Client(server.url, timeout=timeout) as client:
                try:
                    ack = client.append(topic, [RecordIn.of(rid, id=rid)])
                    outcomes[rid] = ("acked", ack.seqs[0])
                except ApiError as e:
                    assert e.code is ErrorCode.STORAGE_UNAVAILABLE, e
                    outcomes[rid] = ("refused", 0)
                except TransportError:  # gave up waiting: stored or not, nobody knows
                    outcomes[rid] = ("unknown", 0)

        with Client(server.url, timeout=10) as client:
            client.put_topic("f", ConfigPatch(durability=Durability.FSYNC))
            client.put_topic("d", ConfigPatch(durability=Durability.DISK))
        append("f", "f-before", 10)
        append("d", "d-before", 10)
        disk.fill()
        # The first writes the WAL cannot store were accepted: they wait for the disk.
        waiting = [
            threading.Thread(target=append, args=(topic, f"{topic}-in-flight", 60))
            for topic in ("f", "d")
        ]
        for thread in waiting:
            thread.start()
        # Once a WAL shard has failed, new writes are refused at once.
        deadline = time.monotonic() + 20
        n = 0
        while not any(kind == "refused" for kind, _ in outcomes.values()):
            assert time.monotonic() < deadline, f"nothing was refused: {outcomes}"
            n += 1
            append("f" if n % 2 else "d", f"probe-{n}", 1)
        disk.free()
        for thread in waiting:
            thread.join(60)
        assert outcomes["f-in-flight"][0] == outcomes["d-in-flight"][0] == "acked", outcomes
        # The WAL retries with a backoff: writes are taken again once it has stored
        # what it holds (the sync of an fsync write covers everything queued before it).
        while outcomes.get("f-after", ("",))[0] != "acked":
            assert time.monotonic() < deadline + 30, outcomes
            append("f", "f-after", 10)

        def check(url: str, crashed: bool) -> None:
            with Client(url, timeout=10) as client:
                for topic in ("f", "d"):
                    records, tombstones = read_all(client, topic)
                    for rid, (kind, seq) in outcomes.items():
                        if not rid.startswith(topic) and not rid.startswith("probe"):
                            continue
                        if kind == "acked" and rid.startswith(topic):
                            assert records.get(rid) == seq, (topic, rid, seq, records)
                        if kind == "refused":
                            assert rid not in records, f"refused {rid} is readable in {topic}"
                    # (A crash may cost a disk topic its ceiling's lead, announced.)
                    if topic == "f" or not crashed:
                        assert tombstones == [], (topic, tombstones)

        check(server.url, crashed=False)
        kill(server)
        check(spawn_server(disk.path, "--seal-interval-s", "3600").url, crashed=True)
    finally:
        disk.unmount()
