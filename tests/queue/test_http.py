"""Queues (docs/semantics/topics.md §10) over HTTP against a real ``waymark serve``: one test per
rule.

Time-driven rules are checked here with short real leases; their exact
boundaries are checked in-process with a manual clock (test_engine.py), and nack
delays and dead-letter retries over HTTP on a manual clock (test_http_clock.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson
import pytest

from .conftest import QueueHttp, error, ok

QUEUE_ROUTES = ("claim", "ack", "nack", "extend", "redrive")


def test_log_topics_answer_every_queue_route_with_not_a_queue(qhttp: QueueHttp, q: str) -> None:
    qhttp.put(q)
    qhttp.produce(q, 1)
    for action in QUEUE_ROUTES:
        body: dict[str, Any] = {"node": "w", "seqs": [1]} if action != "claim" else {"node": "w"}
        if action == "redrive":
            body = {}
        detail = error(qhttp.post(q, action, **body), 409, "not_a_queue")["detail"]
        assert detail == {"topic": q, "type": "log"}
    error(qhttp.http.get(f"/v0/topics/{q}/work", params={"node": "w"}), 409, "not_a_queue")
    assert qhttp.diff(q)["records"][0]["data"] == 1  # and nothing about the log changed


def test_missing_queue_is_404(qhttp: QueueHttp, q: str) -> None:
    error(qhttp.post(q, "claim", node="w"), 404, "topic_not_found")


def test_claim_returns_the_wire_record_with_its_lease(qhttp: QueueHttp, q: str) -> None:
    state = qhttp.queue(q, lease_ms=5000)
    assert state["type"] == "queue"
    assert state["queue"] == {
        "ready": 0,
        "in_flight": 0,
        "dead_lettered": 0,
        "dead_letter_parked": 0,
        "dead_letter_error": None,
        "earliest_lease_deadline": None,
    }
    assert state["config"]["lease_ms"] == 5000 and state["config"]["leases_durable"] is False
    ok(qhttp.post(q, "records", records=[{"data": {"n": 1}, "tag": "t", "meta": {"k": "v"}}]))
    before = int(time.time() * 1000)
    [job] = qhttp.claim(q, "w1", 5)
    record = qhttp.diff(q)["records"][0]
    assert {k: job[k] for k in record} == record  # the record exactly as a diff gives it
    assert job["delivery"] == 1 and isinstance(job["lease_id"], str) and job["lease_id"]
    assert before + 5000 <= job["deadline"] <= int(time.time() * 1000) + 5000
    assert qhttp.state(q)["queue"] == {
        "ready": 0,
        "in_flight": 1,
        "dead_lettered": 0,
        "dead_letter_parked": 0,
        "dead_letter_error": None,
        "earliest_lease_deadline": job["deadline"],
    }
    assert qhttp.claim(q, "w2", 5) == []  # a leased job is not claimable


def test_claim_lease_ms_overrides_the_queue_default(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q, lease_ms=60_000)
    qhttp.produce(q, 1)
    before = int(time.time() * 1000)
    [job] = qhttp.claim(q, "w", 1, lease_ms=1000)
    assert job["deadline"] <= int(time.time() * 1000) + 1000 and job["deadline"] >= before + 1000


def test_claims_hand_out_jobs_in_seq_order_by_the_claim_cursor(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    qhttp.produce(q, *range(10))
    first = qhttp.claim(q, "a", 3)
    second = qhttp.claim(q, "b", 3)
    assert [j["$seq"] for j in first] == [1, 2, 3]
    assert [j["$seq"] for j in second] == [4, 5, 6]


def test_ack_is_a_permanent_delete(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    qhttp.produce(q, "a", "b")
    jobs = qhttp.claim(q, "w", 2)
    answer = qhttp.settle(q, "ack", "w", [jobs[0]["$seq"]])
    assert answer == {"acked": [1], "skipped": []}
    assert [r["$seq"] for r in qhttp.diff(q)["records"]] == [2]
    state = qhttp.state(q)
    assert state["count"] == 1 and state["queue"]["in_flight"] == 1
    assert qhttp.settle(q, "ack", "w", [1]) == {"acked": [], "skipped": [1]}  # idempotent


def test_ack_from_a_node_that_does_not_hold_the_lease_is_skipped(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    qhttp.produce(q, "a")
    [job] = qhttp.claim(q, "owner")
    assert qhttp.settle(q, "ack", "thief", [job["$seq"]]) == {"acked": [], "skipped": [1]}
    assert qhttp.state(q)["count"] == 1


def test_a_stale_lease_id_is_fenced(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    qhttp.produce(q, "a")
    [first] = qhttp.claim(q, "w")
    qhttp.settle(q, "nack", "w", [1])
    [second] = qhttp.claim(q, "w")
    assert second["lease_id"] != first["lease_id"] and second["delivery"] == 2
    stale = qhttp.settle(q, "ack", "w", [1], lease_ids=[first["lease_id"]])
    assert stale == {"acked": [], "skipped": [1]}
    fresh = qhttp.settle(q, "ack", "w", [1], lease_ids=[second["lease_id"]])
    assert fresh == {"acked": [1], "skipped": []}


def test_lease_ids_must_pair_with_seqs(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    response = qhttp.post(q, "ack", node="w", seqs=[1, 2], lease_ids=["x"])
    error(response, 400, "invalid_request")


def test_ack_after_the_deadline_is_skipped_and_the_job_is_reclaimed(
    qhttp: QueueHttp, q: str
) -> None:
    qhttp.queue(q)
    qhttp.produce(q, "slow")
    [job] = qhttp.claim(q, "slow-worker", lease_ms=100)
    time.sleep(0.25)
    assert qhttp.settle(q, "ack", "slow-worker", [1])["skipped"] == [1]
    [again] = qhttp.claim(q, "other")
    assert again["$seq"] == job["$seq"] and again["delivery"] == 2


def test_extend_moves_the_deadline_and_keeps_the_delivery(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    qhttp.produce(q, "a")
    [job] = qhttp.claim(q, "w", lease_ms=300)
    answer = qhttp.settle(q, "extend", "w", [1], lease_ms=10_000)
    assert answer["extended"] == [1] and answer["skipped"] == []
    assert answer["deadlines"][0] >= job["deadline"] + 9000
    assert qhttp.settle(q, "extend", "other", [1])["skipped"] == [1]
    time.sleep(0.4)  # past the original deadline: still held
    assert qhttp.claim(q, "thief") == []
    assert qhttp.settle(q, "ack", "w", [1])["acked"] == [1]


def test_reclaimed_jobs_are_served_before_fresh_ones(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    qhttp.produce(q, *range(5))
    qhttp.claim(q, "w", 2, lease_ms=100)  # seqs 1, 2 expire
    time.sleep(0.2)
    jobs = qhttp.claim(q, "w", 3)
    assert [(j["$seq"], j["delivery"]) for j in jobs] == [(1, 2), (2, 2), (3, 1)]


def test_dead_letter_after_max_deliveries_with_provenance(qhttp: QueueHttp, q: str) -> None:
    dlq = f"{q}.dlq"
    qhttp.queue(q, max_deliveries=2, dead_letter=dlq)
    ok(qhttp.post(q, "records", records=[{"data": {"job": 1}, "tag": "poison", "node": "p"}]))
    for delivery in (1, 2):
        [job] = qhttp.claim(q, "w")
        assert job["delivery"] == delivery
        qhttp.settle(q, "nack", "w", [1])
    assert qhttp.claim(q, "w") == []  # the third delivery moves it instead
    state = qhttp.state(q)
    assert state["count"] == 0 and state["queue"]["dead_lettered"] == 1
    [letter] = qhttp.diff(dlq)["records"]
    assert letter["data"] == {"job": 1} and letter["$tag"] == "poison" and letter["$node"] == "p"
    assert letter["meta"] == {
        "$dead_letter_queue": q,
        "$dead_letter_seq": "1",
        "$dead_letter_deliveries": "2",
        "$dead_letter_reason": "max_deliveries",
    }


def test_without_a_dead_letter_topic_jobs_are_reclaimed_indefinitely(
    qhttp: QueueHttp, q: str
) -> None:
    qhttp.queue(q, max_deliveries=1)
    qhttp.produce(q, "x")
    for delivery in range(1, 5):
        [job] = qhttp.claim(q, "w")
        assert job["delivery"] == delivery
        qhttp.settle(q, "nack", "w", [1])


def test_redrive_moves_dead_letters_back(qhttp: QueueHttp, q: str) -> None:
    dlq = f"{q}.dlq"
    qhttp.queue(q, max_deliveries=1, dead_letter=dlq)
    qhttp.produce(q, "a", "b")
    qhttp.claim(q, "w", 2)
    qhttp.settle(q, "nack", "w", [1, 2])
    assert qhttp.claim(q, "w", 2) == []
    assert qhttp.state(dlq)["count"] == 2
    answer = ok(qhttp.post(q, "redrive"))
    assert answer == {"redriven": 2, "seqs": [3, 4]}
    assert qhttp.state(dlq)["count"] == 0
    jobs = qhttp.claim(q, "w", 2)
    assert [(j["data"], j["delivery"]) for j in jobs] == [("a", 1), ("b", 1)]
    assert all("meta" not in j for j in jobs)  # provenance goes with the dead letter


def test_a_queue_cannot_dead_letter_into_itself(qhttp: QueueHttp, q: str) -> None:
    error(qhttp.http.put(f"/v0/topics/{q}", json={"type": "queue", "dead_letter": q}),
          400, "invalid_request")  # fmt: skip


def test_bad_claims_are_refused(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    error(qhttp.post(q, "claim", node="w", max=0), 400, "invalid_request")
    error(qhttp.post(q, "claim", max=1), 400, "invalid_request")
    error(qhttp.post(q, "claim", node="w", lease_ms=0), 400, "invalid_request")
    error(qhttp.post(q, "nack", node="w", seqs=[1], delay_ms=-1), 400, "invalid_request")


def test_a_queue_stays_a_queue(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    error(qhttp.http.put(f"/v0/topics/{q}", json={"type": "log"}), 409,
          "topic_exists_incompatible")  # fmt: skip


def test_diff_reads_the_jobs_log_without_touching_leases(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    qhttp.produce(q, "a", "b")
    assert len(qhttp.diff(q)["records"]) == 2
    assert qhttp.state(q)["queue"] == {
        "ready": 2,
        "in_flight": 0,
        "dead_lettered": 0,
        "dead_letter_parked": 0,
        "dead_letter_error": None,
        "earliest_lease_deadline": None,
    }
    assert len(qhttp.claim(q, "w", 5)) == 2


def test_the_leases_log_is_internal(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    qhttp.produce(q, "a")
    qhttp.claim(q, "w")
    names = [t["name"] for t in ok(qhttp.http.get("/v0/topics"))["topics"]]
    assert q in names and not any("$" in n for n in names)
    for path in (f"/v0/topics/{q}%24leases", f"/v0/topics/{q}$leases"):
        error(qhttp.http.get(path), 400, "invalid_topic_name")
        error(qhttp.http.post(f"{path}/diff", json={"from_seq": 0}), 400, "invalid_topic_name")
        error(qhttp.http.post(f"{path}/records", json={"records": [{"data": 1}]}), 400,
              "invalid_topic_name")  # fmt: skip


def test_deleting_a_queue_forgets_its_leases(qhttp: QueueHttp, q: str) -> None:
    qhttp.queue(q)
    qhttp.produce(q, "a")
    qhttp.claim(q, "w", lease_ms=60_000)
    ok(qhttp.http.delete(f"/v0/topics/{q}"))
    qhttp.queue(q)
    qhttp.produce(q, "b")
    [job] = qhttp.claim(q, "w")
    assert job["data"] == "b" and job["delivery"] == 1


async def test_a_cohort_shares_the_jobs_evenly(waymark_server: Any, qhttp: QueueHttp, q: str
                                               ) -> None:  # fmt: skip
    qhttp.queue(q, claim_jitter_ms=300)
    qhttp.produce(q, *range(50))
    async with httpx.AsyncClient(base_url=waymark_server.url, timeout=10) as client:
        answers = await asyncio.gather(*(
            client.post(f"/v0/topics/{q}/claim", json={"node": f"w{i}", "max": 10})
            for i in range(10)
        ))  # fmt: skip
    counts = sorted(len(a.json()["jobs"]) for a in answers)
    assert counts == [5] * 10
    seqs = [j["$seq"] for a in answers for j in a.json()["jobs"]]
    assert sorted(seqs) == list(range(1, 51))


async def test_greedy_claims_drain_the_head(waymark_server: Any, qhttp: QueueHttp, q: str
                                            ) -> None:  # fmt: skip
    qhttp.queue(q)
    qhttp.produce(q, *range(50))
    async with httpx.AsyncClient(base_url=waymark_server.url, timeout=10) as client:
        answers = [await client.post(f"/v0/topics/{q}/claim", json={"node": f"w{i}", "max": 10})
                   for i in range(10)]  # fmt: skip
    assert [len(a.json()["jobs"]) for a in answers] == [10] * 5 + [0] * 5


def _sse_jobs(lines: list[str]) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in lines if line.startswith("data: ")]


def test_work_pushes_at_most_max_leases_then_more_after_acks(
    waymark_server: Any, qhttp: QueueHttp, q: str
) -> None:
    qhttp.queue(q)
    qhttp.produce(q, *range(5))
    params = {"node": "pushed", "max": "2"}
    with (
        httpx.Client(base_url=waymark_server.url, timeout=10) as client,
        client.stream("GET", f"/v0/topics/{q}/work", params=params) as stream,
    ):
        assert stream.headers["content-type"] == "text/event-stream"
        lines = stream.iter_lines()
        got: list[str] = []
        while len(_sse_jobs(got)) < 2:
            got.append(next(lines))
        first = _sse_jobs(got)
        assert [j["$seq"] for j in first] == [1, 2]
        assert all(j["delivery"] == 1 and j["lease_id"] for j in first)
        assert qhttp.state(q)["queue"]["in_flight"] == 2  # holds max, no more
        qhttp.settle(q, "ack", "pushed", [1])
        got = []
        while not _sse_jobs(got):
            got.append(next(lines))
        assert [j["$seq"] for j in _sse_jobs(got)] == [3]
    # A disconnected pushed worker's leases are released at once.
    deadline = time.monotonic() + 5
    while qhttp.state(q)["queue"]["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert qhttp.state(q)["queue"]["in_flight"] == 0
    assert sorted(j["$seq"] for j in qhttp.claim(q, "w", 5)) == [2, 3, 4, 5]


def test_openapi_and_metrics_know_the_queue_routes(qhttp: QueueHttp, q: str) -> None:
    paths = ok(qhttp.http.get("/v0/openapi.json"))["paths"]
    for action in (*QUEUE_ROUTES, "work"):
        assert f"/v0/topics/{{topic}}/{action}" in paths
    assert "409" in paths["/v0/topics/{topic}/claim"]["post"]["responses"]
    qhttp.queue(q)
    qhttp.produce(q, 1)
    qhttp.claim(q, "w")
    text = qhttp.http.get("/metrics").text
    claimed = [line for line in text.splitlines()
               if line.startswith("waymark_queue_jobs_claimed_total ")]  # fmt: skip
    assert claimed and float(claimed[0].split()[1]) >= 1
    assert 'route="/v0/topics/{topic}/claim"' in text


@pytest.mark.parametrize("durability", ["fsync", "disk"])
def test_ack_deletes_in_every_durability_class(qhttp: QueueHttp, q: str, durability: str) -> None:
    qhttp.queue(q, durability=durability)
    qhttp.produce(q, "a")
    qhttp.claim(q, "w")
    assert qhttp.settle(q, "ack", "w", [1])["acked"] == [1]
    assert qhttp.state(q)["count"] == 0


def _sse_streams(qhttp: QueueHttp) -> float:
    for line in qhttp.http.get("/metrics").text.splitlines():
        if line.startswith("waymark_sse_streams "):
            return float(line.split()[1])
    raise AssertionError("no waymark_sse_streams")


def test_an_idle_work_stream_gets_heartbeats_then_still_pushes(
    waymark_server: Any, qhttp: QueueHttp, q: str
) -> None:
    qhttp.queue(q)
    params = {"node": "idle"}
    with (
        httpx.Client(base_url=waymark_server.url, timeout=httpx.Timeout(10, read=5)) as client,
        client.stream("GET", f"/v0/topics/{q}/work", params=params) as stream,
    ):
        lines = stream.iter_lines()
        # The test server beats every 0.2 s: two beats, then a produced job arrives.
        beats = [line for line in (next(lines) for _ in range(4)) if line]
        assert beats == [": heartbeat"] * 2
        qhttp.produce(q, "after")
        got: list[str] = []
        while not _sse_jobs(got):
            got.append(next(lines))
    assert [j["data"] for j in _sse_jobs(got)] == ["after"]


def test_a_work_stream_whose_queue_is_deleted_ends_with_an_error_event_and_is_released(
    waymark_server: Any, qhttp: QueueHttp, q: str
) -> None:
    qhttp.queue(q)
    qhttp.produce(q, 1)
    base = _sse_streams(qhttp)
    with (
        httpx.Client(base_url=waymark_server.url, timeout=httpx.Timeout(10, read=5)) as client,
        client.stream("GET", f"/v0/topics/{q}/work", params={"node": "w"}) as stream,
    ):
        lines = stream.iter_lines()
        got: list[str] = []
        while not _sse_jobs(got):
            got.append(next(lines))
        assert _sse_streams(qhttp) == base + 1
        ok(qhttp.http.delete(f"/v0/topics/{q}"))
        # The head is sent, so the refusal comes in-band and the stream ends.
        rest = [line for line in lines if line]
    assert rest[0] == "event: error"
    assert orjson.loads(rest[1].removeprefix("data: "))["error"]["code"] == "topic_not_found"
    assert _sse_streams(qhttp) == base


def test_claims_dead_letters_and_redrive_are_not_consumption(qhttp: QueueHttp, q: str) -> None:
    # docs/semantics/topics.md §3: only a GET (with touch), a diff or an SSE read
    # consumes a topic. The server's own reads of the jobs log (claims) and of the
    # dead-letter topic (redrive) do not.
    dlq = f"{q}.dlq"
    qhttp.queue(q, max_deliveries=1, dead_letter=dlq)
    qhttp.produce(q, "a", "b")
    qhttp.claim(q, "w", 2)
    qhttp.settle(q, "nack", "w", [1, 2])
    assert qhttp.claim(q, "w", 2) == []  # both move to the dead-letter topic
    assert ok(qhttp.post(q, "redrive"))["redriven"] == 2
    assert len(qhttp.claim(q, "w", 2)) == 2
    assert qhttp.state(q)["last_read_ts"] == 0
    assert qhttp.state(dlq)["last_read_ts"] == 0
    qhttp.diff(q)  # a consumer's read does count
    assert qhttp.state(q)["last_read_ts"] > 0
