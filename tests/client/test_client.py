"""The blocking client against the real server: every route, typed results, ApiError,
and SSE with resumable cursors and automatic reconnect."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import msgspec
import pytest

from waymark.client import (
    ApiError,
    Client,
    ConfigPatch,
    RecordEvent,
    RecordIn,
    TombstoneEvent,
    TopicType,
)
from waymark.protocol import EdgeMeta, EdgePage


def test_health_and_topic_lifecycle(client: Client, topic: str) -> None:
    assert client.health().status == "ok"
    state, created = client.put_topic(topic, ConfigPatch(cap_records=100), type=TopicType.LOG)
    assert created and state.config.cap_records == 100 and state.name == topic
    state, created = client.put_topic(topic, ConfigPatch(ttl_ms=5000))
    assert not created and (state.config.cap_records, state.config.ttl_ms) == (100, 5000)
    assert topic in [t.name for t in client.list_topics()]
    assert client.get_topic(topic, touch=False).last_read_ts == 0
    client.delete_topic(topic)
    with pytest.raises(ApiError) as caught:
        client.get_topic(topic)
    assert (caught.value.status, caught.value.code) == (404, "topic_not_found")
    assert caught.value.detail == {"topic": topic}


def test_append_diff_and_delete_are_typed(client: Client, topic: str) -> None:
    written = client.append(topic, [
        RecordIn.of({"n": 1}, tag="a", node="x", meta={"k": "v"}),
        RecordIn.of([2]),
        RecordIn.of(None, tag="a"),
    ])  # fmt: skip
    assert written.seqs == [1, 2, 3] and written.head_seq == 3 and written.durability == "disk"
    page = client.diff(topic, 0, limit=2)
    first = page.records[0]
    assert (first.seq, first.tag, first.node, first.meta, first.data) == (
        1, "a", "x", {"k": "v"}, {"n": 1},
    )  # fmt: skip
    assert page.records[1].tag is None and page.next_from_seq == 2 and not page.caught_up
    assert client.diff(topic, 0, node=["x"]).records[0].seq == 2
    deleted = client.delete(topic, match=("tag", "Eq", "a"))
    assert (deleted.deleted, deleted.count) == (2, 1)
    assert [r.seq for r in client.diff(topic, 0).records] == [2]


def test_diff_as_decodes_a_page_into_a_caller_type_leniently(client: Client, topic: str) -> None:
    # A pipeline edge's page: meta values are strings, the type reads the generation as
    # an int, other keys are ignored, the data is kept as its JSON
    # (docs/semantics/pipeline.md §3.1).
    client.append(topic, [
        RecordIn.of({"n": 1}, meta={"wm.gen": "3", "wm.event": 'e"\\ü', "wm.t0": "17", "x": "y"}),
        RecordIn.of(2),
    ])  # fmt: skip
    page = client.diff_as(topic, 0, EdgePage, limit=10)
    first, second = page.records
    assert (first.seq, first.meta.generation, bytes(first.data)) == (1, 3, b'{"n":1}')
    assert (second.meta, bytes(second.data)) == (EdgeMeta(), b"2")  # no meta: generation 0
    assert page.tombstone is None and page.next_from_seq == 2
    client.append(topic, [RecordIn.of(3, meta={"wm.gen": "three"})])
    with pytest.raises(msgspec.ValidationError, match=r"wm\.gen"):
        client.diff_as(topic, 2, EdgePage)


def test_an_edge_records_item_count_is_its_meta_s_else_its_packs(
    client: Client, topic: str
) -> None:
    # What counts items on an edge (lag, stale drops, maxOffsetsPerTrigger) reads a
    # pack's wm.n; a pack written before the key existed is counted from its data, a
    # record that is not a pack as one (docs/semantics/pipeline.md §3.1).
    pack = {"events": ["a", "b", "c"], "born_ms": [1, 2, 3], "items": [1, 2, 3]}
    client.append(topic, [
        RecordIn.of(pack, meta={"wm.gen": "1", "wm.n": "3"}),
        RecordIn.of(pack, meta={"wm.gen": "1"}),
        RecordIn.of({"n": 1}),
    ])  # fmt: skip
    assert [r.count() for r in client.diff_as(topic, 0, EdgePage).records] == [3, 3, 1]


def test_refusals_raise_api_error_with_the_spec_code(client: Client, topic: str) -> None:
    with pytest.raises(ApiError) as caught:
        client.append(topic, [RecordIn.of(1, tag="t" * 300)])
    assert (caught.value.status, caught.value.code) == (400, "tag_too_long")
    assert caught.value.message and "400 tag_too_long" in str(caught.value)
    client.put_topic(topic, ConfigPatch(cap_records=1, discard="reject"))
    client.append(topic, [RecordIn.of(1)])
    with pytest.raises(ApiError) as caught:
        client.append(topic, [RecordIn.of(2)])
    assert (caught.value.status, caught.value.code) == (422, "topic_full")
    with pytest.raises(ApiError) as caught:
        client.append(f"{topic}-new", [RecordIn.of(1)], create=False)
    assert caught.value.code == "topic_not_found"
    with pytest.raises(ApiError) as caught:
        client.delete(topic)
    assert caught.value.code == "invalid_request"


def test_long_poll_waits_for_the_next_record(
    client: Client, topic: str, waymark_server, long_polls
) -> None:
    client.append(topic, [RecordIn.of(0)])
    polls = long_polls(waymark_server.url)
    waiting = polls.count()
    with ThreadPoolExecutor(1) as pool, Client(waymark_server.url) as poller:
        poll = pool.submit(poller.diff, topic, 1, wait_ms=10_000)
        polls.wait_for(waiting + 1)  # the poll waits on the server: the next commit wakes it
        client.append(topic, [RecordIn.of("late")])
        page = poll.result(timeout=10)
    assert [r.data for r in page.records] == ["late"]


def test_a_long_poll_longer_than_the_timeout_does_not_time_out(
    client: Client, topic: str, waymark_server
) -> None:
    client.append(topic, [RecordIn.of(0)])
    # The read timeout stretches by wait_ms: the server answers after its 0.5 s wait.
    with Client(waymark_server.url, timeout=0.2) as short:
        page = short.diff(topic, 1, wait_ms=500)
    assert page.records == [] and page.caught_up


def test_openapi_and_metrics(client: Client) -> None:
    assert client.openapi()["openapi"] == "3.1.0"
    assert "waymark_http_requests_total" in client.metrics()


def test_watch_yields_typed_events_and_resumes_from_a_cursor(client: Client, topic) -> None:
    client.put_topic(topic, ConfigPatch(cap_records=3))
    for i in range(5):
        client.append(topic, [RecordIn.of(i)])
    events = client.watch(topic)
    tomb = next(events)
    assert isinstance(tomb, TombstoneEvent) and tomb.tombstone.reason == "cap"
    first = next(events)
    assert isinstance(first, RecordEvent) and first.record.seq == tomb.tombstone.earliest_seq
    events.close()
    resumed = client.watch(topic, cursor=first.cursor)
    assert next(resumed).record.seq == first.record.seq + 1
    resumed.close()


def test_watch_reconnects_after_a_dropped_connection(proxy, client: Client, topic) -> None:
    client.append(topic, [RecordIn.of(i) for i in range(3)])
    with Client(proxy.url) as through_proxy:
        events = through_proxy.watch(topic, read_timeout=5)
        seen = [next(events).record.seq for _ in range(3)]
        proxy.cut()  # the network drops the stream
        client.append(topic, [RecordIn.of(i) for i in range(3, 6)])
        seen += [next(events).record.seq for _ in range(3)]
        events.close()
    # Every record exactly once, in order, over two connections.
    assert seen == [1, 2, 3, 4, 5, 6]
    assert proxy.connections == 2


def test_watch_gives_up_after_max_retries(client: Client, topic) -> None:
    client.append(topic, [RecordIn.of(0)])
    dead = Client("http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(Exception) as caught:
        next(dead.watch(topic, max_retries=2))
    assert "connect" in type(caught.value).__name__.lower() or "refused" in str(caught.value)


def test_watch_of_a_missing_topic_raises_api_error(client: Client, topic) -> None:
    with pytest.raises(ApiError) as caught:
        next(client.watch(topic))
    assert caught.value.code == "topic_not_found"
