"""Segments and seals: sealing, delete flags, whole-segment drops, WAL trimming,
recovery from segments + WAL, and crashes at every step of a seal."""

from __future__ import annotations

import struct
from pathlib import Path

import msgspec
import numpy as np
import orjson
import pytest
import xxhash

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Engine, RecordIn, TagMatch, TopicType
from waymark.log import chunk as chunk_module
from waymark.log.config import StorageConfig
from waymark.log.storage.catalog import CATALOG
from waymark.log.storage.restore import open_engine
from waymark.log.storage.seal import TOPICS
from waymark.log.storage.segment import SealedChunk, SegmentError
from waymark.log.storage.store import Store


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunk_module, "CHUNK_RECORDS", 10)


def reopen(
    data_dir: Path,
    cold_dir: Path | None = None,
    hot_segments: int = 4,
    clock: ManualClock | None = None,
) -> tuple[Engine, Store]:
    storage = StorageConfig(data_dir, cold_dir=cold_dir, hot_segments=hot_segments)
    engine, store, _ = open_engine(storage, clock=clock)
    return engine, store


def crash(store: Store) -> None:
    """Stop as a SIGKILL would after the last sync: no exact heads, no final seal."""
    store.sync_blocking()
    store.close()


def everything(engine: Engine, topic: str) -> tuple[list[dict], list[dict]]:
    records, tombstones, cursor = [], [], 0
    while True:
        page = engine.diff(topic, cursor, limit=7)
        records += page.records()
        if page.tombstone:
            tombstones.append(msgspec.to_builtins(page.tombstone))
        cursor = page.next_from_seq
        if page.caught_up:
            return records, tombstones


def data_frames(path: Path) -> list[tuple[int, dict, int, int]]:
    """(seq, record, flag byte, the flag's file offset) of every record of a ``.data``
    file, parsed here from the layout docs/durability.md documents — the records' wire
    JSON one after the other, each with its comma, then a delete flag byte per record;
    the record count and the records' XXH3 in the ``.idx`` — so a wrong offset helper in
    the code cannot hide a wrong layout on disk."""
    raw = path.read_bytes()
    idx = path.with_suffix(".idx").read_bytes()
    magic, version, _, n = struct.unpack_from("<4sIQI", idx)
    assert (magic, version) == (b"WMIX", 2)
    records = raw[: len(raw) - n]
    (checksum,) = struct.unpack_from("<Q", idx, len(idx) - 16)  # then the index's own
    assert checksum == xxhash.xxh3_64_intdigest(records), "the records' checksum is wrong"
    assert records.endswith(b",") or not n
    parsed = orjson.loads(b"[" + records[:-1] + b"]") if n else []
    assert len(parsed) == n, "the records and the flags do not add up"
    flags_at = len(raw) - n
    return [(r["$seq"], r, raw[flags_at + i], flags_at + i) for i, r in enumerate(parsed)]


def segment_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / TOPICS).glob("*/*.data"))


def wal_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "wal").glob("*/*.wal"))


def test_a_seal_serves_from_mmap_and_recovers(tmp_path: Path) -> None:
    engine, store = reopen(tmp_path)
    for i in range(35):
        engine.append("t", [RecordIn.of({"i": i}, tag=f"k{i % 3}", node=f"n{i % 2}")])
    before, _ = everything(engine, "t")
    store.seal(engine)
    topic = engine.kernel.existing("t")
    assert all(isinstance(c, SealedChunk) for c in topic.chunks)
    assert len(segment_files(tmp_path)) == 4
    assert everything(engine, "t")[0] == before  # reads come from the segments now
    for i in range(35, 40):  # a tail in the WAL after the seal
        engine.append("t", [RecordIn.of({"i": i}, tag="k0")])
    full, _ = everything(engine, "t")
    crash(store)
    engine, store = reopen(tmp_path)
    assert everything(engine, "t")[0] == full
    state = engine.get_topic("t")
    assert state.count == 40 and state.head_seq >= 40  # a crash resumes at the ceiling
    # Node filters and tag deletes work on sealed records (tables travel with segments).
    page = engine.diff("t", 0, nodes=frozenset({"n0"}), limit=100)
    assert all(r.get("$node") != "n0" for r in page.records())
    assert engine.delete("t", match=TagMatch.parse("k1")).response.deleted == 12
    crash(store)


def test_topics_with_the_longest_names_seal_and_recover(tmp_path: Path) -> None:
    # 255 characters is a valid name (docs/semantics/topics.md §2.1); a queue's leases
    # log adds a suffix to it.
    log, queue = "L" + "-" * 253 + "g", "Q" + ":" * 253 + "q"
    engine, store = reopen(tmp_path)
    engine.put_topic(queue, ConfigPatch(), TopicType.QUEUE)
    for i in range(15):
        engine.append(log, [RecordIn.of(i)])
        engine.append(queue, [RecordIn.of(i)])
    claimed = [job.seq for job in engine.claim(queue, "w", 3)]
    store.seal(engine)
    assert all(len(p.parent.name) <= 255 for p in segment_files(tmp_path))
    crash(store)
    engine, store = reopen(tmp_path)
    for name in (log, queue):
        assert [r["data"] for r in everything(engine, name)[0]] == list(range(15))
    assert engine.queues.counts(engine.kernel.existing(queue)).in_flight == len(claimed)
    crash(store)


def test_deleted_sealed_records_survive_a_wal_trim_and_restart(tmp_path: Path) -> None:
    engine, store = reopen(tmp_path)
    for i in range(20):
        engine.append("t", [RecordIn.of(i, tag=f"k{i % 2}")])
    store.seal(engine)
    engine.delete("t", match=TagMatch.parse("k0"))
    store.seal(engine)  # flips the flags, then trims the WAL that held the Delete frame
    sealed = engine.kernel.existing("t").chunks[0]
    assert isinstance(sealed, SealedChunk)
    frames = data_frames(sealed.data_path)
    assert [(seq, record["data"]) for seq, record, _, _ in frames] == [
        (i + 1, i) for i in range(10)]  # fmt: skip
    # Deleted: exactly 0xD5; live: the 0x00 the segment was written with.
    assert [flag for _, _, flag, _ in frames] == [0xD5 if i % 2 == 0 else 0 for i in range(10)]
    assert all(len(p.read_bytes()) < 200 for p in wal_files(tmp_path))  # only the new tail
    crash(store)
    engine, store = reopen(tmp_path)
    assert [r["data"] for r in everything(engine, "t")[0]] == list(range(1, 20, 2))
    crash(store)


def test_any_flag_value_but_the_sentinel_reads_live(tmp_path: Path) -> None:
    engine, store = reopen(tmp_path)
    for i in range(10):
        engine.append("t", [RecordIn.of(i)])
    store.seal(engine)
    sealed = engine.kernel.existing("t").chunks[0]
    data = bytearray(sealed.data_path.read_bytes())
    positions = [at for _, _, _, at in data_frames(sealed.data_path)[:3]]
    for position, value in zip(positions, (0xD4, 0x01, 0xD5), strict=True):
        data[position] = value  # a torn flip leaves some other byte: still live
    crash(store)
    sealed.data_path.write_bytes(bytes(data))
    engine, store = reopen(tmp_path)
    assert [r["data"] for r in everything(engine, "t")[0]] == [0, 1, *range(3, 10)]
    crash(store)


def test_whole_segments_drop_when_deleted_or_evicted(tmp_path: Path) -> None:
    engine, store = reopen(tmp_path)
    for i in range(30):
        engine.append("t", [RecordIn.of(i, tag="middle" if 10 <= i < 20 else None)])
    store.seal(engine)
    assert len(segment_files(tmp_path)) == 3
    engine.delete("t", match=TagMatch.parse("middle"))  # clears the middle segment exactly
    store.seal(engine)
    assert [p.stem for p in segment_files(tmp_path)] == [f"{1:020d}", f"{21:020d}"]
    engine.put_topic("t", ConfigPatch(cap_records=5))  # evicts the first segment and more
    store.seal(engine)
    assert [p.stem for p in segment_files(tmp_path)] == [f"{21:020d}"]
    crash(store)
    engine, store = reopen(tmp_path)
    records, tombstones = everything(engine, "t")
    assert [r["data"] for r in records] == list(range(25, 30))
    assert tombstones[0]["reason"] == "cap"
    crash(store)


def test_ttl_and_state_survive_seals(tmp_path: Path) -> None:
    clock = ManualClock()
    engine, store = reopen(tmp_path, clock=clock)
    engine.put_topic("t", ConfigPatch(ttl_ms=1000, idempotency_window_ms=60_000))
    for i in range(12):
        engine.append("t", [RecordIn.of(i, id=f"id{i}")])
        clock.advance(100)
    store.seal(engine)
    crash(store)
    engine, store = reopen(tmp_path, clock=clock)
    assert engine.append("t", [RecordIn.of(0, id="id11")]).seqs == [12]  # dedupe survived
    clock.advance(500)  # seqs 1..7 (ts < now - 1000) have now expired
    records, tombstones = everything(engine, "t")
    assert records[0]["$seq"] == 8 and tombstones[0]["reason"] == "ttl"
    crash(store)


@pytest.mark.parametrize("step", ["segments", "flips", "catalog", "trim"])
def test_a_crash_at_any_step_of_a_seal_recovers(tmp_path: Path, step: str) -> None:
    engine, store = reopen(tmp_path)
    for i in range(25):
        engine.append("t", [RecordIn.of(i, tag=f"k{i % 2}")])
    store.seal(engine)
    for i in range(25, 40):
        engine.append("t", [RecordIn.of(i, tag=f"k{i % 2}")])
    engine.delete("t", match=TagMatch.parse("k0"))
    expected, _ = everything(engine, "t")
    sealer = store.sealer
    plan = sealer.begin(engine)
    store.sync_blocking()
    # Do the write step only up to ``step``, as a process killed there would.
    if step in ("flips", "catalog", "trim"):
        from waymark.log.storage.segment import write_segment

        for new in plan.new:
            new.directory.mkdir(parents=True, exist_ok=True)
            write_segment(new.directory, new.chunk, new.dead, sealer.fileio, new.buf)
    else:
        plan.new[0].directory.mkdir(parents=True, exist_ok=True)
        (plan.new[0].directory / f"{plan.new[0].chunk.base_seq:020d}.data.tmp").write_bytes(b"x")
    if step in ("catalog", "trim"):
        from waymark.log.storage.segment import flip_deleted

        for chunk, dead in plan.flips:
            flip_deleted(chunk, dead, sealer.fileio)
    if step == "trim":
        from waymark.log.storage.catalog import write_catalog

        write_catalog(tmp_path, plan.catalog, sealer.fileio)
    crash(store)
    engine, store = reopen(tmp_path)
    assert everything(engine, "t")[0] == expected
    store.seal(engine)  # and the next seal completes from there
    crash(store)
    engine, store = reopen(tmp_path)
    assert everything(engine, "t")[0] == expected
    assert not list((tmp_path / TOPICS).glob("*/*.tmp"))
    crash(store)


def test_a_damaged_segment_index_refuses_to_start(tmp_path: Path) -> None:
    engine, store = reopen(tmp_path)
    for i in range(10):
        engine.append("t", [RecordIn.of(i)])
    store.seal(engine)
    crash(store)
    idx = next((tmp_path / TOPICS).glob("*/*.idx"))
    data = bytearray(idx.read_bytes())
    data[30] ^= 0xFF
    idx.write_bytes(bytes(data))
    with pytest.raises(SegmentError, match="checksum"):
        open_engine(StorageConfig(tmp_path))
    assert (tmp_path / CATALOG).exists()


def test_the_cold_tier_takes_older_segments_and_reads_stay_the_same(tmp_path: Path) -> None:
    data, cold = tmp_path / "data", tmp_path / "cold"
    engine, store = reopen(data, cold_dir=cold, hot_segments=2)
    for i in range(60):
        engine.append("t", [RecordIn.of(i, tag=f"k{i % 2}")])
    expected, _ = everything(engine, "t")
    store.seal(engine)  # seals six segments, hot
    assert len(segment_files(data)) == 6 and not list(cold.glob("*/*.data"))
    report = store.seal(engine)  # the four older ones move to the cold tier
    assert report.segments_cooled == 4
    assert len(segment_files(data)) == 2 and len(list(cold.glob("*/*.data"))) == 4
    assert everything(engine, "t")[0] == expected
    # A deletion reaches cold segments too: their flags are flipped in the cold copy.
    engine.delete("t", match=TagMatch.parse("k0"))
    store.seal(engine)
    first = engine.kernel.existing("t").chunks[0]
    assert isinstance(first, SealedChunk) and first.data_path.is_relative_to(cold)
    assert [flag for _, _, flag, _ in data_frames(first.data_path)] == [
        0xD5 if i % 2 == 0 else 0 for i in range(10)]  # fmt: skip
    crash(store)
    engine, store = reopen(data, cold_dir=cold, hot_segments=2)
    assert [r["data"] for r in everything(engine, "t")[0]] == list(range(1, 60, 2))
    crash(store)
    with pytest.raises(SegmentError, match="cold"):
        open_engine(StorageConfig(data))  # without its cold tier the topic cannot be whole


def as_format_1(data_path: Path) -> None:
    """Rewrite a segment as format 1 wrote it (docs/durability.md): a frame per record,
    ``u32 length | u64 seq | wire JSON | u64 XXH3(seq + JSON) | u8 delete flag``, and an
    index of version 1 whose offsets point at each JSON, with no records' checksum."""
    idx_path = data_path.with_suffix(".idx")
    idx, raw = idx_path.read_bytes(), data_path.read_bytes()
    _, _, base, n = struct.unpack_from("<4sIQI", idx)
    offsets = np.frombuffer(idx, np.uint64, n, 20).tolist()
    lens = np.frombuffer(idx, np.uint32, n, 20 + 8 * n)
    flags = raw[len(raw) - n :]
    frames, at = [], []
    for i, (offset, length) in enumerate(zip(offsets, lens.tolist(), strict=True)):
        body = struct.pack("<Q", base + i) + raw[offset : offset + length]
        at.append(sum(map(len, frames)) + 12)
        tail = struct.pack("<Q", xxhash.xxh3_64_intdigest(body)) + flags[i : i + 1]
        frames.append(struct.pack("<I", len(body) + 9) + body + tail)
    rest = idx[20 + 12 * n : -16]  # ts, sizes, nodes, tags and the name tables
    old = struct.pack("<4sIQI", b"WMIX", 1, base, n) + np.array(at, np.uint64).tobytes()
    old += lens.tobytes() + rest
    idx_path.write_bytes(old + struct.pack("<Q", xxhash.xxh3_64_intdigest(old)))
    data_path.write_bytes(b"".join(frames))


def format_1_flags(data_path: Path) -> list[int]:
    raw, flags, offset = data_path.read_bytes(), [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        flags.append(raw[offset + 4 + length - 1])
        offset += 4 + length
    return flags


def test_a_data_directory_of_format_1_segments_is_read_and_deleted_from(tmp_path: Path) -> None:
    """Segments sealed before format 2 stay readable; a delete flips their flags where
    format 1 keeps them, and new seals write format 2 beside them."""
    engine, store = reopen(tmp_path)
    for i in range(20):
        engine.append("t", [RecordIn.of(i, tag=f"k{i % 2}")])
    store.seal(engine)  # two segments of ten
    crash(store)
    old = sorted((tmp_path / TOPICS).glob("*/*.data"))
    for data in old:
        as_format_1(data)
    engine, store = reopen(tmp_path)
    assert [r["data"] for r in everything(engine, "t")[0]] == list(range(20))
    engine.delete("t", match=TagMatch.parse("k0"))
    for i in range(20, 25):
        engine.append("t", [RecordIn.of(i)])
    store.seal(engine)
    crash(store)
    assert [format_1_flags(data) for data in old] == [[0xD5, 0] * 5] * 2
    versions = [struct.unpack_from("<4sIQI", idx.read_bytes())[1]
                for idx in sorted((tmp_path / TOPICS).glob("*/*.idx"))]  # fmt: skip
    assert versions == [1, 1, 2]
    engine, store = reopen(tmp_path)
    assert [r["data"] for r in everything(engine, "t")[0]] == [*range(1, 20, 2), *range(20, 25)]
    crash(store)
