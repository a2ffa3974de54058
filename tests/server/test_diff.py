"""Diff over HTTP (docs/semantics/topics.md §4.3, §5, §6): cursors, node filter, caps and discard,
tombstones, recreated topics, deleted gaps, long-poll."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

DIFF_KEYS = {"records", "tombstone", "next_from_seq", "head_seq", "earliest_seq", "caught_up",
             "epoch", "durability"}  # fmt: skip


def seqs(page: dict) -> list[int]:
    return [r["$seq"] for r in page["records"]]


@pytest.fixture
def polls(waymark_server: Any, long_polls: Any) -> Any:
    return long_polls(waymark_server.url)


def test_cursor_is_an_exclusive_lower_bound(api, topic) -> None:
    api.write(topic, *range(5))
    page = api.diff(topic, 2)
    assert set(page) == DIFF_KEYS
    assert seqs(page) == [3, 4, 5]
    assert (page["next_from_seq"], page["head_seq"], page["caught_up"]) == (5, 5, True)
    assert page["tombstone"] is None


def test_from_seq_zero_reads_from_the_beginning_of_what_is_retained(api, topic) -> None:
    api.write(topic, *range(3))
    assert seqs(api.diff(topic, 0)) == [1, 2, 3]


def test_limit_pages_and_next_from_seq_continues(api, topic) -> None:
    api.write(topic, *range(7))
    first = api.diff(topic, 0, limit=3)
    assert seqs(first) == [1, 2, 3]
    assert (first["next_from_seq"], first["caught_up"]) == (3, False)
    second = api.diff(topic, first["next_from_seq"], limit=3)
    assert seqs(second) == [4, 5, 6]
    last = api.diff(topic, second["next_from_seq"], limit=3)
    assert seqs(last) == [7] and last["caught_up"]


def test_diff_of_a_missing_topic_is_404(api, topic) -> None:
    api.error(api.post(topic, "diff", from_seq=0), 404, "topic_not_found")


def test_diff_request_validation(api, topic) -> None:
    api.write(topic, 1)
    for body in ({}, {"from_seq": -1}, {"from_seq": 0, "limit": 0},
                 {"from_seq": 0, "limit": 10_001}, {"from_seq": 0, "wait_ms": -1},
                 {"from_seq": 0, "wait_ms": 60_001}, {"from_seq": 0, "node": 5},
                 {"from_seq": 0, "extra": 1}, {"from_seq": "0"}):  # fmt: skip
        api.error(api.post(topic, "diff", **body), 400, "invalid_request")


def test_node_filter_drops_own_records_silently(api, topic) -> None:
    api.append(topic, {"data": 1, "node": "a"}, {"data": 2, "node": "b"}, {"data": 3},
               {"data": 4, "node": "a"})  # fmt: skip
    page = api.diff(topic, 0, node="a")
    assert seqs(page) == [2, 3]
    assert page["tombstone"] is None
    assert page["next_from_seq"] == 4  # the cursor still advances past the dropped seqs


def test_node_filter_takes_a_set_and_matches_exactly(api, topic) -> None:
    api.append(topic, {"data": 1, "node": "a"}, {"data": 2, "node": "b"},
               {"data": 3, "node": "ab"}, {"data": 4, "node": "c"})  # fmt: skip
    assert seqs(api.diff(topic, 0, node=["a", "b"])) == [3, 4]


def test_a_fully_filtered_page_is_empty_but_advances(api, topic) -> None:
    api.append(topic, *[{"data": i, "node": "me"} for i in range(5)], {"data": "other"})
    page = api.diff(topic, 0, node="me", limit=5)
    assert page["records"] == [] and page["tombstone"] is None
    assert (page["next_from_seq"], page["caught_up"]) == (5, False)
    assert seqs(api.diff(topic, page["next_from_seq"], node="me")) == [6]


def test_dedupe_node_false_disables_the_filter(api, topic) -> None:
    api.put(topic, 201, dedupe_node=False)
    api.append(topic, {"data": 1, "node": "a"})
    assert seqs(api.diff(topic, 0, node="a")) == [1]


def test_cap_records_evicts_oldest_with_a_cap_tombstone(api, topic) -> None:
    api.put(topic, 201, cap_records=3)
    for i in range(5):
        api.write(topic, i)
    state = api.state(topic)
    assert (state["earliest_seq"], state["evict_floor"], state["count"]) == (3, 3, 3)
    page = api.diff(topic, 0)
    assert page["tombstone"] == {
        "$type": "tombstone", "$seq": 3, "gap_from": 1, "gap_to": 2, "reason": "cap",
        "missed_estimate": 2, "earliest_seq": 3, "head_seq": 5,
    }  # fmt: skip
    assert seqs(page) == [3, 4, 5]


def test_no_tombstone_when_the_cursor_is_past_the_evicted_range(api, topic) -> None:
    api.put(topic, 201, cap_records=3)
    for i in range(5):
        api.write(topic, i)
    # from_seq + 1 == evict_floor: nothing below the cursor was lost.
    page = api.diff(topic, 2)
    assert page["tombstone"] is None and seqs(page) == [3, 4, 5]
    assert api.diff(topic, 1)["tombstone"]["gap_from"] == 2


def test_cap_bytes_evicts_by_size(api, topic) -> None:
    api.put(topic, 201, cap_bytes=10)
    for data in ("aaaa", "bbbb", "cccc"):  # 6 bytes each with the quotes
        api.write(topic, data)
    page = api.diff(topic, 0)
    assert page["tombstone"]["reason"] == "cap"
    assert seqs(page) == [3]


def test_discard_reject_refuses_with_422_topic_full(api, topic) -> None:
    api.put(topic, 201, cap_records=2, discard="reject")
    api.write(topic, 1, 2)
    error = api.error(api.post(topic, "records", records=[{"data": 3}]), 422, "topic_full")
    assert error["detail"] == {"cap_records": 2, "cap_bytes": 0, "head_seq": 2, "earliest_seq": 1}
    assert api.state(topic)["head_seq"] == 2  # no seq was assigned
    api.delete(topic, before_seq=2)  # a consumer drains: retryable (the deletion takes 3)
    assert api.write(topic, 3) == [4]


def test_a_write_larger_than_the_whole_cap_is_400_record_too_large(api, topic) -> None:
    api.put(topic, 201, cap_records=2, discard="reject")
    api.error(api.post(topic, "records", records=[{"data": 0}] * 3), 400, "record_too_large")
    api.put(f"{topic}-b", 201, cap_bytes=4, discard="reject")
    api.error(api.post(f"{topic}-b", "records", records=[{"data": "xxxx"}]), 400,
              "record_too_large")  # fmt: skip


def test_a_purely_deleted_gap_reads_silently(api, topic) -> None:
    api.write(topic, *range(5))
    api.delete(topic, before_seq=4)
    state = api.state(topic)
    assert state["earliest_seq"] == 4 and state["evict_floor"] == 1
    page = api.diff(topic, 0)
    assert page["tombstone"] is None
    assert seqs(page) == [4, 5]


def test_recreated_topic_tombstone_from_a_stale_epoch(http, api, topic) -> None:
    api.write(topic, *range(10))
    old = api.diff(topic, 0)
    http.delete(f"/v0/topics/{topic}")
    api.write(topic, "x", "y")
    page = api.diff(topic, old["next_from_seq"], epoch=old["epoch"])
    tomb = page["tombstone"]
    assert tomb["reason"] == "recreated"
    assert (tomb["gap_from"], tomb["gap_to"], tomb["$seq"]) == (1, 2, 1)
    assert page["epoch"] > old["epoch"]
    assert [r["data"] for r in page["records"]] == ["x", "y"]


def test_recreated_is_detected_without_an_epoch_when_the_cursor_is_ahead(http, api, topic) -> None:
    api.write(topic, *range(10))
    http.delete(f"/v0/topics/{topic}")
    api.write(topic, "x")
    page = api.diff(topic, 10)
    assert page["tombstone"]["reason"] == "recreated"
    assert seqs(page) == [1]


def test_a_current_epoch_is_not_a_recreate(api, topic) -> None:
    api.write(topic, 1, 2)
    epoch = api.state(topic)["epoch"]
    page = api.diff(topic, 1, epoch=epoch)
    assert page["tombstone"] is None and seqs(page) == [2]


def test_wait_ms_long_polls_until_a_record_arrives(api, topic, polls) -> None:
    api.write(topic, "first")
    waiting = polls.count()
    with ThreadPoolExecutor(1) as pool:
        poll = pool.submit(api.diff, topic, 1, wait_ms=10_000)
        polls.wait_for(waiting + 1)  # the poll found nothing and waits on the server
        assert not poll.done()
        api.write(topic, "late")
        page = poll.result(timeout=10)
    assert [r["data"] for r in page["records"]] == ["late"]


def test_wait_ms_returns_empty_when_nothing_arrives(api, topic) -> None:
    api.write(topic, 1)
    start = time.monotonic()
    page = api.diff(topic, 1, wait_ms=300)
    assert 0.29 < time.monotonic() - start < 3
    assert page["records"] == [] and page["caught_up"]


def test_wait_ms_ignores_own_node_records_and_keeps_waiting(api, topic, polls) -> None:
    api.write(topic, 0)
    waiting = polls.count()
    with ThreadPoolExecutor(1) as pool:
        poll = pool.submit(api.diff, topic, 1, wait_ms=10_000, node="me")
        polls.wait_for(waiting + 1)
        api.append(topic, {"data": "mine", "node": "me"})  # wakes it: nothing for it, it waits on
        api.append(topic, {"data": "theirs", "node": "you"})
        page = poll.result(timeout=10)
    assert [r["data"] for r in page["records"]] == ["theirs"]
    assert page["next_from_seq"] == 3


def test_wait_ms_returns_at_once_when_records_are_there(api, topic) -> None:
    api.write(topic, 1)
    start = time.monotonic()
    assert seqs(api.diff(topic, 0, wait_ms=10_000)) == [1]
    assert time.monotonic() - start < 1


def test_many_long_polls_wake_together(api, topic, polls) -> None:
    api.write(topic, 0)
    waiting = polls.count()
    with ThreadPoolExecutor(5) as pool:
        pollers = [pool.submit(api.diff, topic, 1, wait_ms=10_000) for _ in range(5)]
        polls.wait_for(waiting + 5)  # all five wait on the server; one commit wakes them
        api.write(topic, 1)
        results = [seqs(p.result(timeout=10)) for p in pollers]
    assert results == [[2]] * 5
