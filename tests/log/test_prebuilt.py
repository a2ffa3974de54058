"""A large append's chunks and journal frame built ahead, off the event loop
(waymark.log.prebuilt): adopted only when nothing moved the topic meanwhile, and then
the same append, byte for byte, as one the engine lays out itself."""

from __future__ import annotations

import operator
from itertools import pairwise
from pathlib import Path
from typing import Any
from unittest.mock import patch

import msgspec
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Durability, Engine, ErrorCode, RecordIn, TopicError
from waymark.log import chunk as chunk_module
from waymark.log.chunk import Chunk, PendingChunk
from waymark.log.config import StorageConfig
from waymark.log.journal import BodyRun, records_frame_parts
from waymark.log.origin import Published
from waymark.log.prebuilt import Layout, build
from waymark.log.records import EncodedRecord, PlainRecords, encode_batch, plain_records
from waymark.log.staged import resolve
from waymark.log.storage import frames
from waymark.log.storage.restore import open_engine
from waymark.log.storage.store import Store
from waymark.log.writers import PartKey
from waymark.protocol import Limits

# More records than one chunk holds.
RECORDS = [RecordIn(data=b'{"n":%d,"pad":"%b"}' % (i, b"x" * 64), tag=f"t{i % 3}")
           for i in range(20_000)]  # fmt: skip


def _open(data_dir: Path, clock: ManualClock) -> tuple[Engine, Store]:
    engine, store, _ = open_engine(StorageConfig(data_dir), clock=clock)
    return engine, store


def _shut(engine: Engine, store: Store) -> None:
    engine.close()
    store.sync_blocking()
    store.close()


def _page(engine: Engine, topic: str) -> list[dict]:
    out, from_seq = [], 0
    while True:
        page = engine.diff(topic, from_seq, limit=10_000)
        out += page.records()
        from_seq = page.next_from_seq
        if page.caught_up:
            return out


def _wal_frames(engine: Engine, store: Store, topic: str) -> list[bytes]:
    """The records frames of ``topic``'s WAL shard, once the engine is shut, as recovery
    reads them: a publish naming its stage frames as the records frame it stands for."""
    assert engine.journal is not None
    path = engine.journal.shard_of(topic).path  # type: ignore[attr-defined]
    _shut(engine, store)
    data = path.read_bytes()
    found, _ = frames.scan(data, path)
    return [bytes(f.payload) for _, f in resolve(path, data, found)
            if f.kind is frames.FrameKind.RECORDS]  # fmt: skip


def _wal_kinds(engine: Engine, topic: str) -> list[frames.FrameKind]:
    """The kinds of the frames in ``topic``'s WAL shard so far, as written."""
    assert engine.journal is not None
    engine.journal.sync_blocking()  # type: ignore[attr-defined]
    path = engine.journal.shard_of(topic).path  # type: ignore[attr-defined]
    return [f.kind for f in frames.read_file(path)[0]]


def test_an_adopted_prebuilt_append_is_the_append_it_replaces(tmp_path: Path) -> None:
    """Same seqs, pages and journal frame as the engine's own layout; and the records
    come back after a restart."""
    results, pages, journals = [], [], []
    for name, prebuilt in (("plain", False), ("prebuilt", True)):
        clock = ManualClock(1_000)
        engine, store = _open(tmp_path / name, clock)
        engine.put_topic("t", ConfigPatch(durability=Durability.DISK))
        # More records than one write carries: as a sink's publish may (not bound by it).
        encoded = encode_batch(RECORDS, engine.limits)
        built = None
        if prebuilt:
            built = build(engine.lay_out("t", encoded))
            assert len(built.chunks) == 2
            clock.advance(5)  # the bytes took a while: the ts proposed stays
        results.append(engine.append_encoded("t", encoded, prebuilt=built).seqs)
        pages.append(_page(engine, "t"))
        journals.append(_wal_frames(engine, store, "t"))
    assert results[0] == results[1] == list(range(1, len(RECORDS) + 1))
    assert pages[0] == pages[1] and {r["$ts"] for r in pages[1]} == {1_000}
    assert journals[0] == journals[1] and len(journals[1]) == 1  # one atomic frame
    reopened, store = _open(tmp_path / "prebuilt", ManualClock(2_000))
    assert _page(reopened, "t") == pages[1]
    _shut(reopened, store)


def test_a_prebuilt_append_to_a_topic_it_creates(tmp_path: Path) -> None:
    engine, store = _open(tmp_path, ManualClock(1_000))
    encoded = engine.encode(RECORDS[:100])
    built = build(engine.lay_out("new", encoded))
    result = engine.append_encoded("new", encoded, prebuilt=built)
    assert result.created and result.seqs == list(range(1, 101))
    assert engine.get_topic("new").epoch == built.layout.epoch
    assert [r["data"]["n"] for r in _page(engine, "new")] == list(range(100))
    _shut(engine, store)


def test_a_stale_prebuilt_append_is_laid_out_again(tmp_path: Path) -> None:
    """Another append, a drop and recreate, or another topic created in between: the
    engine ignores the prebuilt bytes and appends at the seqs it hands out now."""
    clock = ManualClock(1_000)
    engine, store = _open(tmp_path, clock)
    encoded = engine.encode(RECORDS[:100])
    engine.put_topic("t", ConfigPatch())
    # Another append meanwhile.
    built = build(engine.lay_out("t", encoded))
    engine.append("t", [RecordIn(data=b'{"other":1}')])
    clock.advance(3)
    assert engine.append_encoded("t", encoded, prebuilt=built).seqs == list(range(2, 102))
    page = _page(engine, "t")
    assert [r["$seq"] for r in page] == list(range(1, 102))
    assert page[0]["data"] == {"other": 1} and {r["$ts"] for r in page[1:]} == {1_003}
    # The topic dropped and recreated meanwhile: a new instance.
    built = build(engine.lay_out("t", encoded))
    engine.delete_topic("t")
    engine.put_topic("t", ConfigPatch())
    assert engine.append_encoded("t", encoded, prebuilt=built).seqs == list(range(1, 101))
    assert [r["$seq"] for r in _page(engine, "t")] == list(range(1, 101))
    # Laid out to create a topic, but another topic took the epoch meanwhile.
    built = build(engine.lay_out("fresh", encoded))
    engine.put_topic("other", ConfigPatch())
    result = engine.append_encoded("fresh", encoded, prebuilt=built)
    assert engine.get_topic("fresh").epoch == built.layout.epoch + 1
    assert result.seqs == list(range(1, 101)) and len(_page(engine, "fresh")) == 100
    _shut(engine, store)


def test_a_prebuilt_publish_is_the_publish_it_replaces(tmp_path: Path) -> None:
    """A sink batch's staged parts laid out and framed ahead: the same frame (with the
    publish mark), and after a restart the batch is still published once."""
    journals = []
    for name, prebuilt in (("plain", False), ("prebuilt", True)):
        engine, store = _open(tmp_path / name, ManualClock(1_000))
        epoch = engine.open_writer("sink")
        for partition in range(2):
            for chunk in range(3):
                lo = (partition * 3 + chunk) * 1_000
                engine.stage("out", "sink", epoch, 7, PartKey(partition, 0),
                             RECORDS[lo : lo + 1_000], chunk=chunk)  # fmt: skip
        parts = [(PartKey(0, 0), 3), (PartKey(1, 0), 3)]
        built = None
        if prebuilt:
            layout = engine.lay_out_publish("out", "sink", epoch, 7, parts)
            assert layout is not None and len(layout.records) == 6_000
            built = build(layout)
        result = engine.publish("out", "sink", epoch, 7, parts, built)
        assert (result.first_seq, result.count, result.replayed) == (1, 6_000, False)
        assert engine.lay_out_publish("out", "sink", epoch, 7, parts) is None  # a replay
        journals.append(_wal_frames(engine, store, "out"))
    assert journals[0] == journals[1]
    engine, store = _open(tmp_path / "prebuilt", ManualClock(2_000))
    assert [r["data"]["n"] for r in _page(engine, "out")] == list(range(6_000))
    epoch = engine.open_writer("sink")
    replay = engine.publish("out", "sink", epoch, 7, [(PartKey(0, 0), 3), (PartKey(1, 0), 3)])
    assert (replay.first_seq, replay.count, replay.replayed) == (1, 6_000, True)
    _shut(engine, store)


def test_a_crash_between_stage_and_publish_and_after_it_publishes_once(
    tmp_path: Path,
) -> None:
    """The stages of a crashed server are gone: the publish is refused (not_found), the
    sink stages again and publishes once. A crash after the publish (its frame, laid out
    from the staged chunks' joined bodies, only in the WAL) keeps the batch exactly once:
    the same records come back and publishing it again appends nothing."""
    tagged = [RecordIn(data=r.data, tag=f"t{i % 3}", id=f"r{i}") for i, r in enumerate(RECORDS)]

    def stage_all(engine: Engine, epoch: int) -> list[tuple[PartKey, int]]:
        for chunk in range(4):  # the chunks span a chunk of the log (16,384 records)
            part = PartKey(chunk % 2, 0)
            lo = chunk * 5_000
            engine.stage("out", "sink", epoch, 3, part, tagged[lo : lo + 5_000],
                         chunk=chunk // 2)  # fmt: skip
        return [(PartKey(0, 0), 2), (PartKey(1, 0), 2)]

    engine, store = _open(tmp_path, ManualClock(1_000))
    # (No idempotency window: ids are kept, not deduplicated, so the runs are used.)
    engine.put_topic("out", ConfigPatch(durability=Durability.DISK, idempotency_window_ms=0))
    parts = stage_all(engine, engine.open_writer("sink"))
    store.sync_blocking()
    store.close()  # SIGKILL-like: no close, the stages were only in memory
    engine, store = _open(tmp_path, ManualClock(2_000))
    epoch = engine.open_writer("sink")
    try:
        engine.publish("out", "sink", epoch, 3, parts)
    except TopicError as refused:
        assert refused.code is ErrorCode.NOT_FOUND
    else:
        raise AssertionError("a publish of stages the crash took must be refused")
    assert engine.stage("out", "sink", epoch, 3, PartKey(0, 0), tagged[:1]) is True
    parts = stage_all(engine, epoch)  # the re-run task attempts (chunk 0 replaced again)
    layout = engine.lay_out_publish("out", "sink", epoch, 3, parts)
    assert layout is not None and layout.runs is not None
    first = engine.publish("out", "sink", epoch, 3, parts, build(layout))
    order = [
        *range(0, 5_000),
        *range(10_000, 15_000),
        *range(5_000, 10_000),
        *range(15_000, 20_000),
    ]  # fmt: skip  (partition 0's chunks, then 1's)
    want = [(tagged[i].tag, msgspec.json.decode(tagged[i].data)) for i in order]
    assert (first.first_seq, first.count) == (1, 20_000)
    assert [(r["$tag"], r["data"]) for r in _page(engine, "out")] == want
    t1 = [seq for seq, i in enumerate(order, 1) if tagged[i].tag == "t1"]
    assert list(engine.kernel.existing("out").tag_index["t1"]) == t1
    store.sync_blocking()
    store.close()  # a crash after the publish: its frame is only in the WAL
    engine, store = _open(tmp_path, ManualClock(3_000))
    assert [(r["$tag"], r["data"]) for r in _page(engine, "out")] == want
    assert list(engine.kernel.existing("out").tag_index["t1"]) == t1
    head = engine.get_topic("out").head_seq  # (past the crash's reserved seq ceiling)
    replay = engine.publish("out", "sink", engine.open_writer("sink"), 3, parts)
    assert (replay.first_seq, replay.count, replay.replayed) == (1, 20_000, True)
    assert engine.get_topic("out").head_seq == head
    assert [(r["$tag"], r["data"]) for r in _page(engine, "out")] == want
    _shut(engine, store)


def _plain(records: list[RecordIn]) -> PlainRecords:
    """``records`` (data alone) as the server's bulk stage path keeps them."""
    array = b"[" + b",".join(b'{"data":%b}' % r.data for r in records) + b"]"
    plain = plain_records(array, [r.data for r in records], Limits())
    assert plain is not None
    return plain


UNTAGGED = [RecordIn(data=r.data) for r in RECORDS]


def test_a_columnar_publish_is_the_publish_of_its_records(tmp_path: Path) -> None:
    """A sink batch staged as PlainRecords (no object per record) publishes, prebuilt or
    not, the very frame, pages and ledger the same records staged one object each do,
    and comes back so after a restart (docs/spark.md, "Sink speed")."""
    journals, pages = [], []
    for name, columnar, prebuilt in (("objects", False, False), ("columnar", True, False),
                                     ("columnar-prebuilt", True, True)):  # fmt: skip
        engine, store = _open(tmp_path / name, ManualClock(1_000))
        epoch = engine.open_writer("sink")
        for partition in range(2):
            for chunk in range(3):
                lo = (partition * 3 + chunk) * 3_000
                part = UNTAGGED[lo : lo + 3_000]
                engine.stage("out", "sink", epoch, 7, PartKey(partition, 0),
                             _plain(part) if columnar else part, chunk=chunk)  # fmt: skip
        parts = [(PartKey(0, 0), 3), (PartKey(1, 0), 3)]
        built = None
        if prebuilt:
            layout = engine.lay_out_publish("out", "sink", epoch, 7, parts)
            assert layout is not None and isinstance(layout.records, PlainRecords)
            built = build(layout)
        result = engine.publish("out", "sink", epoch, 7, parts, built)
        assert (result.first_seq, result.count, result.replayed) == (1, 18_000, False)
        if built is not None:  # adopted: the chunks are the ones built ahead
            assert engine.kernel.existing("out").chunks[0] is built.chunks[0]
            assert built.frame is None  # (the publish names its stages: no frame to build)
        # Columnar chunks are journaled as they are staged; the publish names them.
        kinds = _wal_kinds(engine, "out")
        stage, publish = frames.FrameKind.STAGE, frames.FrameKind.PUBLISH
        if columnar:
            assert kinds.count(stage) == 6 and kinds[-1] is publish
            assert frames.FrameKind.RECORDS not in kinds
        else:
            assert kinds[-1] is frames.FrameKind.RECORDS and stage not in kinds
        pages.append(_page(engine, "out"))
        journals.append(_wal_frames(engine, store, "out"))
    assert journals[0] == journals[1] == journals[2]
    assert pages[0] == pages[1] == pages[2]
    engine, store = _open(tmp_path / "columnar-prebuilt", ManualClock(2_000))
    assert _page(engine, "out") == pages[0]
    epoch = engine.open_writer("sink")
    replay = engine.publish("out", "sink", epoch, 7, [(PartKey(0, 0), 3), (PartKey(1, 0), 3)])
    assert (replay.first_seq, replay.count, replay.replayed) == (1, 18_000, True)
    _shut(engine, store)


def test_a_batch_mixing_columnar_and_tagged_chunks_keeps_its_order(tmp_path: Path) -> None:
    """A part whose chunks are columnar and a part with tags publish in part order, each
    record as staged; a columnar chunk staged again between the layout and the publish
    (an HTTP retry with other rows) is what is published: the layout is not adopted."""
    engine, store = _open(tmp_path, ManualClock(1_000))
    epoch = engine.open_writer("sink")
    engine.stage("out", "sink", epoch, 1, PartKey(0, 0), _plain(UNTAGGED[:2_000]))
    engine.stage("out", "sink", epoch, 1, PartKey(1, 0), RECORDS[2_000:4_000])
    engine.stage("out", "sink", epoch, 1, PartKey(1, 0), _plain(UNTAGGED[4_000:6_000]), chunk=1)
    parts = [(PartKey(0, 0), 1), (PartKey(1, 0), 2)]
    mixed = engine.lay_out_publish("out", "sink", epoch, 1, parts)
    assert mixed is not None and not isinstance(mixed.records, PlainRecords)
    result = engine.publish("out", "sink", epoch, 1, parts, build(mixed))
    assert (result.first_seq, result.count) == (1, 6_000)
    got = _page(engine, "out")
    assert [r["data"]["n"] for r in got] == list(range(6_000))
    assert [r.get("$tag") for r in got] == [None] * 2_000 + [
        r.tag for r in RECORDS[2_000:4_000]
    ] + [None] * 2_000
    engine.stage("out", "sink", epoch, 2, PartKey(0, 0), _plain(UNTAGGED[:1_000]))
    layout = engine.lay_out_publish("out", "sink", epoch, 2, [(PartKey(0, 0), 1)])
    assert layout is not None
    built = build(layout)
    engine.stage("out", "sink", epoch, 2, PartKey(0, 0), _plain(UNTAGGED[1_000:2_000]))
    engine.publish("out", "sink", epoch, 2, [(PartKey(0, 0), 1)], built)
    assert [r["data"]["n"] for r in _page(engine, "out")[6_000:]] == list(range(1_000, 2_000))
    _shut(engine, store)


# A publish built from its staged runs: the chunk size is cut down so that a few hundred
# records cross many chunk boundaries and run boundaries at every offset (CHUNK_RECORDS
# sizes the windows build cuts, and which are full; the chunks' bytes do not depend on it).
_RUNS = settings(max_examples=60, deadline=None, database=None, derandomize=True)
_MUTANT = settings(_RUNS, max_examples=200, phases=[Phase.explicit, Phase.generate])
_DATAS = st.lists(st.sampled_from([b"1", b'"x"', b'{"a":[1,2]}', b"null", b'"' + b"y" * 40 + b'"']),
                  min_size=1, max_size=300)  # fmt: skip
_CUTS = st.lists(st.integers(0, 300), max_size=6)


def _from_runs(datas: list[bytes], cuts: list[int], window: int, first: int,
               columnar: bool) -> None:  # fmt: skip
    """``build`` of the records staged in runs cut at ``cuts`` makes the chunks and the
    frame the one-record paths make, window by window, byte for byte."""
    encoded = [encode_batch([RecordIn(msgspec.Raw(d))], Limits())[0] for d in datas]
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(encoded)), len(encoded)]
    staged = [_plain([RecordIn(msgspec.Raw(d)) for d in datas[a:b]]) for a, b in pairwise(bounds)]
    records: list[EncodedRecord] | PlainRecords = encoded
    runs = None
    if columnar:
        records = PlainRecords.concat(staged)
    else:
        runs = [BodyRun.of(encoded[a:b]) for a, b in pairwise(bounds)]
    mark = Published("w", 3)
    layout = Layout("t", 1, first, 7, 7, records, sum(map(len, datas)), True, mark, runs)
    # (a columnar publish's full windows are pending chunks, laid out when first read —
    # here, by the comparison below)
    with patch.object(chunk_module, "CHUNK_RECORDS", window):
        built = build(layout)
    pending = [isinstance(c, PendingChunk) for c in built.chunks]
    assert pending == [columnar and c.n == window for c in built.chunks]
    expected = []
    for lo in range(0, len(encoded), window):
        chunk = Chunk(first + lo)
        for i, record in enumerate(encoded[lo : lo + window]):  # one record at a time
            chunk.extend(first + lo + i, 7, [record])
        expected.append(chunk)
    assert len(built.chunks) == len(expected)
    for got, want in zip(built.chunks, expected, strict=True):
        assert got.base_seq == want.base_seq
        for field in ("buf", "ends", "ts", "node", "tag", "size", "dead", "live"):
            assert getattr(got, field) == getattr(want, field), field
    assert built.frame is not None
    assert b"".join(built.frame) == b"".join(records_frame_parts("t", 1, first, 7, encoded, mark,
                                                                 now=7))  # fmt: skip
    if isinstance(records, PlainRecords):  # never joined whole: its parts are the runs'
        assert all(map(operator.is_, records.parts(), [run.bodies for run in staged]))


@_RUNS
@given(_DATAS, _CUTS, st.integers(1, 40), st.integers(1, 10**12), st.booleans())
def test_a_publish_built_from_its_staged_runs_is_built_as_one_record_at_a_time(
    datas: list[bytes], cuts: list[int], window: int, first: int, columnar: bool
) -> None:
    """A publish's chunks and frame, built from its staged runs (columnar and never
    joined whole, or one object each with their bodies' runs), are byte for byte what
    the one-record paths make, whatever the run and chunk boundaries (docs/spark.md,
    "Sink speed")."""
    _from_runs(datas, cuts, window, first, columnar)


def _reversed_parts(self: PlainRecords) -> list[bytes]:
    return list(reversed(_PARTS(self)))


def _reversed_column(self: PlainRecords) -> Any:
    import pyarrow as pa

    column = _COLUMN(self)
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array(list(reversed(column.chunks)), column.type)
    return column


_PARTS, _COLUMN = PlainRecords.parts, PlainRecords.column


@pytest.mark.parametrize("mutant", ["parts", "column"])
def test_a_batch_laid_out_from_misordered_runs_is_caught(
    mutant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutants: a batch's staged runs handed to its frame (parts) or to its chunks
    (column) out of order fail the property above."""
    fake = _reversed_parts if mutant == "parts" else _reversed_column
    monkeypatch.setattr(PlainRecords, mutant, fake)

    @given(_DATAS, _CUTS, st.integers(1, 40), st.integers(1, 10**12))
    @_MUTANT
    def same(datas: list[bytes], cuts: list[int], window: int, first: int) -> None:
        _from_runs(datas, cuts, window, first, True)

    with pytest.raises(AssertionError):
        same()
