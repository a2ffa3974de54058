"""The append-log file format: header, CRC per record, torn tails, corruption, compaction."""

from __future__ import annotations

import contextlib
import logging
import resource
import shutil
import signal
import struct
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waymark.kv import (
    Corrupted,
    InvalidFormat,
    KvEntry,
    KvUpdate,
    Op,
    SnapshotIoError,
    VersionToken,
    WatchCursor,
)
from waymark.kv.stores import append_log, crc_runs
from waymark.kv.stores.append_log import (
    HEADER,
    AppendLogStore,
    _cursor_record,
    _delete_record,
    _put_record,
    _stored_crcs,
    replay_log,
)


def fill(path: Path, n: int = 5, *, threshold: int = 1 << 30) -> AppendLogStore:
    s = AppendLogStore(path, compact_threshold=threshold)
    for i in range(n):
        s.apply([KvUpdate.put(f"k{i}", b"value-%d" % i, i + 1)], WatchCursor.from_u64(i + 1))
    return s


def test_header_is_magic_and_version(tmp_path: Path) -> None:
    fill(tmp_path / "f.log").close()
    assert (tmp_path / "f.log").read_bytes()[:6] == b"PGSS" + struct.pack("<H", 1)


def test_every_truncation_recovers_a_consistent_prefix(tmp_path: Path) -> None:
    """Cut the log anywhere: open drops the torn record, never data behind the cursor."""
    path = tmp_path / "f.log"
    fill(path, 4).close()
    full = path.read_bytes()
    for cut in range(len(HEADER), len(full)):
        path.write_bytes(full[:cut])
        s = AppendLogStore(path)
        n = s.cursor.as_u64()
        keys = set(s.iter_keys())
        # Every revision the cursor names is present; data ahead of it is allowed.
        assert {f"k{i}" for i in range(n)} <= keys
        s.close()


def test_torn_tail_is_cut_off_so_later_appends_stay_readable(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    fill(path, 3).close()
    path.write_bytes(path.read_bytes()[:-3])
    s = AppendLogStore(path)
    s.apply([KvUpdate.put("after", b"x", 9)], WatchCursor.from_u64(9))
    s.close()
    s = AppendLogStore(path)
    assert s.get("after") is not None and s.cursor == WatchCursor.from_u64(9)
    s.close()


def test_mid_file_crc_mismatch_is_corrupted(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    s = fill(path, 3)
    s.close()
    data = bytearray(path.read_bytes())
    data[len(HEADER) + 8] ^= 0xFF  # inside the first record, with records after it
    path.write_bytes(bytes(data))
    with pytest.raises(Corrupted):
        AppendLogStore(path)


def test_wrong_version_and_magic_are_invalid_format(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    fill(path, 1).close()
    data = path.read_bytes()
    path.write_bytes(b"PGSS" + struct.pack("<H", 2) + data[6:])
    with pytest.raises(InvalidFormat):
        AppendLogStore(path)
    path.write_bytes(b"NOPE" + data[4:])
    with pytest.raises(InvalidFormat):
        AppendLogStore(path)


def test_compaction_is_deterministic_and_sorted(tmp_path: Path) -> None:
    a = AppendLogStore(tmp_path / "a.log", compact_threshold=1 << 30)
    b = AppendLogStore(tmp_path / "b.log", compact_threshold=1 << 30)
    ups = [KvUpdate.put(f"k{i % 7}", b"%d" % i, i + 1) for i in range(50)]
    a.apply(ups, WatchCursor.from_u64(50))
    for u in reversed(ups[-7:]):  # same final state, different history and order
        b.apply([u], WatchCursor.from_u64(50))
    a.compact()
    b.compact()
    a.close()
    b.close()
    assert (tmp_path / "a.log").read_bytes() == (tmp_path / "b.log").read_bytes()


def test_threshold_triggers_compaction(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    s = AppendLogStore(path, compact_threshold=2048)
    for i in range(200):
        s.apply([KvUpdate.put("same", b"x" * 40, i + 1)], WatchCursor.from_u64(i + 1))
    assert path.stat().st_size < 2048 + 200
    s.close()
    s = AppendLogStore(path)
    assert s.cursor == WatchCursor.from_u64(200) and s.get("same") is not None
    s.close()


def block_compaction(path: Path) -> Path:
    """Fault injector: a directory squats on the compaction temp file's name, so
    every compaction of ``path`` fails (a real filesystem error, not a mock).
    Remove the returned directory to lift the fault."""
    blocker = path.with_name(path.name + ".compact.tmp")
    blocker.mkdir()
    return blocker


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """A real write fault: past ``limit`` bytes a file write fails with EFBIG
    (RLIMIT_FSIZE, with SIGXFSZ ignored so the process lives), after writing
    what fits - a torn append."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_failed_compaction_leaves_log_and_writer_intact(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    s = fill(path, 2)
    blocker = block_compaction(path)
    with pytest.raises(SnapshotIoError, match="compaction"):
        s.compact()
    assert not s.poisoned
    s.apply([KvUpdate.put("x", b"y", 9)], WatchCursor.from_u64(9))
    blocker.rmdir()
    s.close()
    s2 = AppendLogStore(path)
    assert s2.cursor == WatchCursor.from_u64(9) and s2.get("x") is not None and len(s2) == 3
    s2.close()


def test_a_failing_compaction_never_fails_the_apply_that_committed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The batch and cursor are written before compaction runs: raising then would make
    the caller re-queue a committed batch. Reported on the store and retried later."""
    path = tmp_path / "f.log"
    s = AppendLogStore(path, compact_threshold=2048)
    rev = 0

    def overwrite(value: bytes) -> None:  # each record supersedes the last: reclaimable
        nonlocal rev
        rev += 1
        s.apply([KvUpdate.put("same", value, rev)], WatchCursor.from_u64(rev))

    while s.bytes_since_compact < 1800:
        overwrite(b"a" * 40)
    blocker = block_compaction(path)
    with caplog.at_level(logging.WARNING, logger="waymark.kv"):
        while s.bytes_since_compact < 2048:
            overwrite(b"b" * 40)  # the apply that crosses the threshold returns normally
    assert s.compaction_failures == 1 and isinstance(s.compaction_error, SnapshotIoError)
    assert "compaction" in caplog.text and not s.poisoned
    assert s.cursor == WatchCursor.from_u64(rev) and s.get("same").value == b"b" * 40  # type: ignore[union-attr]
    on_disk = replay_log(path.read_bytes())  # durable: what a restart would load
    assert on_disk.cursor == WatchCursor.from_u64(rev).raw
    assert on_disk.entries()["same"].value == b"b" * 40

    # Not retried on every apply (a full rewrite per batch), but after another threshold.
    overwrite(b"c" * 40)
    assert s.compaction_failures == 1
    while s.compaction_failures == 1 and s.bytes_since_compact < 3 * 2048:
        overwrite(b"d" * 40)
    assert s.compaction_failures == 2  # retried, and the fault is still there
    blocker.rmdir()
    before = path.stat().st_size
    while s.compaction_error is not None and s.bytes_since_compact < 5 * 2048:
        overwrite(b"e" * 40)
    assert s.compaction_error is None and s.compaction_failures == 2
    assert path.stat().st_size < before  # the retry compacted the log
    s.close()
    s = AppendLogStore(path)
    assert s.cursor == WatchCursor.from_u64(rev) and s.get("same").value == b"e" * 40  # type: ignore[union-attr]
    s.close()


@pytest.mark.parametrize("records", [1, 100])
def test_an_apply_that_fails_to_commit_leaves_nothing_of_its_batch(
    tmp_path: Path, records: int
) -> None:
    """The write stops after the batch's first record: with one record, only its
    cursor record is missing; with a hundred, most of the batch is."""
    path = tmp_path / "f.log"
    s = fill(path, 2)
    size = path.stat().st_size
    batch = [KvUpdate.put(f"new{i}", b"x" * 50, 10 + i) for i in range(records)]
    first = len(_put_record(b"new0", b"x" * 50, (10).to_bytes(8, "big")))
    with file_size_limit(size + first), pytest.raises(SnapshotIoError):
        s.apply(batch, WatchCursor.from_u64(200))
    assert s.cursor == WatchCursor.from_u64(2) and len(s) == 2 and s.get("new0") is None
    assert path.stat().st_size == size  # the torn part was cut off
    s.apply([KvUpdate.put("after", b"1", 300)], WatchCursor.from_u64(300))  # still usable
    s.close()
    s = AppendLogStore(path)
    assert s.cursor == WatchCursor.from_u64(300)
    assert sorted(e.key for e in s.range()) == ["after", "k0", "k1"]
    s.close()


def test_load_skips_rewrite_of_a_compact_log(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    s = AppendLogStore(path)
    s.apply([KvUpdate.put("a", b"1", 1), KvUpdate.put("b", b"2", 2)], WatchCursor.from_u64(2))
    s.close()
    before = path.stat().st_ino
    AppendLogStore(path).close()
    assert path.stat().st_ino == before  # no temp-file-and-rename happened


def test_open_keeps_up_to_a_threshold_of_superseded_records_and_compacts_past_it(
    tmp_path: Path,
) -> None:
    """As apply does: a log whose superseded and deleted records stay within the
    threshold is not rewritten on open (an exported copy of a live log is such a log);
    the bytes count towards the next compaction. Past the threshold open compacts."""
    path = tmp_path / "f.log"
    s = fill(path, 20)
    again = [KvUpdate.put(f"k{i}", b"again", 21 + i) for i in range(20)]
    s.apply([*again, KvUpdate.delete("k2", 41)], WatchCursor.from_u64(41))
    s.close()
    before, size = path.stat().st_ino, path.stat().st_size
    s = AppendLogStore(path, compact_threshold=4096)
    assert path.stat().st_ino == before  # kept as it is
    garbage = s.bytes_since_compact  # the first 20 puts, the superseded k2 and the delete
    assert 20 * 20 < garbage < 1000
    assert s.get("k1") == KvEntry("k1", b"again", VersionToken.from_u64(22)) and not s.get("k2")
    applies, step = 0, 0
    while path.stat().st_ino == before and applies < 100:
        n = s.bytes_since_compact
        s.apply([KvUpdate.put("k1", b"x" * 50, 50 + applies)], WatchCursor.from_u64(50 + applies))
        step = step or s.bytes_since_compact - n
        applies += 1
    # The kept garbage counted towards the threshold: compacted before 4096 new bytes.
    assert path.stat().st_ino != before and applies * step < 4096
    assert path.stat().st_size < size
    s.close()

    fill(tmp_path / "g.log", 20).close()
    s = AppendLogStore(tmp_path / "g.log")
    s.apply([KvUpdate.put("k1", b"y", 21)], WatchCursor.from_u64(21))
    s.close()
    before = (tmp_path / "g.log").stat().st_ino
    AppendLogStore(tmp_path / "g.log", compact_threshold=8).close()  # past a tiny threshold
    assert (tmp_path / "g.log").stat().st_ino != before
    assert replay_log((tmp_path / "g.log").read_bytes()).compact


def test_apply_writes_the_spec_records_byte_for_byte(tmp_path: Path) -> None:
    """apply's inlined encoder must equal the reference record codecs, for every record kind."""
    path = tmp_path / "f.log"
    s = AppendLogStore(path, compact_threshold=1 << 30)
    start = path.stat().st_size
    stamp = VersionToken(bytes(range(1, 11)))
    mixed = [
        KvUpdate.put("k", b"v", 1),
        KvUpdate(Op.PUT, "tomb", b"", VersionToken.from_u64(2)),  # CAS tombstone: a delete
        KvUpdate.delete("k", 3),
        KvUpdate(Op.PURGE, "p", b"", VersionToken.from_u64(4)),
        KvUpdate.delete("synthetic", None),
        KvUpdate.put("é.ü", b"x" * 300, 5),
    ]
    big = KvUpdate.put("z" * 1500, b"w" * 5000, 7)  # past the pre-encoded header sizes
    puts = [KvUpdate.put("a", b"1", 6), KvUpdate(Op.PUT, "fdb", b"v", stamp), big]
    s.apply(mixed, WatchCursor.from_u64(5))
    s.apply(puts, WatchCursor.from_u64(7))
    s.close()
    expected = []
    for batch, cursor in ((mixed, 5), (puts, 7)):
        for u in batch:
            k = u.key.encode()
            if u.op is Op.PUT and u.value:
                expected.append(_put_record(k, u.value, u.version.raw))
            else:
                expected.append(_delete_record(k, u.version.raw))
        expected.append(_cursor_record(WatchCursor.from_u64(cursor).raw))
    assert path.read_bytes()[start:] == b"".join(expected)
    s = AppendLogStore(path)
    assert [(e.key, e.value, e.version) for e in s.range()] == [
        ("a", b"1", VersionToken.from_u64(6)),
        ("fdb", b"v", stamp),
        ("z" * 1500, b"w" * 5000, VersionToken.from_u64(7)),
        ("é.ü", b"x" * 300, VersionToken.from_u64(5)),
    ]
    s.compact()  # the compaction encoder too
    s.close()
    live = sorted([*puts, mixed[-1]], key=lambda u: u.key)
    compacted = [_put_record(u.key.encode(), u.value, u.version.raw) for u in live]
    compacted.append(_cursor_record(WatchCursor.from_u64(7).raw))
    assert path.read_bytes() == HEADER + b"".join(compacted)


def test_a_log_of_distinct_puts_is_not_rewritten_for_nothing(tmp_path: Path) -> None:
    """Past the threshold, compaction waits until it has something to reclaim."""
    path = tmp_path / "f.log"
    s = AppendLogStore(path, compact_threshold=2048)
    before = path.stat().st_ino
    for b in range(10):  # batches of distinct keys: exactly what a compaction would write
        s.apply(
            [KvUpdate.put(f"k.{b}.{i}", b"x" * 40, b * 20 + i + 1) for i in range(20)],
            WatchCursor.from_u64(b * 20 + 20),
        )
    assert path.stat().st_ino == before and path.stat().st_size > 2048
    s.apply([KvUpdate.put("k.0.0", b"y", 201)], WatchCursor.from_u64(201))  # supersedes one
    assert path.stat().st_ino != before
    s.close()
    s = AppendLogStore(path)
    assert len(s) == 200 and s.get("k.0.0").value == b"y"  # type: ignore[union-attr]
    assert s.cursor == WatchCursor.from_u64(201)
    s.close()


def test_cursor_records_of_small_batches_are_reclaimed(tmp_path: Path) -> None:
    """Distinct keys one per apply: the cursor records alone make a compaction worth it."""
    path = tmp_path / "f.log"
    s = AppendLogStore(path, compact_threshold=2048)
    for i in range(100):
        s.apply([KvUpdate.put(f"k{i:03}", b"x" * 40, i + 1)], WatchCursor.from_u64(i + 1))
    s.close()
    # compacted at least once: the file is below what 100 records + 100 cursors take
    assert path.stat().st_size < 100 * (len(_put_record(b"k000", b"x" * 40, bytes(8))) + 14)
    s = AppendLogStore(path)
    assert len(s) == 100 and s.cursor == WatchCursor.from_u64(100)
    s.close()


def _reference_replay(data: bytes) -> tuple[dict[str, tuple[bytes, bytes]], bytes, int, bool]:
    """The format read one record at a time, the plainest way: fold, cursor, valid length,
    clean end. Raises Corrupted for a bad CRC or type with records after it."""
    fold: dict[str, tuple[bytes, bytes]] = {}
    cursor, pos = b"", len(HEADER)
    while pos < len(data):
        try:
            (crc,) = struct.unpack_from("<I", data, pos)
            kind, p = data[pos + 4], pos + 5
            if kind == 1:
                (klen,) = struct.unpack_from("<H", data, p)
                (vlen,) = struct.unpack_from("<I", data, p + 2 + klen)
                ver_at = p + 6 + klen + vlen
                end = ver_at + 1 + data[ver_at]
            elif kind == 2:
                (klen,) = struct.unpack_from("<H", data, p)
                end = p + 3 + klen + data[p + 2 + klen]
            elif kind == 3:
                end = p + 1 + data[p]
            elif not any(data[pos:]):
                return fold, cursor, pos, False
            else:
                raise Corrupted(f"type {kind}")
        except (struct.error, IndexError):
            return fold, cursor, pos, False
        if end > len(data):
            return fold, cursor, pos, False
        if zlib.crc32(data[pos + 4 : end]) != crc:
            if end == len(data):
                return fold, cursor, pos, False
            raise Corrupted("crc")
        if kind == 1:
            key = data[p + 2 : p + 2 + klen].decode()
            fold[key] = (data[p + 6 + klen : ver_at], data[ver_at + 1 : end])
        elif kind == 2:
            fold.pop(data[p + 2 : p + 2 + klen].decode(), None)
        else:
            cursor = data[p + 1 : end]
        pos = end
    return fold, cursor, pos, True


def test_a_runs_stored_crcs_are_every_records_crc_field() -> None:
    """The strided read of a run's CRC fields, for record lengths of every residue mod 4
    (the u32 view and the struct fallback): a wrong read would not fold wrong data, it
    would silently send every run down the record-by-record path."""
    for vlen in (0, 1, 2, 3, 40):
        recs = [_put_record(b"k%02d" % i, b"v" * vlen, b"\x01") for i in range(20)]
        expected = [struct.unpack_from("<I", r)[0] for r in recs]
        assert _stored_crcs(memoryview(b"".join(recs)), len(recs[0])) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=600), min_size=1, max_size=5), st.binary(max_size=9))
def test_records_carry_zlibs_crc32(values: list[bytes], cursor: bytes) -> None:
    """The format's CRC is the standard CRC-32 that zlib computes: the store computes it
    with ISA-L (faster on short records), so every record apply writes, of every size
    across ISA-L's code paths, is checked here against zlib by the reference reading."""
    path = Path(tempfile.mkdtemp()) / "f.log"
    s = AppendLogStore(path, compact_threshold=1 << 30)
    batch = [KvUpdate.put(f"k{i}", v, i + 1) for i, v in enumerate(values)]
    batch.append(KvUpdate.delete("k0", len(values) + 1))
    s.apply(batch, WatchCursor(cursor))
    s.close()
    try:
        fold, got, _, clean = _reference_replay(path.read_bytes())
    finally:
        shutil.rmtree(path.parent)
    assert clean and got == cursor
    assert set(fold) == {f"k{i}" for i, v in enumerate(values) if v and i}


@st.composite
def _logs(draw: st.DrawFn) -> bytes:
    """Logs with long runs of equally shaped puts (what the bulk path folds), mixed with
    puts of other shapes, deletes and cursor records; then maybe one byte changed,
    the tail cut off or zero-filled."""
    out = [HEADER]
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["run", "put", "delete", "cursor"]))
        if kind == "run":
            width, vlen = draw(st.integers(1, 3)), draw(st.sampled_from([0, 1, 5, 300]))
            # Up to 140: runs of more than one bulk-checked block (crc_runs.CHUNK).
            start, n = draw(st.integers(0, 50)), draw(st.integers(1, 140))
            for i in range(start, start + n):
                ver = (i % 7).to_bytes(8, "big")
                out.append(_put_record(f"{i:0{width}}"[-width:].encode(), b"v" * vlen, ver))
        elif kind == "put":
            key = draw(st.text(min_size=0, max_size=4)).encode()
            out.append(_put_record(key, draw(st.binary(max_size=8)), draw(st.binary(max_size=3))))
        elif kind == "delete":
            out.append(_delete_record(f"{draw(st.integers(0, 60))}".encode(), b"\x01"))
        else:
            out.append(_cursor_record(draw(st.binary(max_size=9))))
    data = bytearray(b"".join(out))
    damage = draw(st.sampled_from(["none", "flip", "cut", "zeros"]))
    if damage == "flip" and len(data) > len(HEADER):
        at = draw(st.integers(len(HEADER), len(data) - 1))
        data[at] ^= draw(st.integers(1, 255))
    elif damage == "cut":
        del data[draw(st.integers(len(HEADER), len(data))) :]
    elif damage == "zeros":
        data += bytes(draw(st.integers(1, 80)))
    return bytes(data)


@settings(max_examples=400, deadline=None)
@given(_logs())
def test_replay_equals_a_record_by_record_reading(data: bytes) -> None:
    """The bulk path for runs of equal puts checks every record's CRC and folds exactly
    what a plain record-by-record reading does: torn tails, corruption and all. Every
    run of 16 or more is checked in bulk here (a plan made for any run length)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(crc_runs, "PLAN_MIN_RECORDS", 1)
        _replay_matches_reference(data)


def _replay_matches_reference(data: bytes) -> None:
    try:
        expected = _reference_replay(data)
    except Corrupted:
        with pytest.raises(Corrupted):
            replay_log(data)
        with pytest.raises(Corrupted):
            replay_log(data, build=False)
        return
    fold, cursor, valid_len, clean = expected
    for build in (True, False):
        r = replay_log(data, build=build)
        assert (r.cursor, r.valid_len, r.clean_eof) == (cursor, valid_len, clean)
        if build:
            got = {k: (e.value, e.version.raw) for k, e in r.entries().items()}
            assert got == fold


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 12),
    st.integers(0, 70),
    st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 255)), max_size=3
    ),
)
def test_the_bulk_crc_check_holds_exactly_when_every_record_does(
    n: int, klen: int, vlen: int, damage: list[tuple[int, int, int]]
) -> None:
    """``crcs_hold`` says a run is good exactly when each record's own CRC checks out:
    runs of any length (whole blocks of ``crc_runs.CHUNK`` records and a rest), any
    record length mod 4, with up to three bytes changed anywhere, CRC fields included."""
    recs = [
        _put_record(f"{i:0{klen}}"[-klen:].encode(), bytes([i % 251]) * vlen, b"\x07")
        for i in range(n)
    ]
    length = len(recs[0])
    data = bytearray(b"".join(recs))
    for record, offset, xor in damage:
        data[(record % n) * length + offset % length] ^= xor
    region = memoryview(bytes(data))
    each = [
        zlib.crc32(region[i * length + 4 : (i + 1) * length])
        == struct.unpack_from("<I", region, i * length)[0]
        for i in range(n)
    ]
    plan = crc_runs.plan_for(length, crc_runs.PLAN_MIN_RECORDS, 8192)
    assert plan is not None
    assert plan.holds(region, n, length) == all(each)


def test_a_flipped_byte_in_any_block_of_a_run_is_corruption_at_its_record(
    tmp_path: Path,
) -> None:
    """A compacted log of 600 equal puts is one run, checked in bulk (nine blocks of 64
    and a rest): a byte changed in any record, body or CRC field, is refused at that
    record's offset, by a replay that builds the fold and by the verification's that
    does not."""
    s = AppendLogStore(tmp_path / "f.log")
    s.apply(
        [KvUpdate.put(f"k.{i:04}", b"v" * 20, i + 1) for i in range(600)],
        WatchCursor.from_u64(600),
    )
    s.compact()
    s.close()
    good = (tmp_path / "f.log").read_bytes()
    length = len(_put_record(b"k.0000", b"v" * 20, (1).to_bytes(8, "big")))
    assert crc_runs.plan_for(length, 600, 8192) is not None
    for record in (0, 63, 64, 300, 575, 576, 599):
        for offset in (0, 3, 4, length - 1):
            data = bytearray(good)
            at = len(HEADER) + record * length
            data[at + offset] ^= 0x10
            for build in (True, False):
                with pytest.raises(Corrupted, match=f"offset {at}$"):
                    replay_log(bytes(data), build=build)


def test_mutant_a_bulk_check_that_passes_everything_folds_a_damaged_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tests above can fail: with the bulk check answering "all good" a damaged
    record is read as if it were intact."""

    class Blind:
        def holds(self, *_: object) -> bool:
            return True

    monkeypatch.setattr(append_log, "plan_for", lambda *_: Blind())
    s = AppendLogStore(tmp_path / "f.log")
    s.apply(
        [KvUpdate.put(f"k.{i:04}", b"v" * 20, i + 1) for i in range(600)],
        WatchCursor.from_u64(600),
    )
    s.close()
    data = bytearray((tmp_path / "f.log").read_bytes())
    data[len(data) // 2] ^= 0x10
    assert replay_log(bytes(data), build=False).cursor == (600).to_bytes(8, "big")
