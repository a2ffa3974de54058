"""Poison records (docs/semantics/topics.md §1.2): data a reader could not decode is
refused at the door, by a real server, with the index of the record at fault; and a
job's data moves to its dead-letter topic and back byte for byte."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from waymark.client import Client, ConfigPatch, TopicType

POISON = [
    pytest.param(b"1e400", id="infinite-exponent"),
    pytest.param(b"-1E999", id="negative-infinite"),
    pytest.param(b"9" * 100_000, id="100k-digit-integer"),
    pytest.param(b'"\xff\xfe"', id="invalid-utf8"),
    # (the body decoder already refuses a lone surrogate: 400 invalid_request, no index)
    pytest.param(b'{"a": [1, 2e400]}', id="nested-infinite"),
]


@pytest.fixture(scope="module")
def http(waymark_server: Any) -> httpx.Client:
    with httpx.Client(base_url=waymark_server.url, timeout=10) as client:
        yield client


@pytest.mark.parametrize("poison", POISON)
def test_a_poison_record_is_refused_naming_its_index_and_nothing_is_stored(
    http: httpx.Client, waymark_server: Any, poison: bytes, request: pytest.FixtureRequest
) -> None:
    topic = f"poison-{request.node.callspec.id}"
    assert http.post(f"/v0/topics/{topic}/records", json={"records": [{"data": 0}]}).is_success
    body = b'{"records":[{"data":1},{"data":' + poison + b'},{"data":3}]}'
    answer = http.post(f"/v0/topics/{topic}/records", content=body,
                       headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_record" and error["detail"]["index"] == 1, error
    assert "record 1" in error["message"]
    with Client(waymark_server.url) as client:  # the shipped client still reads the topic
        page = client.diff(topic, 0)
        assert [r.data for r in page.records] == [0] and page.head_seq == 1


def test_a_poison_record_deep_in_a_large_write_is_named_by_its_index(
    http: httpx.Client,
) -> None:
    """A write with over 1 MiB of data is checked a slice of records at a time (one C
    call over 50 MB held the GIL, and every other client's requests, for a fifth of a
    second; docs/security.md, Limits): the refusal still names the record's index in
    the whole write, and stores nothing of it."""
    good = b'{"data":{"k":"%b"}}' % (b"x" * 5_000)
    records = [good] * 1_000
    records[700] = b'{"data":{"k":1e400}}'
    body = b'{"records":[' + b",".join(records) + b"]}"
    answer = http.post("/v0/topics/poison-large/records", content=body,
                       headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_record" and error["detail"]["index"] == 700, error
    assert http.get("/v0/topics/poison-large").status_code == 404  # nothing stored
    records[700] = good
    body = b'{"records":[' + b",".join(records) + b"]}"
    answer = http.post("/v0/topics/poison-large/records", content=body,
                       headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 200 and answer.json()["seqs"] == list(range(1, 1_001))
    page = http.post("/v0/topics/poison-large/diff", json={"from_seq": 699, "limit": 2})
    assert [r["$seq"] for r in page.json()["records"]] == [700, 701]


def test_data_that_is_merely_unusual_is_kept_byte_for_byte(
    http: httpx.Client, waymark_server: Any
) -> None:
    """Big but finite numbers, escapes and non-ASCII text are valid: stored as sent."""
    data = [b"18446744073709551617", b"1e308", b"1" + b"0" * 308, b'"\\u00e9\\n\xc3\xa9"',
            b'"550e8400-e29b-41d4"', b"0.1000000000000000000001"]  # fmt: skip
    body = b'{"records":[' + b",".join(b'{"data":%b}' % d for d in data) + b"]}"
    answer = http.post("/v0/topics/unusual/records", content=body,
                       headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    raw = http.post("/v0/topics/unusual/diff", json={"from_seq": 0}).content
    for stored in (data[0], data[1], data[2], data[5]):  # the numbers, as sent
        assert b'"data":' + stored + b"}" in raw
    with Client(waymark_server.url) as client:
        assert len(client.diff("unusual", 0).records) == len(data)


def test_dead_letters_and_redrive_keep_the_job_s_bytes(waymark_server: Any) -> None:
    """Dead-lettering decoded the job and encoded it again: 2**64+1 came back as
    1.8446744073709552e+19 (and data a reader cannot decode failed the claim pass)."""
    queue, dlq = "poison-jobs", "poison-jobs.dlq"
    big = b"18446744073709551617"
    with Client(waymark_server.url) as client:
        client.put_topic(queue, ConfigPatch(max_deliveries=1, dead_letter=dlq),
                         type=TopicType.QUEUE)  # fmt: skip
        body = b'{"records":[{"data":{"n":%b},"tag":"t","meta":{"k":"v"}}]}' % big
        assert httpx.post(f"{waymark_server.url}/v0/topics/{queue}/records", content=body,
                          headers={"content-type": "application/json"}).is_success  # fmt: skip
        [job] = client.claim(queue, "w", 1)
        client.nack(queue, "w", [job.seq])
        assert client.claim(queue, "w", 1) == []  # its second delivery is a dead letter
        letters = httpx.post(f"{waymark_server.url}/v0/topics/{dlq}/diff",
                             json={"from_seq": 0}).content  # fmt: skip
        assert b'"data":{"n":%b}' % big in letters
        redriven = client.redrive(queue).seqs
        assert len(redriven) == 1
        again = httpx.post(f"{waymark_server.url}/v0/topics/{queue}/diff",
                           json={"from_seq": redriven[0] - 1}).content  # fmt: skip
        assert b'"data":{"n":%b}' % big in again
        assert b'"$tag":"t"' in again and b'"meta":{"k":"v"}' in again
        [back] = client.claim(queue, "w", 1)
        assert back.seq == redriven[0]


def test_a_lone_surrogate_escape_is_refused_by_the_body_decoder(http: httpx.Client) -> None:
    body = b'{"records":[{"data":"\\ud800"}]}'
    answer = http.post("/v0/topics/surrogate/records", content=body,
                       headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_request"
    assert http.get("/v0/topics/surrogate").status_code == 404  # not even created


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(b'{"data":1,"tag":"\xff"}', id="tag-invalid-utf8"),
        pytest.param(b'{"data":1,"meta":{"k":"\xc3"}}', id="meta-invalid-utf8"),
        pytest.param(b'{"data":' + b"[" * 100_000 + b"]" * 100_000 + b"}", id="deep-nesting"),
        pytest.param(b'{"data":1,"id":"' + b"i" * (1 << 20) + b'"}', id="1-MiB-id"),
    ],
)
def test_hostile_fields_are_400_not_500_and_store_nothing(
    http: httpx.Client, record: bytes, request: pytest.FixtureRequest
) -> None:
    """Invalid UTF-8 in a tag or meta value and deep nesting escaped the body decoder's
    refusals as a 500; an idempotency id had no length limit (a 1 MiB id was kept for
    the whole duplicate window)."""
    topic = f"hostile-{request.node.callspec.id}"
    answer = http.post(f"/v0/topics/{topic}/records", content=b'{"records":[%b]}' % record,
                       headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"
    assert http.get(f"/v0/topics/{topic}").status_code == 404
    assert http.get("/v0/health").status_code == 200


FORGED = [
    pytest.param([{"$dead_letter_queue": "victim"}], id="first-record"),
    pytest.param([{"k": "v"}, None, {"a": "1", "$dead_letter_seq": "1"}], id="later-key"),
    pytest.param([{"$": "x"}], id="dollar-alone"),
]


@pytest.mark.parametrize("metas", FORGED)
@pytest.mark.parametrize("route", ["records", "stage"])
def test_server_meta_cannot_be_forged(http: httpx.Client, route: str,
                                      metas: list[dict[str, str] | None],
                                      request: pytest.FixtureRequest) -> None:  # fmt: skip
    """A token that can write a dead-letter topic forged a letter naming another queue,
    which that queue's redrive then moved in: producer meta keys may not start with $,
    in any record of an append or of a writer's staged chunk."""
    topic = f"forged-{request.node.callspec.id}.dlq"
    records = [{"data": n, **({"meta": m} if m else {})} for n, m in enumerate(metas)]
    body: dict[str, Any] = {"records": records}
    if route == "stage":
        body |= {"writer": "w", "epoch": 1, "batch_id": 0, "partition": 0, "attempt": 0}
    answer = http.post(f"/v0/topics/{topic}/{route}", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["index"] == len(metas) - 1
    assert http.get(f"/v0/topics/{topic}").status_code == 404


def test_server_meta_is_refused_in_a_body_decoded_in_pieces(http: httpx.Client) -> None:
    """A body over 2 MiB is decoded a piece at a time (docs/security.md, Large bodies):
    the meta rule holds for it as for a small one."""
    records: list[dict[str, Any]] = [{"data": "x" * 400} for _ in range(8_000)]
    records[6_000]["meta"] = {"$dead_letter_queue": "victim"}
    answer = http.post("/v0/topics/forged-large.dlq/records", json={"records": records})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["index"] == 6_000
    assert http.get("/v0/topics/forged-large.dlq").status_code == 404


def test_a_meta_key_may_hold_a_dollar_after_its_first_character(http: httpx.Client) -> None:
    """Only a leading $ is the server's: the check's scan of the joined keys sees
    "\0$" inside this key and must not refuse it."""
    meta = {"a$": "1", "b\u0000$c": "2"}
    assert http.post("/v0/topics/dollars/records",
                     json={"records": [{"data": 1, "meta": meta}]}).is_success  # fmt: skip
    (record,) = http.post("/v0/topics/dollars/diff", json={"from_seq": 0}).json()["records"]
    assert record["meta"] == meta
