"""Arrow pages through the real server and the shipped client (docs/http-api.md,
"Arrow pages"): content negotiation, the page limit, the cursor fields and
tombstones, the one-call read for polars, DuckDB and pandas, and the documented
example run as written."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waymark.client import ApiError, AsyncClient, Client, ConfigPatch, ErrorCode, RecordIn, TopicGap
from waymark.protocol import ARROW_STREAM, MAX_ARROW_DIFF_LIMIT, DiffResponse
from waymark.protocol.arrow import PAGE_SCHEMA, decode_page

ROOT = Path(__file__).resolve().parents[2]


def rows_of(page: DiffResponse[msgspec.Raw]) -> list[dict]:
    return [{"seq": r.seq, "ts": r.ts, "node": r.node, "tag": r.tag, "meta": r.meta,
             "data": bytes(r.data).decode()} for r in page.records]  # fmt: skip


def arrow_rows(table: pa.Table) -> list[dict]:
    out = []
    for row in table.to_pylist():
        row["ts"] = int(row["ts"].timestamp() * 1000)
        row["meta"] = None if row["meta"] is None else dict(row["meta"])
        out.append(row)
    return out


def test_accept_header_negotiates_an_arrow_page(client: Client, topic: str, waymark_server) -> None:
    client.append(topic, [RecordIn.of({"n": i}, tag="t" if i % 2 else None) for i in range(5)])
    url = f"{waymark_server.url}/v0/topics/{topic}/diff"
    accept = {"accept": f"text/plain, {ARROW_STREAM}; q=1"}
    response = httpx.post(url, json={"from_seq": 0}, headers=accept)
    assert response.status_code == 200
    assert response.headers["content-type"] == ARROW_STREAM
    page = decode_page(response.content)
    assert page.table.schema == PAGE_SCHEMA
    assert page.table["seq"].to_pylist() == [1, 2, 3, 4, 5]
    plain = httpx.post(f"{waymark_server.url}/v0/topics/{topic}/diff", json={"from_seq": 0})
    assert plain.headers["content-type"] == "application/json"


def test_arrow_pages_go_to_100k_records_json_pages_to_10k(client: Client, topic: str) -> None:
    for _ in range(11):
        client.append(topic, [RecordIn.of(i) for i in range(10_000)])
    page = client.diff_arrow(topic, 0, limit=MAX_ARROW_DIFF_LIMIT)
    assert page.count == 100_000 and page.next_from_seq == 100_000 and not page.caught_up
    assert page.table["seq"].to_numpy().tolist() == list(range(1, 100_001))
    with pytest.raises(ApiError) as refused:
        client.diff(topic, 0, limit=10_001)
    assert (refused.value.status, refused.value.code) == (400, ErrorCode.INVALID_REQUEST)
    with pytest.raises(ApiError) as too_many:
        client.diff_arrow(topic, 0, limit=MAX_ARROW_DIFF_LIMIT + 1)
    assert too_many.value.code == ErrorCode.INVALID_REQUEST


def test_an_error_is_a_json_error_for_an_arrow_request(client: Client, topic: str) -> None:
    with pytest.raises(ApiError) as missing:
        client.diff_arrow(topic, 0)
    assert (missing.value.status, missing.value.code) == (404, ErrorCode.TOPIC_NOT_FOUND)


def test_a_tombstone_and_the_cursor_fields_arrive_in_the_page(client: Client, topic: str) -> None:
    client.put_topic(topic, ConfigPatch(cap_records=3))
    client.append(topic, [RecordIn.of(i) for i in range(10)])
    page = client.diff_arrow(topic, 0)
    json_page = client.diff_raw(topic, 0)
    assert page.tombstone == json_page.tombstone and page.tombstone.reason == "cap"
    assert (page.next_from_seq, page.head_seq, page.earliest_seq, page.caught_up, page.epoch,
            page.durability) == (json_page.next_from_seq, json_page.head_seq,
                                 json_page.earliest_seq, json_page.caught_up, json_page.epoch,
                                 json_page.durability)  # fmt: skip
    with pytest.raises(TopicGap) as gap:
        client.read_table(topic)
    assert (gap.value.tombstone.gap_from, gap.value.tombstone.gap_to) == (1, 7)
    assert client.read_table(topic, skip_gaps=True)["seq"].to_pylist() == [8, 9, 10]


RECORDS = st.lists(
    st.tuples(
        st.sampled_from([None, "a", "b", "é"]),
        st.sampled_from([None, "n1", "n2"]),
        st.none()
        | st.dictionaries(
            st.sampled_from(["k", "data", ',"data":']), st.text(max_size=4), max_size=2
        ),
        st.recursive(
            st.integers() | st.text(max_size=5),
            lambda v: st.dictionaries(st.sampled_from(["data", "x"]), v, max_size=2),
            max_leaves=4,
        ),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(records=RECORDS, deletes=st.lists(st.integers(1, 25), max_size=5),
       node=st.sampled_from([None, "n1", ["n1", "n2"]]), limit=st.integers(1, 7))  # fmt: skip
def test_arrow_and_json_answers_agree_over_http(
    waymark_server, records, deletes, node, limit
) -> None:
    """Record for record and on every cursor field, page after page, with deletes and
    node filters — through the server, read with the shipped client."""
    with Client(waymark_server.url) as client:
        topic = f"arrow-agree-{msgspec.json.encode(records).__hash__() & 0xFFFFFF:x}-{id(records)}"
        client.put_topic(topic)
        client.append(topic, [RecordIn.of(d, tag=t, node=n, meta=m) for t, n, m, d in records])
        for seq in deletes:
            client.delete(topic, before_seq=seq) if seq % 5 == 0 else None
        client.delete(topic, match="a")
        cursor = 0
        while True:
            arrow = client.diff_arrow(topic, cursor, limit=limit, node=node)
            json_page = client.diff_raw(topic, cursor, limit=limit, node=node)
            assert arrow_rows(arrow.table) == rows_of(json_page)
            assert (arrow.tombstone, arrow.next_from_seq, arrow.head_seq, arrow.earliest_seq,
                    arrow.caught_up, arrow.epoch) == (
                json_page.tombstone, json_page.next_from_seq, json_page.head_seq,
                json_page.earliest_seq, json_page.caught_up, json_page.epoch)  # fmt: skip
            if arrow.caught_up:
                break
            cursor = arrow.next_from_seq
        client.delete_topic(topic)


async def test_the_async_client_reads_arrow_pages(waymark_server, topic: str) -> None:
    async with AsyncClient(waymark_server.url) as client:
        await client.append(topic, [RecordIn.of({"i": i}, meta={"m": str(i)}) for i in range(3)])
        page = await client.diff_arrow(topic, 0)
        table = await client.read_table(topic)
    assert page.table.equals(table)
    assert [dict(m) for m in table["meta"].to_pylist()] == [{"m": "0"}, {"m": "1"}, {"m": "2"}]


def test_the_documented_polars_duckdb_pandas_example_runs(
    client: Client, topic: str, waymark_server
) -> None:
    client.append(topic, [RecordIn.of({"amount": i}, tag="x" if i % 2 else "y") for i in range(6)])
    text = (ROOT / "docs" / "http-api.md").read_text()
    section = text.split("### Arrow pages", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    example = example.replace("http://127.0.0.1:8080", waymark_server.url)
    example = example.replace('read_table("orders")', f"read_table({topic!r})")
    scope: dict = {}
    exec(compile(example, "docs/http-api.md", "exec"), scope)
    assert scope["frame"].height == 6
    assert scope["per_tag"] == [("x", 3), ("y", 3)]
    assert list(scope["rows"]["seq"]) == [1, 2, 3, 4, 5, 6]
    assert scope["amounts"]["data"].struct.field("amount").to_list() == list(range(6))
