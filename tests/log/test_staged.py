"""A sink's journaled stages as recovery reads them (docs/durability.md, "Staged chunks"):
the frames' bytes on disk, and a publish frame read as the records frame it stands for."""

from __future__ import annotations

from pathlib import Path

import pytest

from waymark.log.journal import PublishFrame, records_frame, stage_frame_parts
from waymark.log.origin import Published
from waymark.log.records import PlainRecords, plain_records
from waymark.log.staged import resolve
from waymark.log.storage.frames import CorruptFrame, FrameKind, scan
from waymark.protocol import Limits

PATH = Path("shard-0/00000000000000000000.wal")


def plain(*datas: bytes) -> PlainRecords:
    array = b"[" + b",".join(b'{"data":%b}' % d for d in datas) + b"]"
    records = plain_records(array, list(datas), Limits())
    assert records is not None
    return records


def stage(key: tuple[int, int, int], records: PlainRecords, batch: int = 4) -> bytes:
    partition, attempt, chunk = key
    return b"".join(stage_frame_parts(("out", "w", batch, partition, attempt, chunk), records))


def publish(*chunks: tuple[int, int, int], batch: int = 4) -> bytes:
    return PublishFrame("out", 2, 10, 1_000, 1_001, "w", batch, list(chunks)).encode()


def resolved(data: bytes) -> list[tuple[FrameKind, bytes]]:
    frames, end = scan(data, PATH)
    assert end == len(data)
    return [(f.kind, bytes(f.payload)) for _, f in resolve(PATH, data, frames)]


def test_the_frames_bytes() -> None:
    """What a WAL holds (a later version must still read it)."""
    assert stage((1, 0, 2), plain(b"7", b'"x"')) == bytes.fromhex("73000000") + (
        b'\t{"name":"out","writer":"w","batch_id":4,"partition":1,"attempt":0,"chunk":2,'
        b'"lens":[10,12]}\n,"data":7},"data":"x"}'
    ) + bytes.fromhex("6d05981fbc9da992")
    assert publish((0, 0, 0), (1, 0, 2)) == bytes.fromhex("72000000") + (
        b'\n{"name":"out","epoch":2,"first_seq":10,"ts":1000,"now":1001,"writer":"w",'
        b'"batch_id":4,"chunks":[[0,0,0],[1,0,2]]}'
    ) + bytes.fromhex("7ba8f7103b2d2762")


def test_a_publish_reads_as_the_records_frame_of_its_chunks() -> None:
    """Its chunks in its order, the latest stage of a key (a chunk staged again), the
    publish mark; a stage it does not name (another attempt's) never applies."""
    first, again, other = plain(b"1", b"2"), plain(b"3", b"[4]"), plain(b'{"n":5}')
    data = b"".join([
        stage((0, 0, 0), plain(b"0")), stage((1, 0, 0), other), stage((0, 1, 0), plain(b"9")),
        stage((0, 0, 0), first), stage((0, 0, 1), again), publish((0, 0, 0), (0, 0, 1), (1, 0, 0)),
    ])  # fmt: skip
    records = [*first, *again, *other]
    want = records_frame("out", 2, 10, 1_000, records, Published("w", 4), now=1_001)
    (frame,) = resolved(data)
    assert frame == (FrameKind.RECORDS, want[5:-8])


def test_a_publish_naming_a_stage_its_file_lacks_is_refused() -> None:
    """Another batch's stage or none: the engine never writes such a publish."""
    data = stage((0, 0, 0), plain(b"1"), batch=3) + publish((0, 0, 0))
    with pytest.raises(CorruptFrame, match="names chunk"):
        resolved(data)
    published_once = stage((0, 0, 0), plain(b"1")) + publish((0, 0, 0)) + publish((0, 0, 0))
    with pytest.raises(CorruptFrame, match="names chunk"):
        resolved(published_once)
