"""The web console in a real headless Chromium (docs/console.md): every page against a
real ``waymark serve``, with the data put there through the shipped client."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from tests.conftest import ServerProcess

from waymark.client import Client
from waymark.protocol import ConfigPatch, RecordIn, RouterFilter, StagedPart, TopicType

Shot = Callable[[Page, str], Path]
WAYMARK = str(Path(sys.executable).parent / "waymark")


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def open_page(page: Page, server: ServerProcess, route: str) -> None:
    page.goto(f"{server.url}/ui/#/{route}")


def test_the_topics_page_lists_a_topic_with_its_head_seq(
    page: Page, server: ServerProcess, client: Client, shot: Shot
) -> None:
    orders, small = fresh("orders"), fresh("small")
    client.append(orders, [RecordIn.of({"order": i}, tag="eu") for i in range(7)])
    client.put_topic(small, ConfigPatch(cap_records=2, durability="memory"))
    client.append(small, [RecordIn.of(i) for i in range(3)])
    open_page(page, server, "topics")
    row = page.locator(f"tr[data-topic='{orders}']")
    expect(row.locator("td.head_seq")).to_have_text("7")
    expect(row.locator("td.count")).to_have_text("7")
    expect(row.locator("td.durability")).to_have_text("disk")
    other = page.locator(f"tr[data-topic='{small}']")
    expect(other.locator("td.earliest_seq")).to_have_text("2")
    expect(other.locator("td.config")).to_contain_text("cap 2 rec")
    # A second poll gives the append rate something to measure.
    client.append(orders, [RecordIn.of({"order": 7})])
    expect(row.locator("td.head_seq")).to_have_text("8", timeout=5000)
    shot(page, "topics")
    # Sortable: by head seq, descending on the second click.
    header = page.locator("th[data-key='head_seq']")
    header.click()
    header.click()
    heads = [int(t.replace(",", "")) for t in page.locator("td.head_seq").all_inner_texts()]
    assert heads == sorted(heads, reverse=True) and len(heads) >= 2
    # Filterable: only the matching topics stay.
    page.get_by_test_id("topic-filter").fill(small)
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator("tbody tr td.name")).to_have_text(small)


def test_a_record_appended_through_the_api_shows_in_the_live_tail_within_2_s(
    page: Page, server: ServerProcess, client: Client, shot: Shot
) -> None:
    name = fresh("tail")
    client.append(name, [RecordIn.of({"hello": "before"}, tag="greeting", node="n1")])
    open_page(page, server, f"topic/{name}")
    expect(page.get_by_test_id("head-seq")).to_contain_text("1")
    # The stream is up once the record before it has arrived through it.
    expect(page.locator("[data-testid=record][data-seq='1']")).to_be_visible()
    marker = uuid.uuid4().hex
    start = time.monotonic()
    [seq] = client.append(name, [RecordIn.of({"live": marker}, tag="greeting", node="n2")]).seqs
    arrived = page.locator(f"[data-testid=record][data-seq='{seq}']")
    expect(arrived).to_contain_text(marker, timeout=2000)
    assert time.monotonic() - start < 2.0
    shot(page, "topic")
    # Filter by node: only n2's record stays in the tail.
    page.get_by_test_id("tail-node").fill("n2")
    expect(page.locator("[data-testid=record]")).to_have_count(1)
    expect(page.locator("[data-testid=record]")).to_contain_text(marker)
    page.get_by_test_id("tail-node").fill("")
    # Jump to a seq: the tail starts over from there.
    client.append(name, [RecordIn.of(i) for i in range(5)])
    page.get_by_test_id("jump-seq").fill("5")
    page.get_by_test_id("jump").click()
    expect(page.locator("[data-testid=record]").first).to_have_attribute("data-seq", "5")
    expect(page.locator("[data-testid=record]")).to_have_count(3)  # seqs 5, 6, 7


def test_the_tail_keeps_the_newest_500_rows(page: Page, server: ServerProcess,
                                            client: Client) -> None:  # fmt: skip
    name = fresh("busy")
    client.append(name, [RecordIn.of(i) for i in range(100)])
    open_page(page, server, f"topic/{name}")
    expect(page.get_by_test_id("record")).to_have_count(50)  # from 50 before the head
    client.append(name, [RecordIn.of(i) for i in range(520)])  # streamed in one by one
    rows = page.get_by_test_id("record")
    expect(rows.last).to_have_attribute("data-seq", "620")
    expect(rows).to_have_count(500)
    expect(rows.first).to_have_attribute("data-seq", "121")


def test_a_tombstone_shows_its_reason_and_gap(
    page: Page, server: ServerProcess, client: Client, shot: Shot
) -> None:
    name = fresh("capped")
    client.put_topic(name, ConfigPatch(cap_records=2))
    client.append(name, [RecordIn.of({"n": i}) for i in range(6)])  # seqs 1..4 evicted
    open_page(page, server, f"topic/{name}")
    tombstone = page.get_by_test_id("tombstone")
    expect(tombstone).to_have_count(1)
    expect(tombstone.get_by_test_id("tombstone-reason")).to_have_text("cap")
    expect(tombstone).to_contain_text("records 1…4 are gone")
    # It stands out: drawn apart from the records around it.
    record = page.locator("[data-testid=record]").first
    assert tombstone.evaluate("e => getComputedStyle(e).backgroundColor") != record.evaluate(
        "e => getComputedStyle(e).backgroundColor"
    )
    shot(page, "tombstone")
    # A tag or node filter never hides a gap.
    page.get_by_test_id("tail-tag").fill("no-such-tag")
    expect(page.locator("[data-testid=record]")).to_have_count(0)
    expect(tombstone).to_be_visible()


def test_a_permanent_delete_asks_first_and_then_deletes(
    page: Page, server: ServerProcess, client: Client
) -> None:
    name = fresh("deletable")
    client.append(name, [RecordIn.of(i, tag="a" if i % 2 else "b") for i in range(10)])
    open_page(page, server, f"topic/{name}")
    expect(page.get_by_test_id("delete-panel")).to_be_visible()  # auth off: every scope
    page.get_by_test_id("delete-before").fill("6")
    page.get_by_test_id("delete").click()
    confirm = page.get_by_test_id("delete-confirm")
    expect(confirm).to_be_visible()
    expect(page.get_by_test_id("delete-panel")).to_contain_text("seq < 6")
    assert client.get_topic(name, touch=False).count == 10  # nothing deleted before confirming
    page.get_by_role("button", name="Cancel").click()
    expect(confirm).to_be_hidden()
    assert client.get_topic(name, touch=False).count == 10
    # Confirmed: seqs 1..5 go; then by tag, the "b" records (even data: odd seqs).
    page.get_by_test_id("delete").click()
    page.get_by_test_id("delete-confirm").click()
    expect(page.get_by_test_id("delete-result")).to_contain_text("deleted 5 records")
    assert client.get_topic(name, touch=False).earliest_seq == 6
    page.get_by_test_id("delete-before").fill("")
    page.get_by_test_id("delete-tag").fill("b")
    page.get_by_test_id("delete").click()
    page.get_by_test_id("delete-confirm").click()
    expect(page.get_by_test_id("delete-result")).to_contain_text("deleted 2 records")
    left = client.diff(name, 0).records
    assert [r.tag for r in left] == ["a", "a", "a"]
    expect(page.get_by_test_id("earliest-seq")).to_contain_text("6")


def test_an_admin_changes_a_topic_s_config_and_sees_the_server_s_refusals(
    page: Page, server: ServerProcess, client: Client
) -> None:
    name = fresh("tunable")
    client.append(name, [RecordIn.of(i) for i in range(5)])
    open_page(page, server, f"topic/{name}")
    form = page.get_by_test_id("config-form")
    form.get_by_label("cap_records").fill("3")
    form.get_by_label("discard").select_option("old")
    form.get_by_role("button", name="Save config").click()
    expect(page.get_by_test_id("config-result")).to_have_text("saved cap_records")
    state = client.get_topic(name, touch=False)
    assert state.config.cap_records == 3 and state.count == 3  # the cap applied at once
    expect(page.get_by_test_id("config")).to_contain_text("3")
    expect(page.get_by_test_id("earliest-seq")).to_contain_text("3")
    # A value the server refuses: its code and message are shown, nothing changes.
    form.get_by_label("ttl_ms").fill("-1")
    form.get_by_role("button", name="Save config").click()
    expect(page.get_by_test_id("config-result")).to_contain_text("400 invalid_request")
    assert client.get_topic(name, touch=False).config.ttl_ms == 0


def test_an_admin_deletes_a_router_after_confirming(
    page: Page, server: ServerProcess, client: Client
) -> None:
    source, dest, router = fresh("from"), fresh("to"), fresh("gone")
    client.put_topic(source)
    client.put_router(router, source, dest)
    open_page(page, server, "routers")
    row = page.locator(f"tr[data-router='{router}']")
    row.get_by_test_id("router-delete").click()
    expect(row).to_contain_text(f"Stop forwarding {source} → {dest}?")
    row.get_by_role("button", name="Cancel").click()
    assert router in {r.name for r in client.list_routers()}
    row.get_by_test_id("router-delete").click()
    row.get_by_test_id("router-delete-confirm").click()
    expect(page.get_by_test_id("router-result")).to_have_text(f"deleted router {router}")
    assert router not in {r.name for r in client.list_routers()}
    expect(page.locator(f"g.edge[data-router='{router}']")).to_have_count(0)


SCOPE_CASES = """async () => {
    const { allowed } = await import('/ui/api.js');
    const who = (scopes) => ({ name: 't', scopes, auth: true });
    return [
        allowed(who(['read:*']), 'delete', 'orders'),
        allowed(who(['read:*', 'delete:orders.*']), 'delete', 'orders.eu'),
        allowed(who(['read:*', 'delete:orders.*']), 'delete', 'ordersX'),
        allowed(who(['delete:a.b']), 'delete', 'aXb'),
        allowed(who(['queue:jobs']), 'queue', 'jobs'),
        allowed(who(['queue:jobs']), 'delete', 'jobs'),
        allowed(who(['admin']), 'delete', 'anything'),
        allowed(who(['delete:orders']), 'delete', 'orders-archive'),
    ];
}"""
SCOPE_ANSWERS = [False, True, False, False, True, False, True, False]


def test_the_scope_guard_hides_what_a_token_may_not_do(page: Page, server: ServerProcess) -> None:
    """The console's scope check (api.js ``allowed``) as the browser runs it."""
    open_page(page, server, "topics")
    assert page.evaluate(SCOPE_CASES) == SCOPE_ANSWERS


@pytest.mark.parametrize(
    ("guard", "mutant"),
    [
        ('if (scope === "admin") return true;', "return true;"),  # every token may do all
        ("return scopeKind === kind &&", "return true ||"),  # the kind is not checked
        ("new RegExp(`^(?:${re})$`)", "new RegExp(`^(?:${re})`)"),  # a prefix matches
        (
            'else re += c.replace(/[.+?^${}()|[\\]\\\\/*-]/g, "\\\\$&")',
            "else re += c",
        ),  # "." a wildcard
    ],
)
def test_a_broken_scope_guard_is_caught(
    page: Page, server: ServerProcess, guard: str, mutant: str
) -> None:
    source = httpx.get(f"{server.url}/ui/api.js").text
    assert guard in source
    page.route("**/ui/api.js", lambda route: route.fulfill(
        body=source.replace(guard, mutant), content_type="text/javascript"))  # fmt: skip
    open_page(page, server, "topics")
    assert page.evaluate(SCOPE_CASES) != SCOPE_ANSWERS


def new_token(tokens: Path, name: str, *scopes: str) -> str:
    command = [WAYMARK, "token", "new", name, "--tokens", str(tokens)]
    for scope in scopes:
        command += ["--scope", scope]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_a_read_only_token_cannot_see_the_delete_control(
    browser: Browser, tmp_path: Path, start_waymark: Callable[..., ServerProcess]
) -> None:
    tokens = tmp_path / "tokens"
    # admin alone changes configs and routers; writing and deleting records are scopes too
    admin = new_token(tokens, "operator", "admin", "read:*", "write:*", "delete:*")
    reader = new_token(tokens, "reader", "read:*")
    server = start_waymark("--tokens", str(tokens))
    name = fresh("guarded")
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin}"}) as http:
        http.post(f"/v0/topics/{name}/records", json={"records": [{"data": 1}]}).raise_for_status()

    def topic_page_as(secret: str) -> Page:
        page = browser.new_context().new_page()
        page.goto(f"{server.url}/ui/")
        page.get_by_label("token").fill(secret)
        page.get_by_role("button", name="Use token").click()
        page.goto(f"{server.url}/ui/#/topic/{name}")
        expect(page.get_by_test_id("head-seq")).to_contain_text("1")
        return page

    as_reader = topic_page_as(reader)
    expect(as_reader.get_by_test_id("who")).to_contain_text("reader")
    expect(as_reader.get_by_test_id("record")).to_have_count(1)  # it sees everything
    expect(as_reader.get_by_test_id("delete-panel")).to_have_count(0)  # and deletes nothing
    expect(as_reader.get_by_test_id("delete")).to_have_count(0)
    expect(as_reader.get_by_test_id("config-form")).to_have_count(0)  # config: admin only
    as_admin = topic_page_as(admin)  # the same page shows it to a token that may delete
    expect(as_admin.get_by_test_id("delete")).to_be_visible()


def test_the_queues_page_shows_counts_the_oldest_lease_and_redrives(
    page: Page, server: ServerProcess, client: Client, shot: Shot
) -> None:
    name, dead = fresh("jobs"), fresh("jobs-dead")
    client.put_topic(name, ConfigPatch(max_deliveries=1, dead_letter=dead, lease_ms=600_000),
                     type=TopicType.QUEUE)  # fmt: skip
    client.append(name, [RecordIn.of({"job": i}) for i in range(6)])
    [first] = client.claim(name, "worker-1", 1)
    client.nack(name, "worker-1", [first.seq])
    assert client.claim(name, "worker-1", 1)[0].seq != first.seq  # its 2nd delivery: dead
    held = client.claim(name, "worker-2", 2)
    state = client.get_topic(name, touch=False).queue
    assert state is not None and state.in_flight == 3 and state.dead_lettered == 1
    assert state.earliest_lease_deadline is not None
    open_page(page, server, "queues")
    row = page.locator(f"tr[data-topic='{name}']")
    expect(row.locator("td.ready")).to_have_text(str(state.ready))
    expect(row.locator("td.in_flight")).to_have_text("3")
    expect(row.locator("td.dead_lettered")).to_have_text("1")
    expect(row.locator("td.oldest")).to_contain_text("expires in 9 min")
    shot(page, "queues")
    row.get_by_test_id("redrive").click()
    expect(page.get_by_test_id("redrive-result")).to_contain_text("redrove 1 dead letters")
    assert client.get_topic(dead, touch=False).count == 0
    client.ack(name, "worker-2", [j.seq for j in held])
    expect(row.locator("td.in_flight")).to_have_text("1", timeout=5000)


def test_the_routers_page_draws_the_graph_with_guarantee_filter_and_lag(
    page: Page, server: ServerProcess, client: Client, shot: Shot
) -> None:
    raw, clean, audit = fresh("raw"), fresh("clean"), fresh("audit")
    client.put_topic(raw)
    fwd, copy = fresh("fwd"), fresh("copy")
    client.put_router(fwd, raw, clean, guarantee="exactly_once",
                      filter=RouterFilter(tag="ok"))  # fmt: skip
    client.put_router(copy, clean, audit)
    # A new router forwards what commits after it (docs/routers.md).
    client.append(raw, [RecordIn.of(i, tag="ok" if i % 3 else "bad") for i in range(9)])
    deadline = time.monotonic() + 10
    while client.get_router(copy).cursor < 6:  # the six "ok" records, through both hops
        assert time.monotonic() < deadline, "the routers did not forward"
        time.sleep(0.05)
    open_page(page, server, "routers")
    graph = page.get_by_test_id("router-graph")
    edge = graph.locator(f"g.edge[data-router='{fwd}']")
    expect(edge).to_contain_text("exactly-once")
    expect(edge).to_contain_text("filter tag ok")
    expect(edge).to_contain_text("lag 0")
    for topic in (raw, clean, audit):
        expect(graph.locator(f"g.node[data-topic='{topic}']")).to_have_count(1)
    # source → dest: each edge runs left to right from its source's box to its dest's.
    box = {t: graph.locator(f"g.node[data-topic='{t}'] rect").bounding_box()
           for t in (raw, clean, audit)}  # fmt: skip
    assert box[raw]["x"] < box[clean]["x"] < box[audit]["x"]  # type: ignore[index]
    expect(page.locator(f"tr[data-router='{copy}']")).to_contain_text(audit)
    shot(page, "routers")


def test_the_writers_page_shows_epochs_and_the_last_published_batch(
    page: Page, server: ServerProcess, client: Client, shot: Shot
) -> None:
    writer, topic = fresh("sink"), fresh("sunk")
    client.open_writer(writer)
    epoch = client.open_writer(writer).epoch  # a second run fences the first
    for batch in (0, 1):
        client.stage(topic, [RecordIn.of({"b": batch, "i": i}) for i in range(4)], writer=writer,
                     epoch=epoch, batch_id=batch, partition=0, attempt=0)  # fmt: skip
        done = client.publish(topic, writer=writer, epoch=epoch, batch_id=batch,
                              parts=[StagedPart(0, 0, 1)])  # fmt: skip
    open_page(page, server, "writers")
    row = page.locator(f"tr[data-writer='{writer}']")
    expect(row).to_contain_text(topic)
    cells = row.locator("td")
    expect(cells.nth(1)).to_have_text("2")  # the epoch
    expect(cells.nth(3)).to_have_text("1")  # the last published batch
    expect(cells.nth(4)).to_have_text(f"{done.first_seq}…{done.first_seq + 3}")
    shot(page, "writers")


def test_a_user_produces_records_from_the_topic_page(
    page: Page, server: ServerProcess, client: Client
) -> None:
    name = fresh("produced")
    client.append(name, [RecordIn.of({"first": True})])
    open_page(page, server, f"topic/{name}")
    page.get_by_test_id("produce-text").fill('{"order": 1}\n\n  {"order": 2, "note": "ü"}  \n')
    page.get_by_test_id("produce-tag").fill("orders.eu")
    page.get_by_test_id("produce").click()
    expect(page.get_by_test_id("produce-result")).to_have_text("appended 2 record(s) at seq 2…3")
    records = client.diff(name, 1).records
    assert [(r.data, r.tag) for r in records] == [
        ({"order": 1}, "orders.eu"), ({"order": 2, "note": "ü"}, "orders.eu")]  # fmt: skip
    expect(page.locator("[data-testid=record][data-seq='3']")).to_be_visible()  # in the tail
    # A line that is not JSON: nothing is sent, the line is named.
    page.get_by_test_id("produce-text").fill('{"ok": 1}\n{oops')
    page.get_by_test_id("produce").click()
    expect(page.get_by_test_id("produce-result")).to_contain_text("line 2 is not JSON")
    assert client.get_topic(name, touch=False).head_seq == 3


def test_a_search_finds_records_by_tag_pattern_seq_range_and_text_and_shows_gaps(
    page: Page, server: ServerProcess, client: Client
) -> None:
    name = fresh("searched")
    tags = ["order.eu", "order.us", "refund"]
    client.append(name, [RecordIn.of({"n": i, "note": "needle" if i % 7 == 0 else "hay"},
                                     tag=tags[i % 3]) for i in range(1, 301)])  # fmt: skip
    open_page(page, server, f"topic/{name}")
    page.get_by_test_id("search-tag").fill("order.*")
    page.get_by_test_id("search-from").fill("10")
    page.get_by_test_id("search-to").fill("200")
    page.get_by_test_id("search-text").fill("needle")
    page.get_by_test_id("search").click()
    # seq i holds n = i: tags order.* are i % 3 != 2, needles i % 7 == 0
    want = [i for i in range(10, 201) if i % 3 != 2 and i % 7 == 0]
    hits = page.get_by_test_id("search-hit")
    expect(hits).to_have_count(len(want))
    assert [int(s) for s in [h.get_attribute("data-seq") for h in hits.all()] if s] == want
    expect(page.get_by_test_id("search-status")).to_contain_text(f"{len(want)} match(es)")
    expect(page.get_by_test_id("search-tombstone")).to_have_count(0)
    # An evicted range is shown as what it is, never skipped silently.
    capped = fresh("capped")
    client.put_topic(capped, ConfigPatch(cap_records=5))
    client.append(capped, [RecordIn.of({"n": i}) for i in range(12)])
    open_page(page, server, f"topic/{capped}")
    page.get_by_test_id("search").click()
    expect(page.get_by_test_id("search-tombstone")).to_contain_text("records 1…7 are gone")
    expect(page.get_by_test_id("search-hit")).to_have_count(5)


def test_an_admin_creates_a_topic_and_an_existing_name_is_left_alone(
    page: Page, server: ServerProcess, client: Client
) -> None:
    name, taken = fresh("created"), fresh("taken")
    client.put_topic(taken, ConfigPatch(cap_records=9))
    open_page(page, server, "topics")
    page.get_by_test_id("create-name").fill(name)
    page.get_by_test_id("create-type").select_option("queue")
    page.get_by_test_id("create-durability").select_option("fsync")
    page.get_by_test_id("create-cap_records").fill("100")
    page.get_by_test_id("create").click()
    expect(page.get_by_test_id("create-result")).to_have_text(f"created {name}")
    state = client.get_topic(name, touch=False)
    assert (state.type, state.durability, state.config.cap_records) == ("queue", "fsync", 100)
    expect(page.locator(f"tr[data-topic='{name}']")).to_be_visible()
    # A name in use: the form says so and the topic's config stays as it was.
    page.get_by_test_id("create-name").fill(taken)
    page.get_by_test_id("create-cap_records").fill("1")
    page.get_by_test_id("create").click()
    expect(page.get_by_test_id("create-result")).to_contain_text("exists already")
    assert client.get_topic(taken, touch=False).config.cap_records == 9
    # A name the server refuses: its code is shown.
    page.get_by_test_id("create-name").fill("no spaces")
    page.get_by_test_id("create").click()
    expect(page.get_by_test_id("create-result")).to_contain_text("invalid_topic_name")


def test_the_append_rate_chart_survives_a_reload(
    page: Page, server: ServerProcess, client: Client
) -> None:
    name = fresh("charted")
    client.append(name, [RecordIn.of(1)])

    def sampled(head: int) -> None:  # the server took a sample at this head (0.2 s ticks)
        deadline = time.monotonic() + 10
        while not any(p[1] == head for p in client.topic_history(name).samples[:-1]):
            assert time.monotonic() < deadline, f"no sample at head {head}"
            time.sleep(0.05)

    sampled(1)
    client.append(name, [RecordIn.of(i) for i in range(2000)])  # a burst, before any page
    sampled(2001)
    # 2,000 appends in one 0.2 s interval: about 10,000/s. The browser itself saw no
    # append, so only the server's history can show the burst, before and after a reload.
    burst = re.compile(r"max \d{4,5}/s")
    open_page(page, server, f"topic/{name}")
    expect(page.get_by_test_id("rate-chart")).to_contain_text(burst)
    page.reload()
    expect(page.get_by_test_id("rate-chart")).to_contain_text(burst)
