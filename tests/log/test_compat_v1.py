"""Data written before the engine kernel refactor still opens, unchanged.

The fixtures were captured from the code before journal frames and catalog entries
became typed Structs: ``fixtures/frames_v1.json`` holds the bytes the old encoders
produced for every frame type, ``fixtures/datadir_v1`` a data directory (a catalog
with segments plus a WAL tail, left as by a crash), and ``fixtures/expected_v1.json``
what an engine recovered from it showed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import orjson

from waymark.clock import ManualClock
from waymark.log import Engine, TagMatch, lease_events
from waymark.log.config import StorageConfig
from waymark.log.journal import (
    DeleteFrame,
    DropFrame,
    HeadFrame,
    RecordsFrame,
    RouterDefinition,
    RouterFrame,
    TopicFrame,
    WriterFrame,
    decode,
    records_frame,
)
from waymark.log.lease_events import (
    Acked,
    Claimed,
    DeadLettered,
    Extended,
    LeaseEvent,
    Parked,
    Released,
)
from waymark.log.origin import Published
from waymark.log.records import encode_batch
from waymark.log.storage.catalog import CATALOG, read_catalog
from waymark.log.storage.frames import FrameKind, encode, scan
from waymark.log.storage.restore import open_engine
from waymark.protocol import ConfigPatch, Durability, Limits, RecordIn, TopicConfig, TopicType

FIXTURES = Path(__file__).parent / "fixtures"


def observe(data_dir: Path, work: Path) -> dict[str, Any]:
    """Every topic's state and records, and the routers, of the engine recovered from a
    copy of ``data_dir`` (recovery trims and cleans the directory it opens)."""
    shutil.copytree(data_dir, work)
    engine, store, _ = open_engine(StorageConfig(work), clock=ManualClock(1_700_000_100_000))
    if engine.replaying is not None:
        engine.replaying.finish_all()
    states = engine.list_topics()
    seen: dict[str, Any] = {"topics": orjson.loads(msgspec.json.encode(states)), "diffs": {}}
    for state in states:
        seen["diffs"][state.name] = orjson.loads(engine.diff(state.name, 0, limit=10_000).to_json())
    seen["routers"] = orjson.loads(msgspec.json.encode(engine.list_routers()))
    seen["writer_epoch"] = engine.writers.open_writer("w1")
    store.close()
    return seen


def test_a_v1_data_dir_recovers_as_before(tmp_path: Path) -> None:
    expected = json.loads((FIXTURES / "expected_v1.json").read_text())
    seen = observe(FIXTURES / "datadir_v1", tmp_path / "data")
    # Fields the topic state gained after the fixture was captured: nothing waits for a
    # sync after recovery, so the assigned head is the readable one, and no group commit
    # has been timed yet.
    for state in seen["topics"]:
        assert state.pop("assigned_head_seq") == state["head_seq"]
        assert state.pop("fsync_ms") == 0
        if state.get("queue"):  # the oldest lease: present exactly when jobs are leased
            deadline = state["queue"].pop("earliest_lease_deadline")
            assert (deadline is not None) == (state["queue"]["in_flight"] > 0)
    assert seen == expected


def _frame_cases() -> dict[str, bytes]:
    """Each frame type built with today's code, from the inputs the fixture's bytes were
    made from."""
    limits = Limits()
    recs = encode_batch([RecordIn.of({"a": 1}, tag="t", node="n", id="i1"), RecordIn.of([1, 2]),
                         RecordIn.of("x", meta={"k": "v"})], limits)  # fmt: skip
    recs_noid = encode_batch([RecordIn.of(1), RecordIn.of({"b": None}, tag="z")], limits)
    fsync = TopicConfig().apply(ConfigPatch(durability=Durability.FSYNC, cap_records=10))
    router = {"name": "r", "source": "a", "dest": "b", "preserve_node": True,
              "preserve_tag": False, "allow_cycle": False, "guarantee": "at_least_once",
              "created_ts": 5, "source_epoch": 1, "dest_epoch": 2, "cursor": 7,
              "filter": {"tag": ["x"]}}  # fmt: skip
    return {
        "topic": TopicFrame.of("t1", TopicType.LOG, 3, TopicConfig(), 100, now=150).encode(),
        "topic_now_none": TopicFrame.of("q1", TopicType.QUEUE, 4, fsync, 100).encode(),
        "drop": DropFrame("t1", 3).encode(),
        "head": HeadFrame("t1", 3, 4099).encode(),
        "writer": WriterFrame("w1", 2).encode(),
        "router": RouterFrame("r", RouterDefinition(**router)).encode(),
        "router_delete": RouterFrame("r", None).encode(),
        "delete_before": DeleteFrame.of("t1", 3, 10, None, 10, now=200).encode(),
        "delete_match": DeleteFrame.of("t1", 3, None, TagMatch(True, "x"), 12, now=201).encode(),
        "delete_match_prefix": DeleteFrame.of("t1", 3, 5, TagMatch(False, "pre*"), 5).encode(),
        "delete_seqs": DeleteFrame.of("t1", 3, None, None, 0, [1, 4, 9]).encode(),
        "records": records_frame("t1", 3, 1, 1000, recs, None, now=1001),
        "records_noid_extra": records_frame(
            "t1", 3, 4, 1002, recs_noid, Published("w1", 7), now=1003
        ),
    }


def test_every_frame_type_encodes_to_the_v1_bytes() -> None:
    expected = {k: bytes.fromhex(v) for k, v in
                json.loads((FIXTURES / "frames_v1.json").read_text()).items()}  # fmt: skip
    assert _frame_cases() == expected


def test_every_v1_frame_decodes_and_re_encodes_to_its_bytes() -> None:
    for name, hexed in json.loads((FIXTURES / "frames_v1.json").read_text()).items():
        data = bytes.fromhex(hexed)
        (frame,), _ = scan(data, Path(name))
        entry = decode(frame)
        if isinstance(entry, RecordsFrame):
            again = records_frame(entry.name, entry.epoch, entry.first_seq, entry.ts,
                                  entry.records, entry.publish, now=entry.now)  # fmt: skip
        else:
            again = entry.encode()
        assert again == data, name


def test_the_v1_catalog_decodes_and_re_encodes_to_its_bytes() -> None:
    data = (FIXTURES / "datadir_v1" / CATALOG).read_bytes()
    catalog = read_catalog(FIXTURES / "datadir_v1")
    assert catalog is not None and catalog.topics and catalog.routers
    assert encode(FrameKind.CATALOG, msgspec.json.encode(catalog)) == data


def _lease_event_cases() -> dict[str, LeaseEvent]:
    """Each lease event kind, from the inputs ``fixtures/lease_events_v1.json`` (the
    bytes the dict events made, captured before they were typed) was made from."""
    lease = "0123456789abcdef"
    return {
        "claimed": Claimed(3, 17, "node-a", lease, 1_700_000_030_000, 1, 2),
        "extended": Extended(3, 17, "node-a", lease, 1_700_000_060_000, 1, 2),
        "released": Released(3, 17, "", "", 1_700_000_061_000, 2, 2),
        "acked": Acked(3, 18, 'nø"de\n\u2603', "fedcba9876543210", 1_700_000_000_005, 3, 2),
        "dead_lettered": DeadLettered(3, 19, "n", "aa", 5, 4, 3),
        "parked": Parked(3, 20, "", "", 0, 9, 2),
    }


def test_every_lease_event_encodes_to_the_v1_bytes_and_back() -> None:
    expected = {k: bytes.fromhex(v) for k, v in
                json.loads((FIXTURES / "lease_events_v1.json").read_text()).items()}  # fmt: skip
    cases = _lease_event_cases()
    assert {k: lease_events.encode(e) for k, e in cases.items()} == expected
    for name, data in expected.items():
        stored = b'{"seq":4,"ts":1,"data":%b}' % data  # as the leases log returns it
        assert lease_events.decode_stored(stored) == cases[name], name


def test_the_writers_snapshot_round_trips_to_the_v1_catalog_bytes() -> None:
    # The publish ledger is the exactly-once guarantee: restored from the v1 catalog and
    # snapshotted again, it is the same bytes.
    (frame,), _ = scan((FIXTURES / "datadir_v1" / CATALOG).read_bytes(), Path(CATALOG))
    raw = msgspec.json.decode(frame.payload, type=dict[str, msgspec.Raw])["staging"]
    catalog = read_catalog(FIXTURES / "datadir_v1")
    assert catalog is not None and catalog.writers.ledgers
    writers = Engine().writers
    writers.restore(catalog.writers)
    assert msgspec.json.encode(writers.snapshot()) == bytes(raw)
