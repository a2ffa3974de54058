"""Both receipt stores keep the same contract (docs/semantics/recovery.md §4), and the
local one survives a SIGKILL of the process writing it."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import ServerProcess

from waymark.client import Client
from waymark.recovery import LocalReceiptStore, ReceiptStore, TopicReceiptStore, topicstore


@pytest.fixture(params=["local", "topic"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, object]]:
    if request.param == "local":
        yield "local", tmp_path / "receipts.db"
    else:
        server: ServerProcess = request.getfixturevalue("waymark_server")
        yield "topic", (server.url, f"receipts-{uuid.uuid4().hex[:8]}")


def open_store(kind: str, where: object) -> ReceiptStore:
    if kind == "local":
        assert isinstance(where, Path)
        return LocalReceiptStore(where)
    url, topic = where  # type: ignore[misc]
    return TopicReceiptStore(url, topic)


def test_the_store_contract(make_store: tuple[str, object]) -> None:
    kind, where = make_store
    store = open_store(kind, where)
    assert store.low_watermark("a") is None
    assert list(store.range_receipts("a", 0)) == []
    store.store_low_watermark("a", 3)
    store.store_range_receipt("a", 5, 5)
    store.store_range_receipt("a", 5, 7)  # the same begin: grown
    store.store_range_receipt("a", 9, 9)
    store.store_range_receipt("a", 4, 4)
    store.store_range_receipt("b", 1, 100)  # another client
    assert list(store.range_receipts("a", 0)) == [(9, 9), (5, 7), (4, 4)]  # newest first
    assert list(store.range_receipts("a", 7)) == [(9, 9)]  # ending above 7 only
    store.purge_range_receipts("a", [9])
    store.purge_before("a", 4)
    assert list(store.range_receipts("a", 0)) == [(5, 7)]
    store.close()
    reopened = open_store(kind, where)  # what was written is kept
    assert reopened.low_watermark("a") == 3 and reopened.low_watermark("b") is None
    assert list(reopened.range_receipts("a", 0)) == [(5, 7)]
    assert list(reopened.range_receipts("b", 0)) == [(1, 100)]
    reopened.close()


def test_the_topic_store_compacts_its_records(
    waymark_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(topicstore, "COMPACT_AFTER", 5)
    topic = f"receipts-{uuid.uuid4().hex[:8]}"
    store = TopicReceiptStore(waymark_server.url, topic)
    for i in range(1, 20):
        store.store_range_receipt("a", i, i)
        store.store_low_watermark("a", i - 1)
        store.purge_before("a", i - 1)
    store.store_range_receipt("other", 1, 1)
    with Client(waymark_server.url) as client:
        live = client.get_topic(topic).count
    assert live < 20, f"{live} records: never compacted"
    fresh = TopicReceiptStore(waymark_server.url, topic)
    assert fresh.low_watermark("a") == 18
    assert list(fresh.range_receipts("a", 0)) == [(19, 19)]
    assert list(fresh.range_receipts("other", 0)) == [(1, 1)]


WRITER = """
import sys
from waymark.recovery import LocalReceiptStore
store = LocalReceiptStore(sys.argv[1])
i = 0
while True:
    i += 1
    store.store_range_receipt("c", i, i)
    store.store_low_watermark("c", i)
    print(i, flush=True)
"""


def test_a_sigkilled_writer_loses_nothing_it_was_told_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "receipts.db"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
    assert child.stdout is not None
    acknowledged = 0
    for line in child.stdout:
        acknowledged = int(line)
        if acknowledged >= 50:
            break
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    store = LocalReceiptStore(path)
    mark = store.low_watermark("c")
    assert mark is not None and mark >= acknowledged
    begins = {b for b, _ in store.range_receipts("c", 0)}
    assert set(range(1, acknowledged + 1)) <= begins
