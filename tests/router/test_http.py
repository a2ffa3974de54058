"""Routers (docs/semantics/topics.md §8) over HTTP against a real ``waymark serve``: one test per
rule. Forwarding runs after the source's ack, so tests wait (bounded) for copies to appear."""

from __future__ import annotations

from collections.abc import Callable

from waymark.log.router import HOP_CAP

from .conftest import RouterHttp, error, eventually, ok


def test_put_get_list_delete(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    body = {"source": n("a"), "dest": n("b")}
    made = ok(rhttp.put_router(n("r"), **body), 201)
    assert made["source"] == n("a") and made["dest"] == n("b")
    assert made["guarantee"] == "at_least_once" and made["preserve_node"] is True
    assert ok(rhttp.put_router(n("r"), **body), 200) == made  # identical PUT: unchanged
    assert ok(rhttp.http.get(f"/v0/routers/{n('r')}"))["name"] == n("r")
    listed = ok(rhttp.http.get("/v0/routers"))["routers"]
    assert n("r") in [r["name"] for r in listed]
    ok(rhttp.http.get(f"/v0/topics/{n('b')}"))  # both endpoints were created lazily
    assert ok(rhttp.http.delete(f"/v0/routers/{n('r')}")) == {"router": n("r"), "deleted": True}
    error(rhttp.http.get(f"/v0/routers/{n('r')}"), 404, "router_not_found")


def test_forwarding_copies_in_source_order(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    ok(rhttp.put_router(n("r"), source=n("a"), dest=n("b")), 201)
    rhttp.produce(n("b"), "direct")
    for start in range(0, 300, 100):
        rhttp.produce(n("a"), *range(start, start + 100), node="n1", tag="t")
    eventually(lambda: len(rhttp.records(n("b"))) == 301)
    copies = rhttp.records(n("b"))[1:]
    assert [c["data"] for c in copies] == list(range(300))
    assert [c["$seq"] for c in copies] == list(range(2, 302))  # dest's own seqs
    assert {(c["$node"], c["$tag"]) for c in copies} == {("n1", "t")}


def test_create_dest_false_needs_both_topics(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    response = rhttp.put_router(n("r"), source=n("a"), dest=n("b"), create_dest=False)
    assert error(response, 404, "topic_not_found")["detail"] == {"topic": n("a")}


def test_fan_in_and_cycles_are_409(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    ok(rhttp.put_router(n("ab"), source=n("a"), dest=n("b")), 201)
    fan_in = error(rhttp.put_router(n("cb"), source=n("c"), dest=n("b")), 409,
                   "topic_exists_incompatible")  # fmt: skip
    assert fan_in["detail"]["reason"] == "router_dest_fan_in"
    cycle = error(rhttp.put_router(n("ba"), source=n("b"), dest=n("a")), 409, "router_cycle")
    assert cycle["detail"]["cycle"] == [n("b"), n("a"), n("b")]
    ok(rhttp.put_router(n("ba"), source=n("b"), dest=n("a"), allow_cycle=True), 201)


def test_allow_cycle_forwarding_terminates(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    ok(rhttp.put_router(n("ab"), source=n("a"), dest=n("b"), allow_cycle=True), 201)
    ok(rhttp.put_router(n("ba"), source=n("b"), dest=n("a"), allow_cycle=True), 201)
    rhttp.produce(n("a"), "x")

    def settled() -> bool:
        routers = {r["name"]: r for r in ok(rhttp.http.get("/v0/routers"))["routers"]}
        heads = [ok(rhttp.http.get(f"/v0/topics/{n(t)}"))["head_seq"] for t in "ab"]
        return [routers[n("ab")]["cursor"], routers[n("ba")]["cursor"]] == heads

    eventually(settled)
    total = len(rhttp.data(n("a"))) + len(rhttp.data(n("b")))
    assert 1 < total < 20  # it bounced, then the hop cap stopped it


def settle_cycle(rhttp: RouterHttp, topics: list[str], appended: int) -> int:
    """Wait until every router has forwarded its source's head; the records in
    ``topics`` then. Fails at once if they pass the hop cap's bound, not at the timeout."""
    bound = appended * (1 + HOP_CAP)  # each record and its copies round one cycle
    names = set(topics)

    def settled() -> bool:
        heads = {t: ok(rhttp.http.get(f"/v0/topics/{t}"))["head_seq"] for t in topics}
        assert sum(heads.values()) <= bound, f"forwarding around the cycle ran away: {heads}"
        routers = ok(rhttp.http.get("/v0/routers"))["routers"]
        return all(r["cursor"] == heads[r["source"]] for r in routers if r["source"] in names)

    eventually(settled)
    return sum(len(rhttp.data(t)) for t in topics)


def test_a_cycle_closed_by_allow_cycle_terminates_through_plain_routers(
    rhttp: RouterHttp, n: Callable[[str], str]
) -> None:
    """The routers already on the cycle carry the hop count too (docs/routers.md)."""
    ok(rhttp.put_router(n("ab"), source=n("a"), dest=n("b")), 201)
    ok(rhttp.put_router(n("ba"), source=n("b"), dest=n("a"), allow_cycle=True), 201)
    rhttp.produce(n("a"), 1, 2, 3)
    assert settle_cycle(rhttp, [n("a"), n("b")], 3) == 3 * (1 + HOP_CAP)


def test_a_plain_router_closing_a_cycle_is_409_whatever_the_cycle_holds(
    rhttp: RouterHttp, n: Callable[[str], str]
) -> None:
    ok(rhttp.put_router(n("ba"), source=n("b"), dest=n("a"), allow_cycle=True), 201)
    refused = error(rhttp.put_router(n("ab"), source=n("a"), dest=n("b")), 409, "router_cycle")
    assert refused["detail"]["cycle"] == [n("a"), n("b"), n("a")]
    error(rhttp.http.get(f"/v0/routers/{n('ab')}"), 404, "router_not_found")
    ok(rhttp.put_router(n("ab"), source=n("a"), dest=n("b"), allow_cycle=True), 201)
    rhttp.produce(n("b"), "x")
    assert settle_cycle(rhttp, [n("a"), n("b")], 1) == 1 + HOP_CAP


def test_a_longer_cycle_with_one_allow_cycle_router_terminates(
    rhttp: RouterHttp, n: Callable[[str], str]
) -> None:
    ok(rhttp.put_router(n("ab"), source=n("a"), dest=n("b")), 201)
    ok(rhttp.put_router(n("ca"), source=n("c"), dest=n("a")), 201)
    error(rhttp.put_router(n("bc"), source=n("b"), dest=n("c")), 409, "router_cycle")
    ok(rhttp.put_router(n("bc"), source=n("b"), dest=n("c"), allow_cycle=True), 201)
    rhttp.produce(n("c"), "x", "y")
    assert settle_cycle(rhttp, [n("a"), n("b"), n("c")], 2) == 2 * (1 + HOP_CAP)


def test_deleting_a_topic_deletes_its_routers(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    ok(rhttp.put_router(n("r"), source=n("a"), dest=n("b")), 201)
    ok(rhttp.http.delete(f"/v0/topics/{n('b')}"))
    error(rhttp.http.get(f"/v0/routers/{n('r')}"), 404, "router_not_found")


def test_reject_dest_backpressures(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    ok(rhttp.http.put(f"/v0/topics/{n('b')}", json={"cap_records": 5, "discard": "reject"}), 201)
    ok(rhttp.put_router(n("r"), source=n("a"), dest=n("b")), 201)
    rhttp.produce(n("a"), *range(8))  # the source acks: forwarding is not on its path
    eventually(lambda: rhttp.data(n("b")) == [0, 1, 2, 3, 4])
    assert ok(rhttp.http.get(f"/v0/routers/{n('r')}"))["cursor"] == 5  # held, not skipped
    ok(rhttp.http.post(f"/v0/topics/{n('b')}/delete", json={"before_seq": 6}))
    eventually(lambda: rhttp.data(n("b")) == [5, 6, 7])  # retried with backoff


def test_routes_are_in_openapi(rhttp: RouterHttp) -> None:
    paths = ok(rhttp.http.get("/v0/openapi.json"))["paths"]
    assert set(paths["/v0/routers/{router}"]) == {"put", "get", "delete"}
    assert set(paths["/v0/routers"]) == {"get"}


def test_bad_definitions_are_400_and_store_nothing(
    rhttp: RouterHttp, n: Callable[[str], str]
) -> None:
    for extra in (
        {"guarantee": "at_most_once"},
        {"filter": {}},
        {"filter": {"tag": ["tag", "Like", "no-star"]}},
        {"filter": {"node": []}},
        {"filter": {"colour": "red"}},
    ):
        response = rhttp.put_router(n("r"), source=n("a"), dest=n("b"), **extra)
        assert response.status_code == 400, (extra, response.text)
        assert response.json()["error"]["code"] == "invalid_request"
    error(rhttp.http.get(f"/v0/routers/{n('r')}"), 404, "router_not_found")


def test_filter_forwards_only_matching_records(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    flt = {"tag": ["tag", "Glob", "order.*"], "not_node": ["edge-2"]}
    made = ok(rhttp.put_router(n("r"), source=n("a"), dest=n("b"), filter=flt), 201)
    assert made["filter"] == flt
    rhttp.produce(n("a"), 1, tag="order.new", node="edge-1")
    rhttp.produce(n("a"), 2, tag="order.new", node="edge-2")  # excluded node
    rhttp.produce(n("a"), 3, tag="invoice")  # tag does not match
    rhttp.produce(n("a"), 4)  # no tag: a tag filter never passes it
    rhttp.produce(n("a"), 5, tag="order.paid")
    eventually(lambda: ok(rhttp.http.get(f"/v0/routers/{n('r')}"))["cursor"] == 5)
    assert rhttp.data(n("b")) == [1, 5]
    # The same definition again is the same router; another filter is another router.
    ok(rhttp.put_router(n("r"), source=n("a"), dest=n("b"), filter=flt), 200)
    error(rhttp.put_router(n("r"), source=n("a"), dest=n("b"), filter={"tag": "x"}), 409,
          "topic_exists_incompatible")  # fmt: skip


def test_exactly_once_copies_carry_their_key(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    ok(rhttp.put_router(n("r"), source=n("a"), dest=n("b"), guarantee="exactly_once"), 201)
    rhttp.produce(n("a"), "x", meta={"k": "v"})
    eventually(lambda: len(rhttp.data(n("b"))) == 1)
    [copy] = rhttp.records(n("b"))
    epoch = ok(rhttp.http.get(f"/v0/topics/{n('a')}"))["epoch"]
    assert copy["meta"] == {"k": "v", "_topics_router": f'["{n("r")}","{n("a")}",{epoch},1]'}


def test_source_trim_is_a_tombstone_in_dest(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    # dest refuses while full, so source (cap 3, discard old) evicts unforwarded records.
    ok(rhttp.http.put(f"/v0/topics/{n('a')}", json={"cap_records": 3}), 201)
    ok(rhttp.http.put(f"/v0/topics/{n('b')}", json={"cap_records": 2, "discard": "reject"}), 201)
    ok(rhttp.put_router(n("r"), source=n("a"), dest=n("b")), 201)
    rhttp.produce(n("a"), 1, 2)
    eventually(lambda: rhttp.data(n("b")) == [1, 2])
    rhttp.produce(n("a"), 3, 4, 5, 6, 7)  # 1..4 evicted from a; 3 and 4 never forwarded
    ok(rhttp.http.post(f"/v0/topics/{n('b')}/delete", json={"before_seq": 3}))  # room again
    eventually(lambda: rhttp.data(n("b")) == [5, 6])
    page = ok(rhttp.http.post(f"/v0/topics/{n('b')}/diff", json={"from_seq": 2}))
    tomb = page["tombstone"]
    assert (tomb["reason"], tomb["gap_from"], tomb["gap_to"]) == ("source_trim", 3, 4)
    assert [r["data"] for r in page["records"]] == [5, 6]
    assert ok(rhttp.http.get(f"/v0/routers/{n('r')}"))["source_trimmed"] == 2


def test_forwarding_is_not_consumption(rhttp: RouterHttp, n: Callable[[str], str]) -> None:
    # docs/semantics/topics.md §3: a routed source nobody reads stays unconsumed; the
    # router's reads are internal.
    ok(rhttp.put_router(n("r"), source=n("a"), dest=n("b")), 201)
    rhttp.produce(n("a"), 1, 2, 3)
    # Woken by the copies' commit (a long-poll), not by polling.
    wait = {"from_seq": 0, "wait_ms": 10_000}
    page = ok(rhttp.http.post(f"/v0/topics/{n('b')}/diff", json=wait))
    assert [r["data"] for r in page["records"]] == [1, 2, 3]  # one append of the page
    assert ok(rhttp.http.get(f"/v0/routers/{n('r')}"))["cursor"] == 3
    source = ok(rhttp.http.get(f"/v0/topics/{n('a')}", params={"touch": "false"}))
    assert source["last_read_ts"] == 0


def test_an_fsync_sources_last_record_is_forwarded_without_a_later_write(
    rhttp: RouterHttp, n: Callable[[str], str]
) -> None:
    """A record of an ``fsync`` source becomes readable when its sync lands, after the
    commit that poked the router: the sync pokes it again (found by the fault
    campaign, docs/faults.md: the last record waited for the next write)."""
    ok(rhttp.http.put(f"/v0/topics/{n('a')}", json={"durability": "fsync"}), 201)
    ok(rhttp.put_router(n("r"), source=n("a"), dest=n("b")), 201)
    for i in range(3):
        rhttp.produce(n("a"), i)
        eventually(lambda i=i: rhttp.data(n("b")) == list(range(i + 1)))
