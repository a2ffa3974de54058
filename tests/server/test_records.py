"""Appends over HTTP (docs/semantics/topics.md §4, §1.1, §1.2): seq assignment, wire keys and
omission, size limits, lazy create, atomic writes, idempotent ids."""

from __future__ import annotations

import httpx
import orjson

MiB = 1 << 20


def test_seqs_start_at_one_and_are_contiguous_in_write_order(api, topic) -> None:
    first = api.append(topic, {"data": "a"}, {"data": "b"}, {"data": "c"})
    assert first["seqs"] == [1, 2, 3]
    assert first["head_seq"] == 3
    assert api.write(topic, "d", "e") == [4, 5]


def test_records_read_back_with_server_keys_and_omissions(api, topic) -> None:
    api.append(
        topic,
        {"data": {"url": "https://x", "attempts": 0}, "node": "worker-7",
         "tag": "render:tenantA:1", "meta": {"content-type": "application/json"}},
        {"data": None},
    )  # fmt: skip
    full, bare = api.diff(topic, 0)["records"]
    assert list(full) == ["$seq", "$ts", "$node", "$tag", "meta", "data"]
    assert full["$node"] == "worker-7" and full["$tag"] == "render:tenantA:1"
    assert full["meta"] == {"content-type": "application/json"}
    assert full["data"] == {"url": "https://x", "attempts": 0}
    # Absent $node/$tag/meta are omitted, not null; data is always present, even null.
    assert bare == {"$seq": 2, "$ts": bare["$ts"], "data": None}


def test_ts_is_server_wall_clock_and_non_decreasing_in_seq(api, topic) -> None:
    for _ in range(5):
        api.write(topic, 0)
    ts = [r["$ts"] for r in api.diff(topic, 0)["records"]]
    assert ts == sorted(ts)
    assert ts[0] > 1_700_000_000_000


def test_data_is_passed_through_verbatim(api, topic) -> None:
    values = [0, -1.5, 'ü\n"', [1, [2, {}]], {"nested": {"deep": [True, False]}}, True]
    api.write(topic, *values)
    assert [r["data"] for r in api.diff(topic, 0)["records"]] == values


def test_a_record_without_data_is_400(http, api, topic) -> None:
    api.error(api.post(topic, "records", records=[{"tag": "x"}]), 400, "invalid_request")
    api.error(api.post(topic, "records", records=[{"data": 1, "colour": "red"}]), 400,
              "invalid_request")  # fmt: skip
    api.error(api.post(topic, "records", records=[]), 400, "invalid_request")


def test_write_to_missing_topic_with_create_false_is_404(http, api, topic) -> None:
    response = api.post(topic, "records", records=[{"data": 1}], create=False)
    api.error(response, 404, "topic_not_found")
    assert http.get(f"/v0/topics/{topic}").status_code == 404


def test_lazy_create_applies_inline_config_only_when_creating(api, topic) -> None:
    api.append(topic, {"data": 1}, config={"cap_records": 5})
    assert api.state(topic)["config"]["cap_records"] == 5
    api.append(topic, {"data": 2}, config={"cap_records": 50})
    assert api.state(topic)["config"]["cap_records"] == 5


def test_a_refused_write_stores_nothing(api, topic) -> None:
    api.write(topic, "ok")
    response = api.post(topic, "records", records=[{"data": 1}, {"data": 2, "tag": "t" * 257}])
    api.error(response, 400, "tag_too_long")
    assert api.state(topic)["head_seq"] == 1
    # The next write still gets the next contiguous seq.
    assert api.write(topic, "next") == [2]


def test_a_refused_lazy_create_creates_nothing(http, api, topic) -> None:
    api.error(api.post(topic, "records", records=[{"data": 1, "node": "n" * 129}]), 400,
              "node_too_long")  # fmt: skip
    assert http.get(f"/v0/topics/{topic}").status_code == 404


def test_tag_and_node_limits_are_bytes(api, topic) -> None:
    assert api.append(topic, {"data": 1, "tag": "t" * 256, "node": "n" * 128})["seqs"] == [1]
    api.error(api.post(topic, "records", records=[{"data": 1, "tag": "é" * 129}]), 400,
              "tag_too_long")  # fmt: skip
    api.error(api.post(topic, "records", records=[{"data": 1, "node": "é" * 65}]), 400,
              "node_too_long")  # fmt: skip


def test_meta_limits(api, topic) -> None:
    many = {f"k{i}": "v" for i in range(65)}
    api.error(api.post(topic, "records", records=[{"data": 1, "meta": many}]), 400,
              "meta_too_large")  # fmt: skip
    big = {"k": "v" * (16 << 10)}
    api.error(api.post(topic, "records", records=[{"data": 1, "meta": big}]), 400,
              "meta_too_large")  # fmt: skip
    api.error(api.post(topic, "records", records=[{"data": 1, "meta": {"k": 1}}]), 400,
              "invalid_request")  # fmt: skip
    ok = {f"k{i}": "v" for i in range(64)}
    assert api.append(topic, {"data": 1, "meta": ok})["seqs"] == [1]


def test_data_plus_meta_over_one_mib_is_record_too_large(api, topic) -> None:
    error = api.error(api.post(topic, "records", records=[{"data": "x" * MiB}]), 400,
                      "record_too_large")  # fmt: skip
    assert error["detail"]["max_bytes"] == MiB
    # Exactly at the limit (the JSON string's quotes count) is accepted.
    assert api.append(topic, {"data": "x" * (MiB - 2)})["seqs"] == [1]


def post_raw(http: httpx.Client, topic: str, *datas: bytes, **config: object) -> httpx.Response:
    """Append records whose data is sent exactly as given (whitespace, escapes and all)."""
    records = b",".join(b'{"data": ' + data + b"}" for data in datas)
    head = b'{"config": ' + orjson.dumps(config) + b", " if config else b"{"
    body = head + b'"records": [' + records + b"]}"
    return http.post(
        f"/v0/topics/{topic}/records", content=body, headers={"content-type": "application/json"}
    )


def test_the_limit_and_bytes_count_canonical_bytes(http, api, topic) -> None:
    # Over 1 MiB as sent (padding, escapes), under it once canonical: whitespace goes,
    # "\u00e9" is the two bytes of "é", and every number keeps its exact digits.
    escaped = b'"' + b"\\u00e9" * 100_000 + b'"'
    spaced = b"[ " + escaped + b", " + b" " * MiB + b"18446744073709551617, 2.50 ]"
    assert len(spaced) > MiB
    canonical = b'["' + "é".encode() * 100_000 + b'",18446744073709551617,2.50]'
    response = post_raw(http, topic, spaced)
    assert response.status_code == 200, response.text
    [record] = api.diff(topic, 0)["records"]
    assert record["data"] == ["é" * 100_000, 18446744073709551617, 2.5]
    assert api.state(topic)["bytes"] == len(canonical)
    # Over 1 MiB once canonical: refused, and the detail counts canonical bytes.
    too_big = b'"' + b"x" * (MiB - 1) + b'"'
    error = api.error(post_raw(http, topic, b"\n  " + too_big + b"  \n"), 400, "record_too_large")
    assert error["detail"] == {"bytes": MiB + 1, "max_bytes": MiB}
    assert api.state(topic)["head_seq"] == 1  # nothing of the refused write is stored


def test_whitespace_counts_against_neither_bytes_nor_cap_bytes(http, api, topic) -> None:
    pretty = b'{\n  "user": "u 1",\n  "n": [1, 2, 3]\n}'
    size = len(b'{"user":"u 1","n":[1,2,3]}')
    config = {"cap_bytes": 3 * size, "discard": "reject"}
    response = post_raw(http, topic, pretty, pretty, pretty, **config)
    assert response.status_code == 200, response.text  # exactly the cap: it fits
    state = api.state(topic)
    assert (state["count"], state["bytes"]) == (3, 3 * size)
    api.error(post_raw(http, topic, b"1"), 422, "topic_full")
    data = [r["data"] for r in api.diff(topic, 0)["records"]]
    assert data == [{"user": "u 1", "n": [1, 2, 3]}] * 3


def test_more_than_ten_thousand_records_per_write_is_too_many_records(api, topic) -> None:
    response = api.post(topic, "records", records=[{"data": 0}] * 10_001)
    assert api.error(response, 400, "too_many_records")["detail"]["max_records"] == 10_000
    assert len(api.append(topic, *[{"data": 0}] * 10_000)["seqs"]) == 10_000


def test_body_over_64_mib_is_refused_from_content_length(http, topic) -> None:
    # The declared length decides after the first chunk: the rest is never read.
    response = http.post(
        f"/v0/topics/{topic}/records",
        content=b"x" * ((64 << 20) + 1),
        headers={"content-type": "application/json"},
    )
    body = response.json()["error"]
    assert response.status_code == 413
    assert body["code"] == "body_too_large"
    assert body["detail"]["max_bytes"] == 64 << 20


def test_body_over_64_mib_is_refused_while_streaming(http, topic) -> None:
    # No Content-Length (chunked): the limit is enforced as the body arrives.
    def chunks():
        piece = b" " * (1 << 20)
        for _ in range(65):
            yield piece

    response = http.post(
        f"/v0/topics/{topic}/records",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"


def test_body_under_the_limit_streams_in_fine(http, api, topic) -> None:
    def chunks():
        yield b'{"records": [{"data": '
        yield b'"' + b"y" * 100_000 + b'"'
        yield b"}]}"

    response = http.post(
        f"/v0/topics/{topic}/records",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert api.diff(topic, 0)["records"][0]["data"] == "y" * 100_000


def test_repeated_id_within_the_window_returns_the_original_seq(api, topic) -> None:
    first = api.append(topic, {"data": 1, "id": "job-1"}, {"data": 2})
    again = api.append(topic, {"data": 1, "id": "job-1"}, {"data": 3, "id": "job-2"})
    assert first["seqs"] == [1, 2]
    assert again["seqs"] == [1, 3]
    assert [r["data"] for r in api.diff(topic, 0)["records"]] == [1, 2, 3]


def test_idempotency_window_zero_disables_dedupe(api, topic) -> None:
    api.put(topic, 201, idempotency_window_ms=0)
    api.append(topic, {"data": 1, "id": "same"})
    assert api.append(topic, {"data": 1, "id": "same"})["seqs"] == [2]


def test_malformed_json_is_400_invalid_request(http: httpx.Client, api, topic) -> None:
    for body in (b"{", b"", b"nope", b'{"records": [{"data": }]}', b"\xff\xfe"):
        response = http.post(
            f"/v0/topics/{topic}/records",
            content=body,
            headers={"content-type": "application/json"},
        )
        error = api.error(response, 400, "invalid_request")
        assert "JSON" in error["message"] or "invalid" in error["message"]
