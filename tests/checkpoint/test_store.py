"""Durable committed checkpoints: atomic replace, torn saves, restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from waymark.checkpoint import (
    CheckpointStore,
    CheckpointStoreCorrupt,
    Committed,
    DroppedTicketWarning,
    Tracker,
)


def test_missing_file_loads_empty(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "state" / "ckpt.json").load() == {}


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "state" / "ckpt.json")
    saved = {"a": Committed(3, 120), "b": Committed(1, {"seq": 9, "segment": "s1"})}
    store.save(saved)
    assert store.load() == saved
    assert not (tmp_path / "state" / "ckpt.json.tmp").exists()


def test_restart_resumes_from_the_committed_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt.json")
    tracker: Tracker[int] = Tracker()
    first, second, third = (tracker.create_batch("s", cp).begin_send() for cp in (10, 20, 30))
    first.ack()
    third.ack()
    store.save(tracker.snapshot())
    # Crash: `second` never resolved, `third` was acked but could not commit.
    restarted: Tracker[int] = Tracker(store.load())
    assert restarted.committed("s") == Committed(1, 10)
    nxt = restarted.create_batch("s", 20)
    assert nxt.batch_id == 2, "batch ids continue right after the committed batch"
    nxt.begin_send().ack()
    assert restarted.committed("s") == Committed(2, 20)
    with pytest.warns(DroppedTicketWarning):
        del second  # the crashed run's ticket


def test_torn_save_never_replaces_the_committed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ckpt.json"
    store = CheckpointStore(path)
    store.save({"s": Committed(1, 10)})
    before = path.read_bytes()

    real_write = os.write

    def torn_write(fd: int, data: bytes | memoryview) -> int:
        # The process dies after half the bytes reached the temp file.
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError("simulated crash mid-write")

    monkeypatch.setattr(os, "write", torn_write)
    with pytest.raises(OSError, match="simulated crash"):
        store.save({"s": Committed(2, 20)})
    monkeypatch.undo()

    assert path.read_bytes() == before
    assert (tmp_path / "ckpt.json.tmp").exists()
    assert CheckpointStore(path).load() == {"s": Committed(1, 10)}
    assert not (tmp_path / "ckpt.json.tmp").exists(), "load discards the leftover temp file"


def test_failed_fsync_never_replaces_the_committed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ckpt.json"
    store = CheckpointStore(path)
    store.save({"s": Committed(1, 10)})

    def failing_fsync(fd: int) -> None:
        raise OSError("simulated EIO on fsync")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="EIO"):
        store.save({"s": Committed(2, 20)})
    monkeypatch.undo()
    assert store.load() == {"s": Committed(1, 10)}


def test_corrupt_file_is_refused_not_reset(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.json"
    store = CheckpointStore(path)
    store.save({"s": Committed(4, 40)})
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointStoreCorrupt, match="checksum"):
        store.load()
    path.write_bytes(b"{}")
    with pytest.raises(CheckpointStoreCorrupt, match="not a waymark checkpoint file"):
        store.load()


_SAVER = textwrap.dedent(
    """
    import sys
    from waymark.checkpoint import CheckpointStore, Committed
    store = CheckpointStore(sys.argv[1])
    n = 0
    while True:
        n += 1
        store.save({"s": Committed(n, n * 10), "pad": Committed(n, "x" * 4096)})
        if n == 5:
            print("saving", flush=True)
    """
)


def test_sigkill_mid_save_leaves_a_whole_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.json"
    for delay in (0.0, 0.013, 0.031):
        proc = subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline() == "saving\n"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        loaded = CheckpointStore(path).load()
        n = loaded["s"].batch_id
        assert n >= 5
        assert loaded == {"s": Committed(n, n * 10), "pad": Committed(n, "x" * 4096)}
        path.unlink()
