"""A write of many records is encoded, laid into its chunk and framed a whole step over
the write at a time (a sink's publish holds a million records); each record comes out
byte for byte as it would alone, through the one-record paths."""

from __future__ import annotations

from array import array
from itertools import pairwise
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waymark.log import chunk as chunk_module
from waymark.log.changes import Changes
from waymark.log.chunk import DELETED, LIVE, Chunk, PendingChunk
from waymark.log.errors import TopicError
from waymark.log.journal import BodyRun, records_frame_parts
from waymark.log.origin import Published
from waymark.log.prebuilt import bodies_array
from waymark.log.records import EncodedRecord, PlainRecords, binary_column, encode_batch
from waymark.log.storage import frames
from waymark.log.storage.segment import segment_data
from waymark.protocol import Limits, RecordIn

LIMITS = Limits()
# Tags JSON writes as they are, and ones it must escape or cannot encode at all.
TAGS = st.one_of(st.none(), st.sampled_from(["t", "é", "日本", "a/b:c", "\u2028", 'q"', "b\\s",
                                             "\x01", "\x7f", "x" * 200]))  # fmt: skip
RECORD = st.builds(
    RecordIn,
    data=st.sampled_from([b'{"a":1}', b'[1,2.5,"x"]', b'"\\u00e9"', b"null", b'{"s":"a b"}']).map(
        msgspec.Raw
    ),
    tag=TAGS,
    node=st.one_of(st.none(), st.just("n1")),
    id=st.one_of(st.none(), st.just("i")),
    # a pipeline edge's three keys, and meta JSON must escape
    meta=st.sampled_from(
        [None, {"wm.gen": "1", "wm.event": "p.x/s:1", "wm.t0": "17"}, {"k": 'q"\u2028'}]
    ),
)
# ... and meta with a key too many, which refuses the write
RECORD_OR_OVER = RECORD | RECORD.map(
    lambda r: msgspec.structs.replace(r, meta={f"k{i}": "v" for i in range(65)})
)


@settings(max_examples=150, deadline=None)
@given(st.lists(RECORD_OR_OVER, min_size=2, max_size=40), st.booleans())
def test_a_write_encodes_as_its_records_would_alone(records: list[RecordIn], same: bool) -> None:
    if same:  # all tagged alike (or all with meta) or all untagged: the whole-write paths
        first = records[0]
        records = [msgspec.structs.replace(r, tag=first.tag, node=None,
                                           meta=(r.meta or first.meta) if first.meta else None)
                   for r in records]  # fmt: skip
    try:
        alone = [encode_batch([r], LIMITS)[0] for r in records]
    except TopicError as error:  # a record over a limit: the whole write is refused alike
        with pytest.raises(TopicError) as refused:
            encode_batch(records, LIMITS)
        assert refused.value.code == error.code
        return
    assert encode_batch(records, LIMITS) == alone


@settings(max_examples=60, deadline=None)
@given(st.lists(RECORD, min_size=2, max_size=700), st.integers(1, 10**12), st.booleans())
def test_a_chunk_takes_a_write_as_it_takes_its_records_one_by_one(
    records: list[RecordIn], first_seq: int, arrow: bool
) -> None:
    """Both multi-record layouts: Python groups (short runs) and one pyarrow join."""
    encoded = [encode_batch([r], LIMITS)[0] for r in records]
    whole, one_by_one = Chunk(first_seq), Chunk(first_seq)
    threshold = chunk_module.ARROW_FROM
    chunk_module.ARROW_FROM = 2 if arrow else 10**9
    try:
        whole.extend(first_seq, 1_700_000_000_123, encoded)
    finally:
        chunk_module.ARROW_FROM = threshold
    for i, record in enumerate(encoded):
        one_by_one.extend(first_seq + i, 1_700_000_000_123, [record])
    for field in ("buf", "ends", "ts", "node", "tag", "size", "dead", "live"):
        assert getattr(whole, field) == getattr(one_by_one, field), field
    assert whole.tag_names.names == one_by_one.tag_names.names
    assert whole.node_names.names == one_by_one.node_names.names


def test_a_frame_of_many_small_records_is_the_same_bytes() -> None:
    """Framed in runs of about 1 MiB rather than one part per record."""
    records = [EncodedRecord(b',"data":%d}' % i, 3, None, "t", None) for i in range(300_000)]
    parts = records_frame_parts("t", 1, 1, 5, records, None, now=5)
    assert len(parts) < 20
    joined = b"".join(parts)
    found, end = frames.scan(joined, Path("x"))
    assert end == len(joined) and len(found) == 1
    _, _, bodies = bytes(found[0].payload).partition(b"\n")
    assert bodies == b"".join(r.body for r in records)


@settings(max_examples=60, deadline=None)
@given(st.lists(RECORD, min_size=2, max_size=700), st.integers(1, 10**12), st.data())
def test_staged_runs_lay_out_and_frame_as_their_records_do(
    records: list[RecordIn], first_seq: int, data: st.DataObject
) -> None:
    """A sink's staged chunks keep their bodies joined (BodyRun): the publish lays a chunk
    out and frames it from those, byte for byte as from the records."""
    encoded = [encode_batch([r], LIMITS)[0] for r in records]
    cuts = sorted(data.draw(st.sets(st.integers(1, len(encoded) - 1), max_size=6)))
    bounds = [0, *cuts, len(encoded)]
    runs = [BodyRun.of(encoded[a:b]) for a, b in pairwise(bounds)]
    from_runs, from_records = Chunk(first_seq), Chunk(first_seq)
    bodies = bodies_array(runs)
    half = len(encoded) // 2  # a window of the runs, as a chunk boundary cuts them
    from_runs.extend(first_seq, 7, encoded[:half], bodies.slice(0, half).combine_chunks())
    from_runs.extend(first_seq + half, 7, encoded[half:], bodies.slice(half).combine_chunks())
    from_records.extend(first_seq, 7, encoded[:half])
    from_records.extend(first_seq + half, 7, encoded[half:])
    for field in ("buf", "ends", "ts", "node", "tag", "size", "dead", "live"):
        assert getattr(from_runs, field) == getattr(from_records, field), field
    framed = records_frame_parts("t", 1, first_seq, 7, encoded, None, now=7, runs=runs)
    assert b"".join(framed) == b"".join(
        records_frame_parts("t", 1, first_seq, 7, encoded, None, now=7)
    )


def _data_one_by_one(chunk: Chunk, dead: bytes) -> tuple[bytes, bytes, bytes]:
    """A segment's ``.data`` built a record at a time, as docs/durability.md describes
    it: each record's wire JSON in turn, then a flag byte per record (``0xD5``
    deleted), with each record's offset and length."""
    records, flags, offsets, lens, start = [], [], array("Q"), array("I"), 0
    for i, end in enumerate(chunk.ends):
        offsets.append(sum(map(len, records)))
        records.append(bytes(chunk.buf[start:end]))
        lens.append(end - start)
        flags.append(b"\xd5" if dead[i] == DELETED else b"\x00")
        start = end
    return b"".join(records + flags), offsets.tobytes(), lens.tobytes()


@settings(max_examples=60, deadline=None)
@given(st.lists(RECORD, min_size=0, max_size=700), st.integers(1, 10**12), st.data())
def test_a_segment_holds_its_records_as_one_by_one(
    records: list[RecordIn], first_seq: int, data: st.DataObject
) -> None:
    """A seal lays a chunk's records out for its segment in one step over the chunk."""
    chunk = Chunk(first_seq)
    if records:
        chunk.extend(first_seq, 1_700_000_000_123, [encode_batch([r], LIMITS)[0] for r in records])
    flags = data.draw(st.lists(st.sampled_from([LIVE, DELETED]), min_size=len(records),
                               max_size=len(records)))  # fmt: skip
    want, want_offsets, want_lens = _data_one_by_one(chunk, bytes(flags))
    began = chunk.buf  # the payload the seal takes when it begins
    released = data.draw(st.booleans())
    if released:  # a delete then frees the wholly deleted payload before the write
        chunk.release_payloads()
    # The segment holds the records the seal began with, whatever was freed since.
    laid, flagged, offsets, lens = segment_data(chunk, bytes(flags), began)
    assert bytes(laid) + flagged == want
    assert (offsets.tobytes(), lens.tobytes()) == (want_offsets, want_lens)
    if released:  # the freed buffer lays out as empty records: never a read past its end
        laid, _, offsets, lens = segment_data(chunk, bytes(flags), chunk.buf)
        assert (bytes(laid), lens.tolist(), offsets.tolist()) == (b"", [0] * len(records),
                                                                  [0] * len(records))  # fmt: skip


DATA = st.sampled_from([b'{"a":1}', b'[1,2.5,"x"]', b'"\\u00e9"', b"null", b'{"s":"a b"}',
                        b'"\xc3\xa9"', b"0"])  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.lists(DATA, min_size=1, max_size=700), st.integers(1, 10**12), st.data())
def test_columnar_records_lay_out_and_frame_as_their_records_do(
    datas: list[bytes], first_seq: int, data: st.DataObject
) -> None:
    """A sink's staged chunks of records that carry data alone stay columnar
    (PlainRecords): sliced, joined, laid into chunks (whole or cut, with their bodies'
    column or without) and framed, byte for byte as the same records one object each."""
    encoded = [encode_batch([RecordIn(msgspec.Raw(d))], LIMITS)[0] for d in datas]
    bounds = np.zeros(len(datas) + 1, np.int64)
    np.cumsum([len(r.body) for r in encoded], out=bounds[1:])
    whole = PlainRecords(b"".join(r.body for r in encoded), bounds)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(encoded) - 1)), max_size=4)))
    pieces = [whole[a:b] for a, b in pairwise([0, *cuts, len(encoded)]) if b > a]
    plain = PlainRecords.concat(pieces)
    assert list(plain) == encoded and plain == whole and len(plain) == len(encoded)
    assert [plain[i] for i in (0, -1)] == [encoded[0], encoded[-1]]
    assert plain.data_bytes() == sum(r.size for r in encoded)
    half = len(encoded) // 2
    from_plain, from_records = Chunk(first_seq), Chunk(first_seq)
    column = data.draw(st.booleans())  # the bodies' column given, as build gives it
    for lo, hi in ((0, half), (half, len(encoded))):
        if hi > lo:
            window = plain[lo:hi]
            laid = binary_column(window.bodies, window.bounds) if column else None
            from_plain.extend(first_seq + lo, 7, window, laid)
            from_records.extend(first_seq + lo, 7, encoded[lo:hi])
    for field in ("buf", "ends", "ts", "node", "tag", "size", "dead", "live"):
        assert getattr(from_plain, field) == getattr(from_records, field), field
    mark = Published("w", 3)
    assert b"".join(records_frame_parts("t", 1, first_seq, 7, plain, mark, now=7)) == b"".join(
        records_frame_parts("t", 1, first_seq, 7, encoded, mark, now=7)
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(DATA, min_size=1, max_size=60),
       st.integers(1, 10**12) | st.sampled_from([1, 5, 95, 999_990, 10**9 - 30]),
       st.data())  # fmt: skip
def test_a_publish_s_full_chunk_laid_out_later_is_the_chunk_laid_out_now(
    datas: list[bytes], first_seq: int, data: st.DataObject
) -> None:
    """A full chunk of a sink's publish (PendingChunk) has the index arrays a chunk laid
    out at once has, ``ends`` too (from the seqs' digit counts, across a power of ten),
    and the same bytes when first read or sealed — also after its payload is freed, for
    the seal that began before."""
    encoded = [encode_batch([RecordIn(msgspec.Raw(d))], LIMITS)[0] for d in datas]
    bounds = np.zeros(len(datas) + 1, np.int64)
    np.cumsum([len(r.body) for r in encoded], out=bounds[1:])
    plain = PlainRecords(b"".join(r.body for r in encoded), bounds)
    now = Chunk(first_seq)
    now.extend_plain(first_seq, 1_700_000_000_123, plain.sizes(), plain.column())
    later = PendingChunk(first_seq, 1_700_000_000_123, plain.sizes(), plain.column())
    for field in ("ends", "ts", "node", "tag", "size", "dead", "live", "n", "last_seq"):
        assert getattr(later, field) == getattr(now, field), field
    assert (later.room(), later.room_at(later.last_seq + 1)) == (0, 0)  # never appended to
    payload = later.payload()  # what a seal that begins now takes
    if data.draw(st.booleans()):  # read first (a reader on the event loop)
        assert later.records(0, later.n)[0] == bytes(now.buf)
        assert later.slice(0, 1) == now.slice(0, 1)
    if data.draw(st.booleans()):  # a delete frees the payload before the seal writes
        later.release_payloads()
        assert later.buf == bytearray()
    laid, _, offsets, lens = segment_data(later, bytes(later.n), payload)
    assert (bytes(laid), offsets.tolist(), lens.tolist()) == (
        bytes(now.buf), [now.start(i) for i in range(now.n)],
        [now.ends[i] - now.start(i) for i in range(now.n)],
    )  # fmt: skip


def test_a_columnar_append_notes_its_changes_as_its_records_do() -> None:
    """Receipt recovery's changes (docs/semantics/recovery.md §1.2): a columnar append is
    noted as its first and last record, merging to the same key range."""
    encoded = [encode_batch([RecordIn(msgspec.Raw(b"%d" % i))], LIMITS)[0] for i in range(50)]
    bounds = np.zeros(51, np.int64)
    np.cumsum([len(r.body) for r in encoded], out=bounds[1:])
    plain = PlainRecords(b"".join(r.body for r in encoded), bounds)
    noted = []
    for records in (encoded, plain):
        changes = Changes()
        changes.appended("t", 1, 10, records, None)
        changes.appended("t", 1, 60, records[:1], None)
        noted.append((changes.pending(), changes.take()))
    assert noted[0] == noted[1]
