"""The engine's hand-assembled wire bytes (the append and diff hot paths, a claimed
job, the SSE frames of a page) against the protocol types that define them: every
tombstone reason the engine emits, records of every shape and the empty page decode
with :mod:`waymark.protocol` and read back exactly what the engine holds.

Through HTTP and the shipped client the same is checked in tests/client/test_contract.py;
the random-operation version of the diff check runs in tests/log/test_no_silent_loss.py.
"""

from __future__ import annotations

import gc
from pathlib import Path

import msgspec
import orjson
import pytest

from waymark.client.events import RecordEvent, TombstoneEvent, Watch
from waymark.clock import ManualClock
from waymark.log import ConfigPatch, DiffResult, Engine, RecordIn, TopicType
from waymark.log.config import StorageConfig
from waymark.log.storage.restore import open_engine
from waymark.protocol import (
    AppendRequest,
    AppendResponse,
    DiffResponse,
    Durability,
    Job,
    Record,
    Tombstone,
    TombstoneReason,
    format_cursor,
    parse_cursor,
)
from waymark.server.sse import frame

PAGE = msgspec.json.Decoder(DiffResponse)
RAW_PAGE = msgspec.json.Decoder(DiffResponse[msgspec.Raw])


def check_page(result: DiffResult) -> DiffResponse:
    """``result``'s HTTP body decodes as the contract's page and loses nothing."""
    body = result.to_json()
    page = PAGE.decode(body)
    assert msgspec.to_builtins(page) == orjson.loads(body)
    assert page.tombstone == result.tombstone
    assert msgspec.to_builtins(page.records) == result.records()
    assert (page.next_from_seq, page.head_seq, page.earliest_seq, page.epoch) == (
        result.next_from_seq, result.head_seq, result.earliest_seq, result.epoch)  # fmt: skip
    assert (page.caught_up, page.durability) == (result.caught_up, result.durability)
    raw = RAW_PAGE.decode(body)
    assert [orjson.loads(bytes(r.data)) for r in raw.records] == [
        r["data"] for r in result.records()]  # fmt: skip
    return page


def check_frames(result: DiffResult) -> list[RecordEvent | TombstoneEvent]:
    """The SSE chunk of a (per-record) page, parsed by the client's stream parser."""
    watch = Watch("t", from_seq=0, node=None, epoch=None, cursor=None, max_retries=0)
    events = [e for line in frame(result).decode().split("\n") if (e := watch.feed(line))]
    records = result.records()
    tombstones = [e for e in events if isinstance(e, TombstoneEvent)]
    if result.tombstone is None:
        assert tombstones == []
    else:
        [event] = tombstones
        assert event is events[0] and event.tombstone == result.tombstone
        assert event.cursor == format_cursor(result.epoch, result.tombstone.seq - 1)
    delivered = [e for e in events if isinstance(e, RecordEvent)]
    assert [msgspec.to_builtins(e.record) for e in delivered] == records
    for event in delivered:
        assert parse_cursor(event.cursor) == (result.epoch, event.record.seq)
    return events


def diff(engine: Engine, topic: str, from_seq: int, **kwargs: object) -> Tombstone | None:
    """Read both ways (a diff page and SSE frames); the page's tombstone."""
    page = check_page(engine.diff(topic, from_seq, **kwargs))  # type: ignore[arg-type]
    check_frames(engine.diff(topic, from_seq, per_record=True, **kwargs))  # type: ignore[arg-type]
    return page.tombstone


def test_every_tombstone_reason_and_record_shape_decodes(tmp_path: Path) -> None:
    clock = ManualClock()
    engine = Engine(clock=clock)
    seen: dict[str, Tombstone] = {}

    def seen_as(reason: str, tombstone: Tombstone | None) -> None:
        assert tombstone is not None and tombstone.reason == reason
        seen[reason] = tombstone

    # Every optional key of a record, multi-byte text, and JSON kept as sent.
    shapes = [RecordIn(msgspec.Raw('{"a": [1, 2.5, null],\n "é": "✓"}'.encode())),
              RecordIn.of("plain", tag="t", node="n1", meta={"k": "v"}),
              RecordIn.of(None, meta={}), RecordIn.of([])]  # fmt: skip
    engine.append("shapes", shapes)
    assert diff(engine, "shapes", 0) is None
    assert check_page(engine.diff("shapes", 0, nodes=frozenset({"n1"}))).records[-1].data == []
    assert check_page(engine.diff("shapes", 4)).records == []  # the empty page

    engine.put_topic("cap", ConfigPatch(cap_records=2))
    engine.append("cap", [RecordIn.of(i) for i in range(4)])
    seen_as("cap", diff(engine, "cap", 0))

    engine.put_topic("ttl", ConfigPatch(ttl_ms=1000))
    engine.append("ttl", [RecordIn.of("old")])
    clock.advance(1001)
    engine.append("ttl", [RecordIn.of("new")])
    seen_as("ttl", diff(engine, "ttl", 0))

    engine.put_topic("mixed", ConfigPatch(ttl_ms=1000, cap_records=2))
    engine.append("mixed", [RecordIn.of("expires")])
    clock.advance(1001)
    engine.append("mixed", [RecordIn.of(i) for i in range(3)])  # one more than the cap
    seen_as("mixed", diff(engine, "mixed", 0))

    engine.append("again", [RecordIn.of(1), RecordIn.of(2)])
    old_epoch = engine.get_topic("again").epoch
    engine.delete_topic("again")
    engine.append("again", [RecordIn.of(3)])
    seen_as("recreated", diff(engine, "again", 2, epoch=old_epoch))

    engine.put_topic("source", ConfigPatch(cap_records=1))
    engine.put_router("r", "source", "dest")
    engine.append("source", [RecordIn.of(i) for i in range(3)])  # 1 and 2 go unforwarded
    engine.forward()
    seen_as("source_trim", diff(engine, "dest", 0))

    durable, store, _ = open_engine(StorageConfig(tmp_path), clock=clock)
    durable.put_topic("e", ConfigPatch(durability=Durability.EPHEMERAL))
    durable.append("e", [RecordIn.of(i) for i in range(3)])
    durable.close()
    store.sync_blocking()
    store.close()
    durable, store, _ = open_engine(
        StorageConfig(tmp_path), clock=clock
    )  # ephemeral records do not survive
    seen_as("lost", diff(durable, "e", 0))
    store.close()

    # Every reason the engine emits is a TombstoneReason, and every TombstoneReason is
    # emitted here: a new reason needs a case above.
    assert set(seen) == set(TombstoneReason)


def test_a_reason_from_a_newer_server_decodes_and_is_kept() -> None:
    body = msgspec.json.encode({"$type": "tombstone", "$seq": 5, "gap_from": 1, "gap_to": 4,
                                "reason": "from_seq_too_old", "missed_estimate": 4,
                                "earliest_seq": 5, "head_seq": 9})  # fmt: skip
    assert msgspec.json.decode(body, type=Tombstone).reason == "from_seq_too_old"
    watch = Watch("t", from_seq=0, node=None, epoch=None, cursor=None, max_retries=0)
    lines = ["event: tombstone", "id: 3:4", f"data: {body.decode()}", ""]
    [event] = [e for line in lines if (e := watch.feed(line))]
    assert isinstance(event, TombstoneEvent) and event.tombstone.reason == "from_seq_too_old"


def test_append_and_claim_bodies_decode() -> None:
    engine = Engine(clock=ManualClock())
    for durability in Durability:
        result = engine.append(f"a-{durability}", [RecordIn.of(1)] * 2,
                               config=ConfigPatch(durability=durability))  # fmt: skip
        decoded = msgspec.json.decode(orjson.dumps(result.to_wire()), type=AppendResponse)
        assert decoded == AppendResponse(result.seqs, result.head_seq, durability)
    engine.put_topic("q", ConfigPatch(), TopicType.QUEUE)
    engine.append("q", [RecordIn.of({"job": 1}, tag="t", node="n", meta={"k": "v"})])
    [claimed] = engine.claim("q", "worker", 1)
    job = msgspec.json.decode(claimed.to_json(), type=Job)
    assert (job.seq, job.lease_id, job.deadline, job.delivery) == (
        claimed.seq, claimed.lease_id, claimed.deadline, claimed.delivery)  # fmt: skip
    assert (job.data, job.tag, job.node, job.meta) == ({"job": 1}, "t", "n", {"k": "v"})
    assert isinstance(msgspec.json.decode(claimed.to_json(), type=Job[msgspec.Raw]), Record)


@pytest.mark.parametrize("bad", ["", "x", "1:", "-1", "1:-2", "²", "1:2:3"])
def test_a_malformed_cursor_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cursor(bad)


def test_a_writes_decoded_records_are_not_tracked_by_the_garbage_collector() -> None:
    """A server holds a write's records, thousands at once, while it appends them: were
    each tracked, a large write would promote them all and set off full collections,
    making a record cost more the larger its write (docs/http-api.md, Performance)."""
    body = b'{"records":[{"data":{"n":1},"id":"e/1","meta":{"wm.gen":"1","wm.event":"e"}}]}'
    (record,) = msgspec.json.decode(body, type=AppendRequest).records
    assert record.meta == {"wm.gen": "1", "wm.event": "e"}
    assert not gc.is_tracked(record)
    assert not gc.is_tracked(record.meta)
