"""Topics over HTTP (docs/semantics/topics.md §2, §3): naming, upsert, state, config defaults and
durability, delete and the per-instance epoch, effective priority."""

from __future__ import annotations

import httpx

STATE_KEYS = {
    "name", "type", "epoch", "head_seq", "assigned_head_seq", "earliest_seq", "evict_floor",
    "next_seq", "count", "bytes", "config", "durability", "fsync_ms", "effective_priority",
    "created_ts", "last_write_ts", "last_read_ts",
}  # fmt: skip
DEFAULT_CONFIG = {
    "ttl_ms": 0, "cap_records": 0, "cap_bytes": 0, "discard": "old", "durable": False,
    "durability": "disk", "priority": None, "auto_priority": True, "auto_create": True,
    "idempotency_window_ms": 120_000, "dedupe_node": True,
}  # fmt: skip


def test_health_is_ok_when_ready(http: httpx.Client) -> None:
    response = http.get("/v0/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_put_creates_with_201_then_updates_with_200(api, topic) -> None:
    created = api.put(topic, 201, cap_records=10)
    assert created["config"]["cap_records"] == 10
    updated = api.put(topic, 200, ttl_ms=5000)
    # Upsert: fields not named keep their value.
    assert updated["config"] == {**DEFAULT_CONFIG, "cap_records": 10, "ttl_ms": 5000}
    assert updated["epoch"] == created["epoch"]


def test_put_with_an_empty_body_creates_with_defaults(http, topic) -> None:
    response = http.put(f"/v0/topics/{topic}")
    assert response.status_code == 201
    assert response.json()["config"] == DEFAULT_CONFIG


def test_put_with_a_blank_body_is_invalid_json_and_creates_nothing(http, topic) -> None:
    # Only an empty body means "the defaults"; whitespace is a body, and not JSON.
    response = http.put(
        f"/v0/topics/{topic}", content=b"\r\n", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_request"
    assert http.get(f"/v0/topics/{topic}").status_code == 404


def test_state_has_every_field_of_2_3_and_empty_watermarks(api, topic) -> None:
    state = api.put(topic, 201)
    assert set(state) == STATE_KEYS
    assert state["name"] == topic and state["type"] == "log"
    # Never written: head_seq 0, earliest_seq = head_seq + 1, next_seq = seq_base.
    assert (state["head_seq"], state["earliest_seq"], state["next_seq"]) == (0, 1, 1)
    assert (state["count"], state["bytes"]) == (0, 0)


def test_state_counts_live_records_and_bytes(api, topic) -> None:
    api.write(topic, "ab", 12)
    state = api.state(topic)
    assert (state["head_seq"], state["earliest_seq"], state["next_seq"]) == (2, 1, 3)
    assert state["count"] == 2
    assert state["bytes"] == len(b'"ab"') + len(b"12")
    assert state["last_write_ts"] > 0


def test_get_with_touch_false_does_not_count_as_consumption(api, topic) -> None:
    api.write(topic, 1)
    assert api.state(topic, touch="false")["last_read_ts"] == 0
    assert api.state(topic)["last_read_ts"] > 0


def test_bad_touch_value_is_400(http, api, topic) -> None:
    api.write(topic, 1)
    api.error(http.get(f"/v0/topics/{topic}", params={"touch": "maybe"}), 400, "invalid_request")


def test_list_topics_is_sorted_by_name(api, http, topic) -> None:
    for suffix in ("b", "a", "c"):
        api.put(f"{topic}-{suffix}", 201)
    names = [t["name"] for t in http.get("/v0/topics").json()["topics"]]
    assert names == sorted(names)
    assert {f"{topic}-a", f"{topic}-b", f"{topic}-c"} <= set(names)


def test_topic_names_follow_the_naming_rule(http, api, topic) -> None:
    unique = topic.rsplit("-", 1)[1]  # the session's server is shared: names of our own
    edges = [
        "a", "Z", "7",  # one character (shared with other runs: only round-trips are checked)
        f"render-queue:tenantA.{unique}", f"x.y_z-1:{unique}", f"{unique}-",
        unique + "._:-" * 61 + "z" * (255 - len(unique) - 244),  # 255 characters
    ]  # fmt: skip
    for good in edges:
        assert len(good) <= 255
        assert http.put(f"/v0/topics/{good}", json={}).status_code in (200, 201)
        # The name round-trips: the state, the list and the records are under it, exactly.
        [seq] = api.write(good, good)
        state = api.state(good)
        assert state["name"] == good and state["head_seq"] == seq
        assert api.diff(good, seq - 1)["records"][0]["data"] == good
        assert good in {t["name"] for t in http.get("/v0/topics").json()["topics"]}
    for bad in ("-a", ".a", "_a", ":a", "a b", "ü", "a" * 256, "a%2Fb", "a%0A"):
        api.error(http.put(f"/v0/topics/{bad}", json={}), 400, "invalid_topic_name")
        api.error(http.get(f"/v0/topics/{bad}"), 400, "invalid_topic_name")
    api.error(http.post("/v0/topics/-x/records", json={"records": [{"data": 1}]}), 400,
              "invalid_topic_name")  # fmt: skip


def test_names_are_case_sensitive(api, topic) -> None:
    api.write(topic, 1)
    api.write(topic.upper(), 1, 2)
    assert api.state(topic)["head_seq"] == 1
    assert api.state(topic.upper())["head_seq"] == 2


def test_durability_resolves_from_durable_unless_explicit(api, topic) -> None:
    assert api.put(f"{topic}-a", 201, durable=True)["durability"] == "fsync"
    assert api.put(f"{topic}-b", 201, durable=False)["durability"] == "disk"
    explicit = api.put(f"{topic}-c", 201, durable=True, durability="memory")
    assert explicit["durability"] == "memory"
    # durable is normalised to "the class is fsync".
    assert explicit["config"]["durable"] is False
    for durability in ("ephemeral", "memory", "disk", "fsync"):
        state = api.put(f"{topic}-{durability}", 201, durability=durability)
        assert state["durability"] == state["config"]["durability"] == durability
        assert state["config"]["durable"] is (durability == "fsync")


def test_append_reports_the_resolved_durability(api, topic) -> None:
    api.put(topic, 201, durability="ephemeral")
    assert api.append(topic, {"data": 1})["durability"] == "ephemeral"


def test_type_is_immutable(http, api, topic) -> None:
    assert api.put(topic, 201, type="queue")["type"] == "queue"
    error = api.error(http.put(f"/v0/topics/{topic}", json={"type": "log"}), 409,
                      "topic_exists_incompatible")  # fmt: skip
    assert error["detail"]["type"] == "queue"


def test_unknown_and_mistyped_config_fields_are_400(http, topic) -> None:
    for body in ({"ttl": 5}, {"ttl_ms": -1}, {"discard": "maybe"}, {"durability": "tape"},
                 {"type": "stream"}, {"cap_records": "10"}, [1]):  # fmt: skip
        response = http.put(f"/v0/topics/{topic}", json=body)
        assert response.status_code == 400, body
        assert response.json()["error"]["code"] == "invalid_request"
    assert http.get(f"/v0/topics/{topic}").status_code == 404


def test_delete_topic_tears_it_down(http, api, topic) -> None:
    api.write(topic, 1, 2)
    response = http.delete(f"/v0/topics/{topic}")
    assert response.status_code == 200
    assert response.json() == {"topic": topic, "deleted": True}
    api.error(http.get(f"/v0/topics/{topic}"), 404, "topic_not_found")
    api.error(http.delete(f"/v0/topics/{topic}"), 404, "topic_not_found")


def test_recreate_restarts_seq_and_bumps_the_epoch(http, api, topic) -> None:
    api.write(topic, 1, 2, 3)
    epoch = api.state(topic)["epoch"]
    http.delete(f"/v0/topics/{topic}")
    assert api.write(topic, "new") == [1]
    state = api.state(topic)
    assert state["epoch"] > epoch
    assert state["head_seq"] == 1


def test_effective_priority_reports_manual_and_recency(api, topic) -> None:
    api.put(topic, 201, priority=1000, auto_priority=False)
    assert api.state(topic)["effective_priority"] == 1000
    api.put(topic, 200, priority=-5000)  # clamped to [-1000, 1000]
    assert api.state(topic)["effective_priority"] == -1000
    api.put(topic, 200, priority=None, auto_priority=True)
    # Just consumed: the auto term is at its maximum, AUTO_MAX = 500.
    api.state(topic)
    assert api.state(topic)["effective_priority"] == 500


def test_topics_are_listed_a_page_at_a_time(tmp_path, spawn_server) -> None:
    """10k topics made one listing a second of the event loop's time: the list is paged
    by name, and the client and the console read the pages one after another."""
    from waymark.client import Client, RecordIn

    server = spawn_server(tmp_path / "data")
    names = sorted(f"paged-{i:03}" for i in range(25))
    with Client(server.url) as client:
        for name in names:
            client.append(name, [RecordIn.of(1)])
        seen, after, pages = [], None, 0
        while True:
            page = client.list_topics_page(after=after, limit=10)
            assert len(page.topics) <= 10
            seen += [t.name for t in page.topics]
            pages += 1
            if page.next_after is None:
                break
            after = page.next_after
        assert seen == names and pages == 3
        assert [t.name for t in client.list_topics()] == names
        first = httpx.get(f"{server.url}/v0/topics").json()
        assert len(first["topics"]) == 25 and first["next_after"] is None  # default page 1000
        for bad in ("0", "10001", "-1", "x"):
            answer = httpx.get(f"{server.url}/v0/topics", params={"limit": bad})
            assert answer.status_code == 400, bad
            assert answer.json()["error"]["code"] == "invalid_request"
