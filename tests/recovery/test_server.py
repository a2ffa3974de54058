"""The server's change checkpoint source, over HTTP with the shipped client, against
real ``waymark serve`` processes (docs/semantics/recovery.md §1)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from tests.conftest import ServerProcess

from waymark.client import ApiError, Client
from waymark.protocol import Checkpoint, ConfigPatch, Durability, RecordIn

FAST = ("--checkpoint-interval-s", "0.05")


def wait_for(client: Client, key: str, version: int, timeout: float = 10.0) -> list[Checkpoint]:
    """The checkpoints once one names ``key`` at ``version`` or later."""
    deadline = time.monotonic() + timeout
    while True:
        found = list(client.checkpoints())
        if any(c.key == key and c.last >= version for cp in found for c in cp.changes):
            return found
        assert time.monotonic() < deadline, f"no checkpoint names {key}@{version}: {found}"
        time.sleep(0.05)


def changes(found: list[Checkpoint]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for checkpoint in reversed(found):
        for change in checkpoint.changes:
            out.setdefault(change.key, []).append((change.first, change.last))
    return out


@pytest.fixture
def server(start_waymark: Callable[..., ServerProcess]) -> ServerProcess:
    return start_waymark(*FAST)


def test_checkpoints_name_keys_with_first_and_last_versions(server: ServerProcess) -> None:
    with Client(server.url) as client:
        client.put_topic("orders", ConfigPatch(durability=Durability.FSYNC))
        client.put_topic("notes", ConfigPatch(durability=Durability.MEMORY))
        client.put_topic("blips", ConfigPatch(durability=Durability.EPHEMERAL))
        client.append("orders", [RecordIn.of(1, tag="o1"), RecordIn.of(2, tag="o2"),
                                 RecordIn.of(3, tag="o1"), RecordIn.of(4)])  # fmt: skip
        client.append("notes", [RecordIn.of("n", tag="x")])
        client.append("blips", [RecordIn.of("b", tag="never")])
        found = wait_for(client, "notes/x", 1)
        found = wait_for(client, "orders/o2", 2)
        seen = changes(found)
        assert seen["orders/o1"] == [(1, 3)]  # first and last in one interval
        assert seen["orders/o2"] == [(2, 2)] and seen["orders"] == [(4, 4)]
        assert not any(k.startswith("blips") for k in seen), "ephemeral topics never appear"
        ids = [c.id for c in found]
        assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)


def test_deletes_and_drops_are_changes_named_at_committed_versions(server: ServerProcess) -> None:
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of(i, tag=t) for i, t in enumerate("abab")])
        wait_for(client, "orders/b", 4)
        before = {c.id for c in client.checkpoints()}
        deleted = client.delete("orders", match="a")
        assert deleted.head_seq == 5, "the deletion takes a seq of its own"
        found = wait_for(client, "orders/a", 5)  # named at it, after the records it removed
        fresh = [c for c in found if c.id not in before]
        assert {ch.key for c in fresh for ch in c.changes} == {"orders/a"}  # only what changed
        epoch = client.get_topic("orders").epoch
        client.delete_topic("orders")
        deadline = time.monotonic() + 10
        while not any(ch.key == "orders/b" for c in client.checkpoints() if c.id not in before
                      for ch in c.changes):  # fmt: skip
            assert time.monotonic() < deadline, "the drop is not a change"
            time.sleep(0.05)
        after = [ch for c in client.checkpoints() if c.id not in before for ch in c.changes]
        dropped = {ch.key: (ch.last, ch.epoch) for ch in after if ch.first == ch.last == 6}
        # the drop: every key at the seq the instance would have handed out next
        assert dropped == {"orders": (6, epoch), "orders/b": (6, epoch)}
        for checkpoint in client.checkpoints():
            assert all(1 <= ch.first <= ch.last <= 6 for ch in checkpoint.changes)


def test_filter_keeps_every_id_and_paging_walks_back(server: ServerProcess) -> None:
    with Client(server.url) as client:
        for i in range(6):
            client.append("orders" if i % 2 else "users", [RecordIn.of(i, tag=f"k{i}")])
            time.sleep(0.08)  # one checkpoint each
        wait_for(client, "orders/k5", 3)
        everything = list(client.checkpoints(limit=2))  # three pages at least
        assert len(everything) >= 6
        filtered = list(client.checkpoints(topics=["orders"], limit=2))
        assert [c.id for c in filtered] == [c.id for c in everything]
        assert all(ch.key.startswith("orders/") for c in filtered for ch in c.changes)
        assert sum(len(c.changes) for c in filtered) == 3
        newest = everything[0]
        recent = list(client.checkpoints(newest.time_ms))
        assert [c.id for c in recent] == [c.id for c in everything if c.time_ms >= newest.time_ms]


def test_the_watch_streams_new_checkpoints_and_resumes(server: ServerProcess) -> None:
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of(1, tag="a")])
        first = wait_for(client, "orders/a", 1)[0].id
        stream = client.watch_checkpoints(after=0, read_timeout=5)
        assert next(stream).id == first
        client.append("orders", [RecordIn.of(2, tag="b")])
        following = next(stream)
        assert following.id > first and [c.key for c in following.changes] == ["orders/b"]
        stream.close()


def test_bad_parameters_get_invalid_request(server: ServerProcess) -> None:
    with Client(server.url) as client:
        with pytest.raises(ApiError) as refused:
            client.list_checkpoints(limit=0)
        assert refused.value.status == 400 and refused.value.code == "invalid_request"
    base = server.url
    for path, params, headers in (
        ("/v0/changes/checkpoints", {"before": "x"}, {}),
        ("/v0/changes/checkpoints", {"earliest_ms": str(2**63)}, {}),
        ("/v0/changes/checkpoints", {"limit": "1001"}, {}),
        ("/v0/changes/checkpoints", {"limit": "³"}, {}),  # a digit int() refuses
        ("/v0/changes/watch", {"after": "-1"}, {}),
        ("/v0/changes/watch", {"after": str(2**63)}, {}),
        ("/v0/changes/watch", {}, {"last-event-id": "1:2"}),
    ):
        answer = httpx.get(f"{base}{path}", params=params, headers=headers)
        assert answer.status_code == 400, (path, params, headers)
        assert answer.json()["error"]["code"] == "invalid_request"


def test_ids_are_never_reused_across_a_crash(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    server = spawn_server(data, *FAST)
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of(1, tag="a")])
        before = wait_for(client, "orders/a", 1)[0].id
    server.stop(signal.SIGKILL)
    server = spawn_server(data, *FAST)
    with Client(server.url) as client:
        assert max(c.id for c in client.checkpoints()) == before  # it survived the kill
        client.append("orders", [RecordIn.of(2, tag="b")])
        after = wait_for(client, "orders/b", 2)[0].id
        assert after > before


def test_retention_is_the_recovery_window(start_waymark: Callable[..., ServerProcess]) -> None:
    server = start_waymark(*FAST, "--recovery-window-s", "2")
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of(1, tag="a")])
        wait_for(client, "orders/a", 1)
        deadline = time.monotonic() + 10
        while list(client.checkpoints()):
            assert time.monotonic() < deadline, "checkpoints outlive the recovery window"
            time.sleep(0.1)
        assert [t.name for t in client.list_topics()] == ["orders"]  # the internal one is hidden


def test_the_routes_are_in_the_openapi_document(server: ServerProcess) -> None:
    with Client(server.url) as client:
        paths = client.openapi()["paths"]
    assert "/v0/changes/checkpoints" in paths and "/v0/changes/watch" in paths


def test_a_stateless_client_recovers_on_another_machine(server: ServerProcess) -> None:
    """Receipts kept in a topic: a second service, sharing nothing with the first
    but the server, reports exactly what the first never receipted."""
    from waymark.recovery import RecoveryService, TopicCheckpoints, TopicReceiptStore

    with Client(server.url) as http:
        http.put_topic("orders")  # a filter names existing topics

    def service() -> RecoveryService:
        return RecoveryService(TopicCheckpoints(server.url, topics=["orders"]),
                               TopicReceiptStore(server.url, "indexer-receipts"),
                               "indexer", recent_s=0)  # fmt: skip

    first = service()
    seen: list[object] = []
    assert list(first.subscribe(seen.append)) == []  # a first start
    with Client(server.url) as client:
        client.append("orders", [RecordIn.of(1, tag="done")])
        deadline = time.monotonic() + 10
        while not seen:
            assert time.monotonic() < deadline, "the listener got nothing"
            time.sleep(0.05)
        (done,) = seen
        first.submit_receipt(done.key, done.version, done.epoch).result(timeout=10)  # type: ignore[attr-defined]
        client.append("orders", [RecordIn.of(2, tag="stale")])
        wait_for(client, "orders/stale", 2)
    first.close()
    second = service()
    try:
        assert [(c.key, c.version) for c in second.missed()] == [("orders/stale", 2)]
    finally:
        second.close()
