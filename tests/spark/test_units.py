"""The Spark part's pure logic and the server-side staging, without a Spark session."""

from __future__ import annotations

import itertools

import httpx
import pyarrow as pa
import pytest

from waymark.clock import ManualClock
from waymark.log import Engine, ErrorCode, RecordIn, TopicError
from waymark.log.staging import PartKey
from waymark.spark.offsets import EARLIEST, LATEST, TopicOffset, admit, parse_starting
from waymark.spark.partitions import ReadSettings, Recreated, split
from waymark.spark.sink import encode_data

SETTINGS = ReadSettings("http://x", None, "fail", "gaps", 10_000)


def test_starting_offsets_forms() -> None:
    assert parse_starting(None, ["a"]) == {"a": EARLIEST}
    assert parse_starting("latest", ["a", "b"]) == {"a": LATEST, "b": LATEST}
    given = parse_starting('{"a": {"epoch": 3, "seq": 7}, "b": -1}', ["a", "b", "c"])
    assert given == {"a": TopicOffset(3, 7), "b": LATEST, "c": EARLIEST}
    with pytest.raises(ValueError, match="not in 'topics'"):
        parse_starting('{"zz": -2}', ["a"])
    with pytest.raises(ValueError, match="-2, -1 or"):
        parse_starting('{"a": 5}', ["a"])


def test_admission_shares_the_budget_and_never_exceeds_it() -> None:
    assert admit({"a": 10, "b": 1000, "c": 0}, 100) == {"a": 10, "b": 90, "c": 0}
    assert admit({"a": 500, "b": 500}, 100) == {"a": 50, "b": 50}
    assert sum(admit({"a": 5, "b": 5, "c": 5}, 2).values()) == 2
    assert admit({"a": 7}, None) == {"a": 7}


def test_partitions_cover_the_range_exactly_once() -> None:
    parts = split(
        SETTINGS,
        [("a", 1, 10, 1010, None), ("b", 2, 0, 5, Recreated(1, 40)), ("c", 1, 3, 3, None)],
        min_partitions=4,
        max_per_partition=300,
    )
    a = [(p.lo, p.hi) for p in parts if p.topic == "a"]
    assert a[0][0] == 10 and a[-1][1] == 1010
    assert all(x[1] == y[0] for x, y in itertools.pairwise(a))
    assert all(hi - lo <= 300 for lo, hi in a)
    b = [p for p in parts if p.topic == "b"]
    assert b[0].recreated == Recreated(1, 40) and all(p.recreated is None for p in b[1:])
    assert not [p for p in parts if p.topic == "c"]  # empty, no recreate: no task


def test_sink_data_column_encoding() -> None:
    assert encode_data(pa.array(['{"a":1}', "[1,2]", '"s"'])) == [b'{"a":1}', b"[1,2]", b'"s"']
    structs = pa.array([{"x": 1, "y": "z"}], pa.struct([("x", pa.int64()), ("y", pa.string())]))
    assert encode_data(structs) == [b'{"x":1,"y":"z"}']
    with pytest.raises(ValueError, match="row 1: the 'data' column is not valid JSON"):
        encode_data(pa.array(["1", "{nope"]))
    # Two values in one string would shift the record's keys if concatenated blindly.
    with pytest.raises(ValueError, match="not valid JSON"):
        encode_data(pa.array(['1,"tag":"forged"']))


def _engine() -> tuple[Engine, ManualClock]:
    clock = ManualClock(1_000_000)
    return Engine(clock=clock), clock


def test_publish_is_atomic_contiguous_and_idempotent() -> None:
    engine, _ = _engine()
    staging = engine.staging
    epoch = staging.open_writer("w")
    staging.stage("t", "w", epoch, 0, PartKey(1, 0), [RecordIn.of("b1"), RecordIn.of("b2")])
    staging.stage("t", "w", epoch, 0, PartKey(0, 0), [RecordIn.of("a1")])
    staging.stage("t", "w", epoch, 0, PartKey(0, 1), [RecordIn.of("a1-retry")])
    engine.append("t", [RecordIn.of("other")])  # staged rows stay invisible meanwhile
    assert [r["data"] for r in engine.diff("t", 0).records()] == ["other"]
    first = staging.publish("t", "w", epoch, 0, [(PartKey(0, 1), 1), (PartKey(1, 0), 1)])
    assert (first.first_seq, first.count, first.replayed) == (2, 3, False)
    assert [r["data"] for r in engine.diff("t", 1).records()] == ["a1-retry", "b1", "b2"]
    again = staging.publish("t", "w", epoch, 0, [(PartKey(0, 0), 1)])
    assert (again.first_seq, again.count, again.replayed) == (2, 3, True)
    assert engine.get_topic("t").head_seq == 4
    # A replayed batch's stage is declined, so executors need not ship it again.
    assert not staging.stage("t", "w", epoch, 0, PartKey(0, 2), [RecordIn.of("x")])
    assert staging.staged_parts("t", "w") == 0  # the failed attempt's stage went with it


def test_stale_epoch_is_fenced() -> None:
    engine, _ = _engine()
    staging = engine.staging
    old = staging.open_writer("w")
    staging.stage("t", "w", old, 0, PartKey(0, 0), [RecordIn.of(1)])
    new = staging.open_writer("w")
    for call in (
        lambda: staging.stage("t", "w", old, 0, PartKey(0, 0), [RecordIn.of(1)]),
        lambda: staging.publish("t", "w", old, 0, [(PartKey(0, 0), 1)]),
    ):
        with pytest.raises(TopicError) as refused:
            call()
        assert refused.value.code is ErrorCode.FENCED and refused.value.status == 409
    with pytest.raises(TopicError):
        engine.get_topic("t")  # the zombie appended nothing: the topic was never created
    assert new == old + 1


def test_unpublished_stages_expire_by_the_clock() -> None:
    engine, clock = _engine()
    staging = engine.staging
    epoch = staging.open_writer("w")
    staging.stage("t", "w", epoch, 0, PartKey(0, 0), [RecordIn.of(1)])
    clock.advance(staging.stage_ttl_ms + 1)
    assert staging.staged_parts("t", "w") == 0
    with pytest.raises(TopicError) as refused:
        staging.publish("t", "w", epoch, 0, [(PartKey(0, 0), 1)])
    assert refused.value.code is ErrorCode.NOT_FOUND


def test_http_routes_fence_and_publish(http: httpx.Client, topic: str) -> None:
    old = http.post("/v0/writers", json={"writer": topic}).json()["epoch"]
    head = {"writer": topic, "epoch": old, "batch_id": 0, "partition": 0, "attempt": 0}
    staged = http.post(f"/v0/topics/{topic}/stage", json={**head, "records": [{"data": 1}]})
    assert staged.json() == {"staged": 1, "accepted": True}
    http.post("/v0/writers", json={"writer": topic})
    parts = [{"partition": 0, "attempt": 0, "chunks": 1}]
    body = {"writer": topic, "epoch": old, "batch_id": 0, "parts": parts}
    fenced = http.post(f"/v0/topics/{topic}/publish", json=body)
    assert fenced.status_code == 409 and fenced.json()["error"]["code"] == "fenced"
    spec = http.get("/v0/openapi.json").json()["paths"]
    assert {"/v0/writers", "/v0/topics/{topic}/stage", "/v0/topics/{topic}/publish"} <= set(spec)


def test_diff_page_to_arrow_matches_a_row_by_row_build() -> None:
    """The column-wise Arrow build (raw JSON slices + offsets, null columns without a
    per-row pass) equals the obvious row-by-row one, multi-byte text included."""
    import msgspec
    import orjson

    from waymark.protocol import DiffResponse
    from waymark.spark.schema import ARROW_SCHEMA
    from waymark.spark.source import to_arrow

    records = [
        {"$seq": 7, "$ts": 1_790_000_000_123, "data": {"u": "é✓", "n": 1}},
        {"$seq": 8, "$ts": 1_790_000_000_124, "data": [1, "two"], "$tag": "t", "$node": "n1",
         "meta": {"k": "v"}},
        {"$seq": 9, "$ts": 1_790_000_000_125, "data": "plain"},
    ]  # fmt: skip
    page = {"records": records, "tombstone": None, "next_from_seq": 9, "head_seq": 9,
            "earliest_seq": 7, "caught_up": True, "epoch": 1, "durability": "disk"}  # fmt: skip
    rows = msgspec.json.decode(orjson.dumps(page), type=DiffResponse[msgspec.Raw]).records
    expected = pa.RecordBatch.from_pylist(
        [
            {
                "topic": "t.x",
                "seq": r["$seq"],
                "ts": r["$ts"] * 1000,
                "node": r.get("$node"),
                "tag": r.get("$tag"),
                "meta": list(r["meta"].items()) if "meta" in r else None,
                "data": orjson.dumps(r["data"]).decode(),
            }
            for r in records
        ],
        schema=ARROW_SCHEMA,
    )
    assert to_arrow("t.x", rows).equals(expected)
    plain = to_arrow("t.x", [rows[0], rows[2]])  # node, tag and meta null throughout
    assert plain.column("data").to_pylist() == ['{"u":"é✓","n":1}', '"plain"']
    assert plain.column("meta").null_count == 2 and plain.column("topic").to_pylist() == ["t.x"] * 2
    assert to_arrow("t.x", []).num_rows == 0
