"""``waymark recovery missed`` and ``status`` only look (docs/recovery.md, The CLI):
they create and change nothing, and a store or a client that is not there is an
error, not an empty answer that reads as "caught up". Real ``waymark serve``
processes and the shipped CLI (issue #23, item 8)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import ServerProcess

from waymark.cli.recovery import RICH_ROWS
from waymark.client import Client
from waymark.protocol import ConfigPatch, Durability, RecordIn
from waymark.recovery import LocalReceiptStore, RecoveryService, TopicCheckpoints

WAYMARK = str(Path(sys.executable).parent / "waymark")


def recovery(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([WAYMARK, "recovery", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def server(
    spawn_module_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> ServerProcess:
    return spawn_module_server(tmp_path_factory.mktemp("data"), "--checkpoint-interval-s", "0.05")


@pytest.mark.parametrize("command", ["missed", "status"])
def test_a_store_that_is_not_there_is_an_error_and_is_not_made(
    server: ServerProcess, tmp_path: Path, command: str
) -> None:
    path = tmp_path / "nowhere.db"
    shown = recovery(command, "--url", server.url, "--store", str(path), "--client", "c")
    assert shown.returncode == 2 and "no receipt store" in shown.stderr
    assert not path.exists()
    shown = recovery(command, "--url", server.url, "--store", "topic:no-such-receipts",
                     "--client", "c")  # fmt: skip
    assert shown.returncode == 2 and "no-such-receipts" in shown.stderr
    with Client(server.url) as client:
        assert "no-such-receipts" not in {t.name for t in client.list_topics()}


def test_an_unknown_client_is_an_error_and_a_topic_store_is_left_as_it_is(
    server: ServerProcess, tmp_path: Path
) -> None:
    with Client(server.url) as client:
        client.put_topic("memory-receipts", ConfigPatch(durability=Durability.MEMORY))
    shown = recovery("missed", "--url", server.url, "--store", "topic:memory-receipts",
                     "--client", "nobody")  # fmt: skip
    assert shown.returncode == 2 and "no receipts of client 'nobody'" in shown.stderr
    with Client(server.url) as client:  # not switched to fsync, nothing written
        state = client.get_topic("memory-receipts")
        assert state.durability is Durability.MEMORY and state.head_seq == 0
    path = tmp_path / "r.db"
    LocalReceiptStore(path).close()
    before = path.read_bytes()
    shown = recovery("missed", "--url", server.url, "--store", str(path), "--client", "nobody")
    assert shown.returncode == 2 and "no receipts of client 'nobody'" in shown.stderr
    assert path.read_bytes() == before


def test_a_long_table_is_plain_columns(server: ServerProcess, tmp_path: Path) -> None:
    """More keys than a rich table lays out in reasonable time: plain aligned columns,
    every key."""
    path = tmp_path / "r.db"
    first = RecoveryService(TopicCheckpoints(server.url), LocalReceiptStore(path), "many",
                            report=False)  # fmt: skip
    list(first.subscribe(lambda committed: None))
    first.close()
    first.store.close()
    tags = [f"k{i}" for i in range(RICH_ROWS + 200)]
    with Client(server.url) as client:
        client.append("wide", [RecordIn.of(i, tag=t) for i, t in enumerate(tags)])
        deadline = time.monotonic() + 20
        while not any(c.key == "wide/k0" for cp in client.checkpoints() for c in cp.changes):
            assert time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.05)
    shown = recovery("missed", "--url", server.url, "--store", str(path), "--client", "many",
                     "--recent-s", "0")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{len(tags)} keys missed by many"
    assert lines[1].split() == ["key", "version", "epoch"]
    assert sorted(line.split()[0] for line in lines[2:]) == sorted(f"wide/{t}" for t in tags)
