"""``waymark fold`` as a real process: SIGKILL mid-fold, then resume from the store's cursor."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from waymark.cli import app
from waymark.kv import (
    Connection,
    KvUpdate,
    NatsConnectionConfig,
    StoreConfig,
    WatchCursor,
    WatchScope,
    watch_applied,
)
from waymark.kv.server import EmbeddedNats, free_port
from waymark.kv.stores.lmdb_store import LmdbStore

pytestmark = pytest.mark.timeout(90)


async def test_sigkilled_fold_process_resumes_without_gap_or_replay(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path
) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    for i in range(2000):
        await kv.js.publish_async(f"{kv.subject_prefix}k.{i:05}", b"first-%d" % i)
    await kv.js.publish_async_completed()
    path = tmp_path / "fold"
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "waymark"),
            "fold",
            "--nats",
            nats_server.url,
            "--bucket",
            bucket_name,
            "--store",
            f"lmdb:{path}",
            "--batch-max",
            "50",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        async def cursor_of_process() -> int:
            if not (path / "data.mdb").exists():
                return 0
            s = LmdbStore(path)
            try:
                return s.cursor.as_u64()
            finally:
                s.close()

        while await cursor_of_process() < 1000:
            assert proc.poll() is None, "fold process died"
            await asyncio.sleep(0.05)
        # Keep writing while the process folds, and kill it mid-stream.
        for i in range(3000):
            await kv.js.publish_async(f"{kv.subject_prefix}k.{i % 2500:05}", b"second-%d" % i)
            if i == 1500:
                proc.send_signal(signal.SIGKILL)
        await kv.js.publish_async_completed()
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    store = LmdbStore(path)
    cursor = store.cursor.as_u64()
    # Data and cursor were committed together: nothing in the fold is newer than the cursor.
    assert all((e.version.as_u64() or 0) <= cursor for e in store.range())
    _, last = await kv.stream_bounds()
    assert 1000 <= cursor < last  # killed mid-fold, with work left to resume
    expected_delta = sum(1 for e in await kv.reader().scan() if (e.version.as_u64() or 0) > cursor)

    delta: list[KvUpdate] = []
    done = asyncio.Event()

    def on_applied(c: WatchCursor) -> None:
        if c.as_u64() >= last:
            done.set()

    if cursor >= last:
        done.set()
    await asyncio.wait_for(
        watch_applied(
            kv.watcher(),
            WatchScope.all(),
            delta.extend,
            store=store,
            reader=kv.reader(),
            on_applied=on_applied,
            shutdown=done,
        ),
        30,
    )
    assert all((u.revision or 0) > cursor for u in delta)  # no replay of what was folded
    assert len(delta) == expected_delta
    assert {e.key: e.value for e in store.range()} == {
        e.key: e.value for e in await kv.reader().scan()
    }
    store.close()


def test_fold_show_prints_cursor_then_json_lines(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "fold")
    store.apply(
        [KvUpdate.put("a.text", "héllo".encode(), 3), KvUpdate.put("b.bin", b"\xff\x00", 4)],
        WatchCursor.from_u64(4),
    )
    store.close()
    result = CliRunner().invoke(app, ["fold", "show", "--store", f"lmdb:{tmp_path / 'fold'}"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "cursor 4"
    assert json.loads(lines[1]) == {"key": "a.text", "value": "héllo", "version": 3}
    binary = json.loads(lines[2])
    assert binary["encoding"] == "base64" and base64.b64decode(binary["value"]) == b"\xff\x00"
    only_a = CliRunner().invoke(
        app, ["fold", "show", "--store", f"lmdb:{tmp_path / 'fold'}", "--prefix", "a"]
    )
    assert [json.loads(x)["key"] for x in only_a.output.splitlines()[1:]] == ["a.text"]


def test_nats_reset_attempts_takes_a_count_of_at_least_one(tmp_path: Path) -> None:
    """The knob that bounds a watch's re-creation of a lost consumer (docs/kv.md, "On a
    NATS cluster"); without it the fold retries until one attempt succeeds."""
    result = CliRunner().invoke(
        app,
        ["fold", "--bucket", "b", "--store", f"lmdb:{tmp_path / 'fold'}",
         "--nats-reset-attempts", "0"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--nats-reset-attempts" in result.output
    assert not (tmp_path / "fold").exists()


async def test_a_fold_started_while_its_nats_servers_are_down_waits_for_one(
    tmp_path: Path, bucket_name: str
) -> None:
    """Two URLs, neither up at start (one never comes): the fold says it retries and
    connects once a server answers, exporting too, instead of exiting (docs/kv.md,
    "On a NATS cluster"). Found by the fault campaign: it exited with Timeout."""
    never, later = free_port(), free_port()
    path, log = tmp_path / "fold", tmp_path / "fold.log"
    objects = tmp_path / "objects"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "waymark"), "fold", "--nats",
             f"nats://127.0.0.1:{never},nats://127.0.0.1:{later}", "--nats-timeout-s", "1",
             "--bucket", bucket_name, "--store", f"lmdb:{path}",
             "--export-to", objects.as_uri(), "--export-every-s", "0.2"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        await until(lambda: b"retrying" in log.read_bytes(), proc, log)
        with EmbeddedNats(tmp_path / "nats", port=later) as server:
            async with Connection(NatsConnectionConfig(url=server.url, timeout=5.0)) as c:
                kv = await c.store(bucket_name)
                for i in range(50):
                    await kv.writer().put(f"k.{i}", b"v")

            def folded() -> bool:
                if not (path / "data.mdb").exists():
                    return False
                s = LmdbStore(path)
                try:
                    return s.cursor.as_u64() == 50
                finally:
                    s.close()

            await until(folded, proc, log)
            await until(lambda: (objects / f"{bucket_name}.manifest.json").exists(), proc, log)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0, log.read_text()[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


async def until(done: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait for ``done`` with a deadline, failing at once if the fold exited."""
    deadline = time.monotonic() + 30
    while not done():
        assert proc.poll() is None, f"the fold exited: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        await asyncio.sleep(0.05)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _gone(pid: int) -> bool:
    """No such process, or a zombie: it has exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def test_a_rocksdb_fold_verifies_its_rounds_in_a_worker_that_dies_with_it(
    tmp_path: Path, bucket_name: str
) -> None:
    """``waymark fold --store rocksdb:... --export-to`` publishes, its rounds verified
    by its reopen worker (a child process started before the first round); a
    SIGKILLed fold leaves no worker running: it exits when its stdin closes
    (docs/kv.md, "Replicas")."""
    port = free_port()
    path, log, objects = tmp_path / "fold", tmp_path / "fold.log", tmp_path / "objects"
    with EmbeddedNats(tmp_path / "nats", port=port) as server:
        async with Connection(NatsConnectionConfig(url=server.url, timeout=5.0)) as c:
            kv = await c.store(bucket_name)
            for i in range(50):
                await kv.writer().put(f"k.{i}", b"v")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "waymark"), "fold", "--nats", server.url,
                 "--bucket", bucket_name, "--store", f"rocksdb:{path}",
                 "--export-to", objects.as_uri(), "--export-every-s", "0.2"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            await until(lambda: (objects / f"{bucket_name}.manifest.json").exists(), proc, log)
            manifest = json.loads((objects / f"{bucket_name}.manifest.json").read_bytes())
            assert manifest["backend"] == "rocksdb"
            (worker,) = _children(proc.pid)
            assert "rocksdb_reopen.py" in Path(f"/proc/{worker}/cmdline").read_text()
        finally:
            proc.kill()
            proc.wait(10)
        deadline = time.monotonic() + 30
        while not _gone(worker):
            assert time.monotonic() < deadline, "the reopen worker outlived its fold"
            await asyncio.sleep(0.02)
