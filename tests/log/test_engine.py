"""The engine's rules of docs/semantics/topics.md §1-§7, one test each, without HTTP."""

from __future__ import annotations

import json

import msgspec
import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from waymark.clock import ManualClock
from waymark.log import (
    ConfigPatch,
    Discard,
    Durability,
    Engine,
    ErrorCode,
    Limits,
    RecordIn,
    TagMatch,
    TopicConfig,
    TopicError,
    TopicType,
)
from waymark.log.config import EngineConfig
from waymark.log.priority import (
    AUTO_FLOOR_MS,
    AUTO_MAX,
    HALF_LIFE_MS,
    age_boost,
    auto_recency,
    effective_priority,
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=1_000_000)


@pytest.fixture
def engine(clock: ManualClock) -> Engine:
    return Engine(clock=clock)


def rec(data: object = None, **kw: object) -> RecordIn:
    return RecordIn.of(data, **kw)  # type: ignore[arg-type]


def refused(code: ErrorCode, fn, *args, **kwargs) -> TopicError:
    with pytest.raises(TopicError) as info:
        fn(*args, **kwargs)
    assert info.value.code is code, info.value
    return info.value


# --- docs/semantics/topics.md §1 records ------------------------------------------------------


def test_wire_keys_and_omission(engine: Engine) -> None:
    engine.append("t", [rec({"x": 1}, tag="g", node="n", meta={"k": "v"}), rec(None)])
    full, bare = engine.diff("t", 0).records()
    assert full == {
        "$seq": 1,
        "$ts": 1_000_000,
        "$node": "n",
        "$tag": "g",
        "meta": {"k": "v"},
        "data": {"x": 1},
    }
    # Absent node/tag/meta are omitted, never null; data is always present.
    assert bare == {"$seq": 2, "$ts": 1_000_000, "data": None}


def test_data_is_passed_through_verbatim(engine: Engine) -> None:
    raw = b'{"b":[1,2.5,"\xc3\xa9\\n\\""],"a":null}'  # canonical already: kept as is
    engine.append("t", [RecordIn(msgspec.Raw(raw))])
    assert engine.diff("t", 0).records_json().endswith(b'"data":' + raw + b"}]")


def test_data_is_stored_canonical_changing_no_value(engine: Engine) -> None:
    # Whitespace goes and escapes become the ones JSON requires; numbers keep their exact
    # digits (no float round trip), and object members stay as they are, in order.
    raw = (b'{ "b" : [1, 2.50, -0, 1e5, 18446744073709551617, '
           b'"\\u00e9\\/\\n\\"\\ud83d\\ude00\\u0001" ],\n\t"a":null, "a":1 }')  # fmt: skip
    canonical = (b'{"b":[1,2.50,-0,1e5,18446744073709551617,'
                 b'"\xc3\xa9/\\n\\"\xf0\x9f\x98\x80\\u0001"],"a":null,"a":1}')  # fmt: skip
    engine.append("t", [RecordIn(msgspec.Raw(raw)), rec("plain"), RecordIn(msgspec.Raw(b" 7 "))])
    records = engine.diff("t", 0).records_json()
    assert records.endswith(b'"data":' + canonical + b'},{"$seq":2,"$ts":1000000,"data":"plain"},'
                            b'{"$seq":3,"$ts":1000000,"data":7}]')  # fmt: skip
    assert engine.get_topic("t").bytes == len(canonical) + len(b'"plain"') + len(b"7")


@pytest.mark.parametrize(
    ("record", "code"),
    [
        (RecordIn.of("x" * (1 << 20)), ErrorCode.RECORD_TOO_LARGE),
        (RecordIn.of(1, tag="t" * 257), ErrorCode.TAG_TOO_LONG),
        (RecordIn.of(1, node="n" * 129), ErrorCode.NODE_TOO_LONG),
        (RecordIn.of(1, meta={f"k{i}": "v" for i in range(65)}), ErrorCode.META_TOO_LARGE),
        (RecordIn.of(1, meta={"k": "v" * (16 << 10)}), ErrorCode.META_TOO_LARGE),
    ],
)
def test_size_limits_are_400s_with_a_specific_code(
    engine: Engine, record: RecordIn, code: ErrorCode
) -> None:
    engine.append("t", [rec(0)])
    error = refused(code, engine.append, "t", [rec(1), record])
    assert error.status == 400
    # The whole write is refused: nothing of it is stored.
    assert engine.get_topic("t").head_seq == 1


def test_limits_at_the_boundary_are_accepted(engine: Engine) -> None:
    meta = {f"k{i:02}": "v" for i in range(64)}
    data_len = (1 << 20) - len(orjson.dumps(meta)) - 2  # the two quotes of a JSON string
    engine.append("t", [rec("d" * data_len, tag="t" * 256, node="n" * 128, meta=meta)])
    assert engine.get_topic("t").bytes == 1 << 20


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


SMALL_WRITE = 512  # the data bytes of a write up to which records.py scans with translate
WHITESPACE = st.sampled_from(["", " ", "\t", "\n", "\r", "\r\n", " \t"])
LAYOUTS = st.tuples(
    st.booleans(), st.sampled_from([None, 0, 2, "\t"]), WHITESPACE, WHITESPACE, WHITESPACE
)


@given(value=JSON_VALUES, layouts=st.lists(LAYOUTS, min_size=1, max_size=3))
@example(value=[1, {"a": "é"}], layouts=[(False, None, "\r", "", "\t")])  # no space at all
@settings(max_examples=300, deadline=None)
def test_one_canonical_form_whatever_the_layout(
    value: object, layouts: list[tuple[bool, object, str, str, str]]
) -> None:
    # Escaped or not, indented or not, spaced or not: the same value is stored as the
    # same bytes, which read back as the value (big integers exactly), are what `bytes`
    # counts, and are canonical already (appending them again stores them unchanged).
    # Each text is written alone, then all of them in one write big enough to be scanned
    # the other way (memchr, not translate), canonicalised as a whole.
    engine = Engine(clock=ManualClock())
    texts = [
        json.dumps(value, ensure_ascii=as_ascii, indent=indent,
                   separators=("," + after_comma, before_colon + ":" + after_colon)).encode()
        for as_ascii, indent, after_comma, before_colon, after_colon in layouts
    ]  # fmt: skip
    for text in texts:
        engine.append("t", [RecordIn(msgspec.Raw(text))])
    batch = texts * (SMALL_WRITE // sum(map(len, texts)) + 1)
    engine.append("t", [RecordIn(msgspec.Raw(text)) for text in batch])
    stored = {stored_data(run) for run in engine.diff("t", 0, limit=10_000, per_record=True).runs}
    assert len(stored) == 1
    [canonical] = stored
    # The oracle: Python's compact form escapes exactly what JSON requires, and numbers
    # come out as in every layout above.
    assert canonical == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    assert json.loads(canonical) == value  # Python's parser: big integers exactly
    assert engine.get_topic("t").bytes == (len(texts) + len(batch)) * len(canonical)
    engine.append("u", [RecordIn(msgspec.Raw(canonical))])
    assert [stored_data(run) for run in engine.diff("u", 0, per_record=True).runs] == [canonical]


def stored_data(run: bytes | memoryview) -> bytes:
    """The data of a one-record run with no node, tag or meta: as stored, byte for byte."""
    run = bytes(run)
    return run[run.index(b'"data":') + len(b'"data":') : -len(b"},")]


def test_canonical_size_ignores_insignificant_whitespace(engine: Engine) -> None:
    padded = b"[" + b" " * (1 << 20) + b"1]"
    engine.append("t", [RecordIn(msgspec.Raw(padded))])
    assert engine.diff("t", 0).records()[0]["data"] == [1]


def test_records_per_write_limit() -> None:
    engine = Engine(EngineConfig(limits=Limits(max_records_per_write=3)))
    refused(ErrorCode.TOO_MANY_RECORDS, engine.append, "t", [rec(i) for i in range(4)])
    refused(ErrorCode.INVALID_REQUEST, engine.append, "t", [])
    assert engine.list_topics() == []


# --- docs/semantics/topics.md §2 topics -------------------------------------------------------


VALID_NAMES = [
    "a", "Z", "7",  # one character: any letter or digit
    "A9", "render-queue:tenantA", "x." + "y" * 253,
    "0" + "._:-" * 63 + "z" * 2,  # 255 characters: the longest, every allowed punctuation
    "a-", "b:", "c.", "d_",  # punctuation may end a name
]  # fmt: skip


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_topic_names(engine: Engine, name: str) -> None:
    assert 1 <= len(name) <= 255
    state, created = engine.put_topic(name, ConfigPatch())
    assert created and state.name == name
    # The name round-trips byte for byte: the same topic is found under it, and no other.
    assert engine.append(name, [rec("x")]).seqs == [1]
    assert engine.get_topic(name).name == name
    assert engine.diff(name, 0).records()[0]["data"] == "x"
    assert [s.name for s in engine.list_topics()] == [name]
    assert engine.put_topic(name, ConfigPatch())[1] is False


@pytest.mark.parametrize(
    "name",
    ["", "-a", ".a", "_a", ":a", "a b", "a/b", "é", "a\n", "a$b", "x" * 256, "0" * 256],
)
def test_invalid_topic_names(engine: Engine, name: str) -> None:
    refused(ErrorCode.INVALID_TOPIC_NAME, engine.put_topic, name, ConfigPatch())
    refused(ErrorCode.INVALID_TOPIC_NAME, engine.append, name, [rec()])


def test_lazy_create_and_opt_out(engine: Engine) -> None:
    refused(ErrorCode.TOPIC_NOT_FOUND, engine.append, "t", [rec()], create=False)
    assert engine.append("t", [rec()], create=True).created
    quiet = Engine(EngineConfig(defaults=TopicConfig(auto_create=False)))
    refused(ErrorCode.TOPIC_NOT_FOUND, quiet.append, "t", [rec()])
    assert quiet.append("t", [rec()], create=True).created


def test_inline_config_applies_on_creation_only(engine: Engine) -> None:
    engine.append("t", [rec()], config=ConfigPatch(cap_records=5))
    engine.append("t", [rec()], config=ConfigPatch(cap_records=9))
    assert engine.get_topic("t").config.cap_records == 5


def test_a_refused_write_creates_no_topic(engine: Engine) -> None:
    refused(
        ErrorCode.RECORD_TOO_LARGE,
        engine.append,
        "t",
        [rec(1), rec(2)],
        config=ConfigPatch(cap_records=1, discard=Discard.REJECT),
    )
    assert engine.list_topics() == []


def test_config_defaults(engine: Engine) -> None:
    state, created = engine.put_topic("t", ConfigPatch())
    assert created
    assert msgspec.to_builtins(state.config) == {
        "ttl_ms": 0,
        "cap_records": 0,
        "cap_bytes": 0,
        "discard": "old",
        "durable": False,
        "durability": "disk",
        "priority": None,
        "auto_priority": True,
        "auto_create": True,
        "idempotency_window_ms": 120_000,
        "dedupe_node": True,
    }


def test_config_upsert_keeps_unsent_fields(engine: Engine) -> None:
    engine.put_topic("t", ConfigPatch(ttl_ms=5, cap_records=7))
    state, created = engine.put_topic("t", ConfigPatch(cap_records=9))
    assert not created
    assert (state.config.ttl_ms, state.config.cap_records) == (5, 9)


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (ConfigPatch(), Durability.DISK),
        (ConfigPatch(durable=True), Durability.FSYNC),
        (ConfigPatch(durable=False), Durability.DISK),
        (ConfigPatch(durability=Durability.MEMORY), Durability.MEMORY),
        (ConfigPatch(durability=Durability.EPHEMERAL, durable=True), Durability.EPHEMERAL),
    ],
)
def test_durability_resolution(engine: Engine, patch: ConfigPatch, expected: Durability) -> None:
    state, _ = engine.put_topic("t", patch)
    assert state.durability is expected
    assert state.config.durable == (expected is Durability.FSYNC)
    assert engine.append("t", [rec()]).durability is expected


def test_type_is_immutable(engine: Engine) -> None:
    engine.put_topic("q", ConfigPatch(), TopicType.QUEUE)
    error = refused(
        ErrorCode.TOPIC_EXISTS_INCOMPATIBLE, engine.put_topic, "q", ConfigPatch(), TopicType.LOG
    )
    assert error.status == 409
    assert engine.get_topic("q").type is TopicType.QUEUE


def test_config_validation_rejects_bad_values() -> None:
    for body in (
        b'{"ttl_ms": -1}',
        b'{"discard": "new"}',
        b'{"durability": "tape"}',
        b'{"unknown": 1}',
        b'{"cap_records": "5"}',
    ):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(body, type=ConfigPatch)


def test_delete_topic_tears_down_and_recreate_bumps_epoch(engine: Engine) -> None:
    engine.append("t", [rec(i, tag="x", id=f"id{i}") for i in range(3)])
    first = engine.get_topic("t").epoch
    engine.delete_topic("t")
    refused(ErrorCode.TOPIC_NOT_FOUND, engine.get_topic, "t")
    refused(ErrorCode.TOPIC_NOT_FOUND, engine.delete_topic, "t")
    result = engine.append("t", [rec(9, id="id0")])
    state = engine.get_topic("t")
    # seq restarts at the base, dedupe state and tag index are gone, epoch is new.
    assert result.seqs == [1] and state.epoch > first
    assert engine.delete("t", match=TagMatch.parse("x")).response.deleted == 0


# --- docs/semantics/topics.md §3 priority -----------------------------------------------------


def test_auto_recency_decay_table() -> None:
    table = {0: 500, 15_000: 354, 30_000: 250, 60_000: 125, 120_000: 31, 300_000: 0}
    for idle, expected in table.items():
        assert auto_recency(10**9 + idle, 10**9) == expected


@given(idle=st.integers(0, AUTO_FLOOR_MS + 1_000), later=st.integers(0, 5_000))
def test_auto_recency_follows_the_half_life(idle: int, later: int) -> None:
    start = 10**12
    got = auto_recency(start + idle, start)
    if idle >= AUTO_FLOOR_MS:
        assert got == 0  # after 5 min untouched, no math at all
    else:
        exact = AUTO_MAX * 2 ** (-idle / HALF_LIFE_MS)
        # The 64-entry table steps every 1/64 of a half-life: at most a step above.
        assert exact - 1 <= got <= exact * 2 ** (1 / 64) + 1
    assert auto_recency(start + idle + later, start) <= got  # only ever decays


def test_age_boost_and_clamp() -> None:
    assert age_boost(10_000, 9_000) == 100
    assert age_boost(100_000, 1) == 1000
    assert effective_priority(5000, False, 0, 0, 0) == 1000
    assert effective_priority(-5000, False, 0, 0, 0) == -1000


def test_effective_priority_in_state(engine: Engine, clock: ManualClock) -> None:
    engine.put_topic("t", ConfigPatch(priority=100))
    engine.append("t", [rec()])
    clock.advance(2_000)
    assert engine.get_topic("t", touch=False).effective_priority == 100 + 200
    engine.diff("t", 0)  # consumption: recency bonus, aging reset
    clock.advance(30_000)
    assert engine.get_topic("t", touch=False).effective_priority == 100 + 250
    engine.put_topic("t", ConfigPatch(auto_priority=False))
    assert engine.get_topic("t", touch=False).effective_priority == 100


def test_touch_false_does_not_consume(engine: Engine, clock: ManualClock) -> None:
    engine.put_topic("t", ConfigPatch())
    clock.advance(10)
    assert engine.get_topic("t", touch=False).last_read_ts == 0
    assert engine.get_topic("t").last_read_ts == clock.now_ms()


# --- docs/semantics/topics.md §4 seq ----------------------------------------------------------


def test_seqs_are_contiguous_and_returned_in_write_order(engine: Engine) -> None:
    assert engine.append("t", [rec(i) for i in range(3)]).seqs == [1, 2, 3]
    result = engine.append("t", [rec(i) for i in range(2)])
    assert result.seqs == [4, 5] and result.head_seq == 5
    state = engine.get_topic("t")
    assert (state.next_seq, state.earliest_seq) == (6, 1)


def test_empty_topic_watermarks(engine: Engine) -> None:
    state, _ = engine.put_topic("t", ConfigPatch())
    assert (state.head_seq, state.earliest_seq, state.next_seq, state.count) == (0, 1, 1, 0)
    page = engine.diff("t", 0)
    assert page.records() == [] and page.caught_up and page.next_from_seq == 0


def test_ts_never_decreases_even_if_the_clock_would(engine: Engine) -> None:
    class Jumpy(ManualClock):
        pass

    clock = Jumpy(start_ms=5_000)
    jumpy = Engine(clock=clock)
    jumpy.append("t", [rec()])
    clock._now = 4_000  # a wall clock stepping back
    jumpy.append("t", [rec()])
    assert [r["$ts"] for r in jumpy.diff("t", 0).records()] == [5_000, 5_000]


def test_idempotent_append_returns_the_original_seq(engine: Engine, clock: ManualClock) -> None:
    engine.put_topic("t", ConfigPatch(idempotency_window_ms=1_000))
    assert engine.append("t", [rec(1, id="a"), rec(2, id="b")]).seqs == [1, 2]
    again = engine.append("t", [rec(1, id="a"), rec(3, id="c"), rec(3, id="c")])
    assert again.seqs == [1, 3, 3] and again.head_seq == 3
    clock.advance(1_001)
    assert engine.append("t", [rec(1, id="a")]).seqs == [4]
    engine.put_topic("u", ConfigPatch(idempotency_window_ms=0))
    assert engine.append("u", [rec(id="a"), rec(id="a")]).seqs == [1, 2]


def test_idempotent_append_of_writes_mixing_ids_known_and_new(
    engine: Engine, clock: ManualClock
) -> None:
    """A write whose ids are all new takes the whole-write path, any other the loop."""
    engine.put_topic("t", ConfigPatch(idempotency_window_ms=1_000))
    assert engine.append("t", [rec(1, id="a"), rec(2), rec(3, id="b", tag="x")]).seqs == [1, 2, 3]
    assert engine.append("t", [rec(4, id="c"), rec(1, id="a")]).seqs == [4, 1]  # a known
    assert engine.append("t", [rec(4, id="c"), rec(3, id="b"), rec(5)]).seqs == [4, 3, 5]
    assert engine.append("t", [rec(6, id="e"), rec(7, id="f")]).seqs == [6, 7]
    assert engine.append("t", [rec(6, id="e"), rec(7, id="f")]).seqs == [6, 7]
    stored = engine.diff("t", 0).records()
    assert [(r["$seq"], r["data"], r.get("$tag")) for r in stored] == [
        (1, 1, None), (2, 2, None), (3, 3, "x"), (4, 4, None), (5, 5, None), (6, 6, None),
        (7, 7, None),
    ]  # fmt: skip
    clock.advance(1_001)
    assert engine.append("t", [rec(1, id="a"), rec(6, id="e")]).seqs == [8, 9]


# --- docs/semantics/topics.md §5 watermarks, eviction, TTL, tombstones ------------------------


def test_ttl_is_strict(engine: Engine, clock: ManualClock) -> None:
    engine.put_topic("t", ConfigPatch(ttl_ms=100))
    engine.append("t", [rec()])
    clock.advance(100)
    assert engine.get_topic("t").count == 1  # now - ts == ttl: still live
    clock.advance(1)
    state = engine.get_topic("t")
    assert (state.count, state.earliest_seq, state.evict_floor) == (0, 2, 2)
    page = engine.diff("t", 0)
    assert page.tombstone is not None and page.tombstone.reason == "ttl"


def test_cap_bytes_evicts_oldest(engine: Engine) -> None:
    engine.put_topic("t", ConfigPatch(cap_bytes=10))
    engine.append("t", [rec("abc")])  # 5 bytes each
    engine.append("t", [rec("def")])
    engine.append("t", [rec("ghi")])
    state = engine.get_topic("t")
    assert (state.count, state.bytes, state.earliest_seq) == (2, 10, 2)


def test_dual_cap_whichever_first(engine: Engine) -> None:
    engine.put_topic("t", ConfigPatch(cap_records=3, cap_bytes=8))
    engine.append("t", [rec(1), rec(2), rec(3)])  # 1 byte each
    engine.append("t", [rec("long-1")])  # 8 bytes: bytes cap leaves only it
    state = engine.get_topic("t")
    assert (state.count, state.earliest_seq) == (1, 4)


def test_discard_reject_is_422_with_detail(engine: Engine) -> None:
    engine.put_topic("t", ConfigPatch(cap_records=2, discard=Discard.REJECT))
    engine.append("t", [rec(), rec()])
    error = refused(ErrorCode.TOPIC_FULL, engine.append, "t", [rec()])
    assert error.status == 422
    assert error.detail == {"cap_records": 2, "cap_bytes": 0, "head_seq": 2, "earliest_seq": 1}
    engine.delete("t", before_seq=2)  # takes seq 3 for itself (docs/semantics/topics.md §7.1)
    assert engine.append("t", [rec()]).seqs == [4]


def test_write_larger_than_the_cap_is_a_permanent_400_under_reject(engine: Engine) -> None:
    engine.put_topic("t", ConfigPatch(cap_bytes=4, discard=Discard.REJECT))
    error = refused(ErrorCode.RECORD_TOO_LARGE, engine.append, "t", [rec("toolong")])
    assert error.status == 400


def test_write_larger_than_the_cap_under_old_is_stored_then_evicted(engine: Engine) -> None:
    engine.put_topic("t", ConfigPatch(cap_records=3))
    assert engine.append("t", [rec(i) for i in range(5)]).seqs == [1, 2, 3, 4, 5]
    page = engine.diff("t", 0)
    assert page.tombstone is not None and page.tombstone.gap_to == 2
    assert [r["$seq"] for r in page.records()] == [3, 4, 5]


def test_tombstone_shape_and_resume(engine: Engine) -> None:
    engine.put_topic("t", ConfigPatch(cap_records=3))
    for i in range(10):
        engine.append("t", [rec(i)])
    page = engine.diff("t", 2)
    assert page.tombstone is not None
    assert msgspec.to_builtins(page.tombstone) == {
        "$type": "tombstone",
        "$seq": 8,
        "gap_from": 3,
        "gap_to": 7,
        "reason": "cap",
        "missed_estimate": 5,
        "earliest_seq": 8,
        "head_seq": 10,
    }
    assert [r["$seq"] for r in page.records()] == [8, 9, 10]
    assert engine.diff("t", page.next_from_seq).tombstone is None
    # A cursor at earliest_seq - 1 has lost nothing.
    assert engine.diff("t", 7).tombstone is None


def test_resuming_from_a_hole_tombstone_meets_the_next_hole(engine: Engine) -> None:
    # Two holes (router dest ranges with no record) with the records around them gone,
    # so the front has passed both: the first hole's resume point must still lie
    # before the second, or a reader resuming from an SSE id would skip it silently.
    engine.append("t", [rec(i) for i in range(3)])  # 1..3
    engine.skip_derived("t", 5, "source_trim")  # 4..8
    engine.append("t", [rec(9, tag="gone")])  # 9
    engine.skip_derived("t", 5, "source_trim")  # 10..14
    engine.append("t", [rec(15)])  # 15
    engine.delete("t", before_seq=4)
    engine.delete("t", match=TagMatch.parse("gone"))
    assert engine.get_topic("t").earliest_seq == 15
    first = engine.diff("t", 3).tombstone
    assert first is not None and (first.gap_from, first.gap_to, first.seq) == (4, 8, 9)
    cursor, gaps, seqs = first.seq - 1, [], []  # what a reconnect with its SSE id reads
    while True:
        page = engine.diff("t", cursor, per_record=True)
        if page.tombstone is not None:
            gaps.append((page.tombstone.gap_from, page.tombstone.gap_to))
        seqs += page.seqs
        cursor = page.next_from_seq
        if page.caught_up:
            break
    assert gaps == [(10, 14)] and seqs == [15]


def test_mixed_reason(engine: Engine, clock: ManualClock) -> None:
    engine.put_topic("t", ConfigPatch(cap_records=2, ttl_ms=50))
    engine.append("t", [rec(1), rec(2)])
    engine.append("t", [rec(3)])  # 1 evicted by cap
    clock.advance(51)
    engine.append("t", [rec(4)])  # 2, 3 expired by ttl
    page = engine.diff("t", 0)
    assert page.tombstone is not None
    assert (page.tombstone.reason, page.tombstone.gap_to) == ("mixed", 3)


def test_deleted_gap_is_silent_but_advances_earliest(engine: Engine) -> None:
    engine.append("t", [rec(i) for i in range(5)])
    engine.delete("t", before_seq=4)
    state = engine.get_topic("t")
    assert (state.earliest_seq, state.evict_floor) == (4, 1)
    page = engine.diff("t", 0)
    assert page.tombstone is None and [r["$seq"] for r in page.records()] == [4, 5]


def test_recreated_without_epoch(engine: Engine) -> None:
    engine.append("t", [rec(i) for i in range(10)])
    engine.delete_topic("t")
    engine.append("t", [rec(i) for i in range(2)])
    page = engine.diff("t", 10)
    assert page.tombstone is not None
    assert (page.tombstone.reason, page.tombstone.gap_from, page.tombstone.gap_to) == (
        "recreated",
        1,
        2,
    )
    assert [r["$seq"] for r in page.records()] == [1, 2]


def test_recreated_with_epoch_even_below_head(engine: Engine) -> None:
    engine.append("t", [rec(i) for i in range(3)])
    old = engine.get_topic("t").epoch
    engine.delete_topic("t")
    engine.append("t", [rec(i) for i in range(5)])
    page = engine.diff("t", 1, epoch=old)
    assert page.tombstone is not None and page.tombstone.reason == "recreated"
    assert page.epoch != old and [r["$seq"] for r in page.records()] == [1, 2, 3, 4, 5]


def test_lowering_the_cap_evicts_now(engine: Engine) -> None:
    engine.append("t", [rec(i) for i in range(10)])
    state, _ = engine.put_topic("t", ConfigPatch(cap_records=4))
    assert (state.count, state.earliest_seq, state.evict_floor) == (4, 7, 7)


def test_chunks_are_reclaimed_whole(engine: Engine) -> None:
    engine.put_topic("t", ConfigPatch(cap_records=1000))
    for _ in range(100):
        engine.append("t", [rec(i) for i in range(1000)])
    topic = engine.kernel.existing("t")
    assert len(topic.chunks) <= 2  # old chunks dropped whole, not per-record deletes
    assert engine.get_topic("t").count == 1000


# --- docs/semantics/topics.md §6 node filter --------------------------------------------------


def test_node_filter_single_and_set(engine: Engine) -> None:
    engine.append("t", [rec(1, node="a"), rec(2, node="b"), rec(3), rec(4, node="c")])
    seqs = lambda page: [r["$seq"] for r in page.records()]  # noqa: E731
    assert seqs(engine.diff("t", 0, nodes=frozenset({"a"}))) == [2, 3, 4]
    assert seqs(engine.diff("t", 0, nodes=frozenset({"a", "c"}))) == [2, 3]
    assert seqs(engine.diff("t", 0, nodes=frozenset({"zz"}))) == [1, 2, 3, 4]
    page = engine.diff("t", 0, nodes=frozenset({"a", "b"}), limit=2)
    assert page.records() == [] and page.next_from_seq == 2 and page.tombstone is None


def test_dedupe_node_false_disables_the_filter(engine: Engine) -> None:
    engine.put_topic("t", ConfigPatch(dedupe_node=False))
    engine.append("t", [rec(1, node="a")])
    assert len(engine.diff("t", 0, nodes=frozenset({"a"})).records()) == 1


# --- docs/semantics/topics.md §7 deletion -----------------------------------------------------


def test_delete_needs_a_selector(engine: Engine) -> None:
    engine.append("t", [rec()])
    refused(ErrorCode.INVALID_REQUEST, engine.delete, "t")
    # (["tag", "Glob", "x"] is a glob without wildcards now: docs/globs.md)
    for bad in (["tag", "Glob", 5], ["tag", "Re", "x"], ["seq", "Eq", "x"], 5, ["tag", "Eq"]):
        refused(ErrorCode.INVALID_REQUEST, TagMatch.parse, bad)


def test_tag_eq_glob_and_combination(engine: Engine) -> None:
    tags = ["chat-42:1", "chat-42:2", "chat-420", "chat-4", "other", None, "chat-42:3"]
    engine.append("t", [rec(i, tag=t) for i, t in enumerate(tags)])
    assert (
        engine.delete(
            "t", match=TagMatch.parse(["tag", "Glob", "chat-42:*"]), before_seq=7
        ).response.deleted
        == 2
    )
    assert engine.delete("t", match=TagMatch.parse("chat-4")).response.deleted == 1
    result = engine.delete("t", match=TagMatch.parse(["tag", "Eq", "chat-42:3"])).response
    assert result.deleted == 1
    assert [r["$seq"] for r in engine.diff("t", 0).records()] == [3, 5, 6]
    # each of the three deletions took a seq of its own: 8, 9, 10
    assert (result.count, result.earliest_seq, result.head_seq) == (3, 3, 10)


def test_delete_is_point_in_time(engine: Engine) -> None:
    engine.append("t", [rec(1, tag="x")])
    engine.delete("t", match=TagMatch.parse("x"))
    engine.append("t", [rec(2, tag="x")])
    assert [r["$seq"] for r in engine.diff("t", 0).records()] == [3]  # 2: the deletion's seq


def test_a_deletion_that_removes_anything_takes_a_seq_born_deleted(engine: Engine) -> None:
    """docs/semantics/topics.md §7.1: the deletion's own seq is silent to readers and
    counts nowhere; a deletion that removes nothing takes none."""
    engine.append("t", [rec(i, tag=t) for i, t in enumerate(["a", "b", None])])
    assert engine.delete("t", match=TagMatch.parse("zzz")).response.head_seq == 3
    assert engine.delete("t", before_seq=1).response.head_seq == 3
    result = engine.delete("t", match=TagMatch.parse("a")).response
    assert (result.deleted, result.head_seq, result.earliest_seq, result.count) == (1, 4, 2, 2)
    page = engine.diff("t", 0)
    assert [r["$seq"] for r in page.records()] == [2, 3]
    assert page.tombstone is None and page.next_from_seq == 4 and page.caught_up
    assert engine.diff("t", 3).tombstone is None and engine.diff("t", 3).next_from_seq == 4
    engine.delete("t", before_seq=5)  # everything: the slot 5 is taken, nothing is live
    state = engine.get_topic("t")
    assert (state.head_seq, state.earliest_seq, state.count, state.bytes) == (5, 6, 0, 0)
    assert engine.append("t", [rec(9)]).seqs == [6]
    assert [r["$seq"] for r in engine.diff("t", 0).records()] == [6]


def test_delete_prunes_the_tag_index(engine: Engine) -> None:
    engine.append("t", [rec(i, tag=f"k{i % 2}") for i in range(6)])
    topic = engine.kernel.existing("t")
    engine.delete("t", match=TagMatch.parse("k0"))
    assert "k0" not in topic.tag_index and list(topic.tag_index["k1"]) == [2, 4, 6]
    engine.delete("t", match=TagMatch.parse("k1"), before_seq=5)
    assert list(topic.tag_index["k1"]) == [6]


def test_delete_never_counts_already_gone_records(engine: Engine) -> None:
    engine.put_topic("t", ConfigPatch(cap_records=2))
    for i in range(5):
        engine.append("t", [rec(i, tag="x")])
    assert engine.delete("t", match=TagMatch.parse("x")).response.deleted == 2
    assert engine.delete("t", before_seq=100).response.deleted == 0


def test_listener_sees_every_commit(engine: Engine) -> None:
    seen: list[str] = []
    engine.add_listener(seen.append)
    engine.put_topic("a", ConfigPatch())
    engine.append("b", [rec()])
    engine.delete("b", before_seq=5)
    engine.delete_topic("a")
    with pytest.raises(TopicError):
        engine.append("b", [rec("x" * (2 << 20))])
    assert seen == ["a", "b", "b", "a"]


def test_per_record_pages(engine: Engine) -> None:
    engine.append("t", [rec(i) for i in range(3)])
    page = engine.diff("t", 0, per_record=True)
    assert page.seqs == [1, 2, 3] and len(page.runs) == 3
    assert orjson.loads(bytes(page.runs[1])[:-1])["data"] == 1
