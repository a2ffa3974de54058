"""The worked example of docs/recovery.md, run as written: an `orders` indexer, a
real server, the indexer stopped mid-run and SIGKILLed, restarted, re-indexing
exactly the stale keys; and the CLI's view of the same state."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ServerProcess, readable

from waymark.client import Client
from waymark.protocol import RecordIn

ROOT = Path(__file__).resolve().parents[2]
WAYMARK = str(Path(sys.executable).parent / "waymark")


def example_code() -> str:
    page = (ROOT / "docs" / "recovery.md").read_text()
    section = page.split("## Worked example", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the worked example lost its code"
    return match.group(1)


class Indexer:
    def __init__(self, script: Path, url: str, tmp_path: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(script), url, str(tmp_path / "receipts.db"),
             str(tmp_path / "index.json")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def line(self, timeout: float = 20.0) -> tuple[str, list[str]]:
        assert self.process.stdout is not None
        ready = readable(self.process.stdout, timeout)
        assert ready, "the indexer printed nothing"
        label, _, tags = self.process.stdout.readline().partition(" ")
        return label, json.loads(tags)

    def until_indexed(self, wanted: set[str]) -> None:
        seen: set[str] = set()
        while not wanted <= seen:
            label, tags = self.line()
            assert label == "indexed"
            seen.update(tags)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


def write(client: Client, tag: str, value: object) -> None:
    client.append("orders", [RecordIn.of({"order": tag, "value": value}, tag=tag)])


def test_the_orders_indexer_reindexes_exactly_the_stale_keys(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start_waymark("--checkpoint-interval-s", "0.05")
    script = tmp_path / "indexer.py"
    script.write_text(example_code())
    client = Client(server.url)
    indexer = Indexer(script, server.url, tmp_path)
    try:
        assert indexer.line() == ("recovered", [])  # a first start
        for i in range(1, 6):
            write(client, f"o{i}", i)
        indexer.until_indexed({"o1", "o2", "o3", "o4", "o5"})
        time.sleep(0.3)  # let the last receipts reach the disk (they are not waited for)

        indexer.process.send_signal(signal.SIGSTOP)  # mid-run: o4's change is never processed
        write(client, "o4", "changed while stopped")
        time.sleep(0.3)
        indexer.kill()

        write(client, "o3", "changed while down")
        write(client, "o6", "new while down")
        client.delete("orders", match="o2")
        time.sleep(0.3)  # their checkpoints are written

        missed = subprocess.run(
            [WAYMARK, "recovery", "missed", "--url", server.url, "--store",
             str(tmp_path / "receipts.db"), "--client", "orders-indexer", "--topics", "orders",
             "--recent-s", "0", "--json"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        assert {json.loads(line)["key"] for line in missed.splitlines()} == {
            "orders/o2", "orders/o3", "orders/o4", "orders/o6"
        }  # fmt: skip

        indexer = Indexer(script, server.url, tmp_path)
        assert indexer.line() == ("recovered", ["o2", "o3", "o4", "o6"])
        index = json.loads((tmp_path / "index.json").read_text())
        fold = {r.tag: r.data for r in client.diff("orders", 0).records}
        assert index == fold and "o2" not in index
        assert index["o4"]["value"] == "changed while stopped"
    finally:
        indexer.kill()
        client.close()


def test_status_shows_watermark_ranges_and_pending(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    from waymark.recovery import LocalReceiptStore, RecoveryService, TopicCheckpoints

    server = start_waymark("--checkpoint-interval-s", "0.05")
    store = str(tmp_path / "receipts.db")
    first = RecoveryService(TopicCheckpoints(server.url), LocalReceiptStore(store), "x",
                            report=False)  # fmt: skip
    list(first.subscribe(lambda committed: None))  # a first start: watermark 0
    first.close()
    shown = subprocess.run(
        [WAYMARK, "recovery", "status", "--url", server.url, "--store", store, "--client", "x"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert "low watermark: 0" in shown
    assert "0 checkpoints pending" in shown


def test_every_snippet_of_the_page_runs_as_written(
    start_waymark: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """docs/recovery.md's "Using it" and asyncio snippets, each run as a script against
    a real server (``WAYMARK_URL``): a first start, then a start with a missed key."""
    page = (ROOT / "docs" / "recovery.md").read_text()
    using = page.split("## Using it", 1)[1].split("\n## ", 1)[0]
    snippets = re.findall(r"```python\n(.*?)```", using, re.DOTALL)
    assert len(snippets) == 2, "the sync and the asyncio snippet"
    server = start_waymark("--checkpoint-interval-s", "0.05")
    with Client(server.url) as client:
        client.put_topic("orders")
    env = {**os.environ, "WAYMARK_URL": server.url}
    for i, code in enumerate(snippets):
        cwd = tmp_path / f"snippet-{i}"  # its own receipts file
        cwd.mkdir()
        for run in ("first start", "after o1"):
            done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
            assert done.returncode == 0, (run, done.stderr)
            if run == "first start":
                assert "reindexed" not in done.stdout
                write(client, "o1", 1)
                deadline = time.monotonic() + 20
                while not any(c.key == "orders/o1" for cp in client.checkpoints()
                              for c in cp.changes):  # fmt: skip
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            else:
                assert "reindexed orders/o1" in done.stdout, done.stdout
