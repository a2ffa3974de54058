"""The fold-store conformance suite: every check runs against every backend."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waymark.kv import KvUpdate, Op, VersionToken, WatchCursor, WatchScope, stale_keys
from waymark.kv.stores.protocol import SnapshotStore, encode_puts, encode_record

Factory = Callable[[], SnapshotStore]


def cur(n: int) -> WatchCursor:
    return WatchCursor.from_u64(n)


def test_new_store_is_empty_without_cursor(make_store: Factory) -> None:
    s = make_store()
    assert s.cursor.is_none
    assert s.get("a") is None
    assert s.range() == []
    assert list(s.iter_keys()) == []
    s.close()


def test_apply_folds_in_order_and_advances_cursor(make_store: Factory) -> None:
    s = make_store()
    s.apply(
        [
            KvUpdate.put("a.1", b"x", 1),
            KvUpdate.put("a.2", b"y", 2),
            KvUpdate.put("a.1", b"x2", 3),
            KvUpdate.delete("a.2", 4),
            KvUpdate.put("b", b"z", 5),
        ],
        cur(5),
    )
    assert s.cursor == cur(5)
    e = s.get("a.1")
    assert e is not None and e.value == b"x2" and e.version.as_u64() == 3
    assert s.get("a.2") is None
    assert [e.key for e in s.range("a.")] == ["a.1"]
    assert [e.key for e in s.range()] == ["a.1", "b"]
    s.close()


def test_data_and_cursor_survive_reopen_together(make_store: Factory) -> None:
    s = make_store()
    s.apply([KvUpdate.put(f"k.{i:03}", b"v%d" % i, i + 1) for i in range(200)], cur(200))
    s.apply(
        [
            KvUpdate.delete("k.007", 201),
            KvUpdate(Op.PURGE, "k.008", b"", VersionToken.from_u64(202)),
        ],
        cur(202),
    )
    s.close()
    s = make_store()
    assert s.cursor == cur(202)
    keys = list(s.iter_keys("k."))
    assert len(keys) == 198 and "k.007" not in keys and "k.008" not in keys
    assert keys == sorted(keys)
    s.close()


def test_cas_tombstone_folds_as_a_delete(make_store: Factory) -> None:
    s = make_store()
    s.apply([KvUpdate.put("lock", b"held", 1)], cur(1))
    s.apply([KvUpdate.put("lock", b"", 2)], cur(2))  # delete_with_version writes an empty value
    assert s.get("lock") is None
    s.close()


def test_versions_are_length_prefixed_not_u64(make_store: Factory) -> None:
    stamp = VersionToken(bytes(range(1, 11)))  # a 10-byte versionstamp must not flatten to 0
    s = make_store()
    s.apply([KvUpdate(Op.PUT, "fdb", b"v", stamp)], cur(1))
    s.close()
    s = make_store()
    e = s.get("fdb")
    assert e is not None and e.version == stamp and e.version.as_u64() is None
    s.close()


def test_synthetic_delete_with_unknown_version(make_store: Factory) -> None:
    s = make_store()
    s.apply([KvUpdate.put("a", b"1", 1)], cur(1))
    s.apply([KvUpdate.delete("a", None)], cur(1))
    assert s.get("a") is None and s.cursor == cur(1)
    s.close()


def test_stale_keys_diffs_only_the_scope(make_store: Factory) -> None:
    s = make_store()
    s.apply(
        [KvUpdate.put(k, b"v", i + 1) for i, k in enumerate(["a.1", "a.2", "b.1", "c.1"])], cur(4)
    )
    assert stale_keys(s, ["a.1"], WatchScope.all()) == ["a.2", "b.1", "c.1"]
    assert stale_keys(s, ["a.1"], WatchScope.prefix("a.")) == ["a.2"]
    assert stale_keys(s, {"b.1"}, WatchScope.of(("a.", "b."))) == ["a.1", "a.2"]
    s.close()


def test_unicode_keys_iterate_in_code_point_order(make_store: Factory) -> None:
    s = make_store()
    keys = ["z", "ä", "a", "€", "b.é"]
    s.apply([KvUpdate.put(k, b"v", i + 1) for i, k in enumerate(keys)], cur(5))
    assert list(s.iter_keys()) == sorted(keys)
    s.close()


batches = st.lists(
    st.lists(
        st.tuples(st.sampled_from(["a.1", "a.2", "b.1", "b.2", "c"]), st.binary(max_size=8)),
        min_size=1,
        max_size=8,
    ),
    max_size=10,
)


# The store is reset at the start of each example, so sharing the fixture is intended.
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=batches)
def test_fold_is_a_pure_function_of_the_log(
    make_store: Factory, batches: list[list[tuple[str, bytes]]]
) -> None:
    """Whatever the batching, the reopened fold equals the last write per key."""
    s = make_store()
    s.apply(
        [KvUpdate.delete(k, None) for k in list(s.iter_keys())], s.cursor
    )  # reset between examples
    model: dict[str, bytes] = {}
    rev = 0
    for batch in batches:
        ups = []
        for key, value in batch:
            rev += 1
            ups.append(KvUpdate.put(key, value, rev) if value else KvUpdate.delete(key, rev))
            if value:
                model[key] = value
            else:
                model.pop(key, None)
        s.apply(ups, cur(rev))
    s.close()
    s = make_store()
    assert {e.key: e.value for e in s.range()} == model
    if batches:
        assert s.cursor == cur(rev)
    s.close()


def test_put_only_batch_with_a_repeated_key_keeps_the_last(make_store: Factory) -> None:
    """The put-only fast path (putmulti, map-driven WriteBatch, dict.update) keeps order."""
    s = make_store()
    s.apply(
        [KvUpdate.put("a", b"1", 1), KvUpdate.put("b", b"2", 2), KvUpdate.put("a", b"3", 3)],
        cur(3),
    )
    for _ in range(2):
        e = s.get("a")
        assert e is not None and e.value == b"3" and e.version.as_u64() == 3
        assert [(e.key, e.value) for e in s.range()] == [("a", b"3"), ("b", b"2")]
        assert s.cursor == cur(3)
        s.close()
        s = make_store()
    s.close()


def test_encode_puts_matches_the_record_codec_and_refuses_non_puts() -> None:
    stamp = VersionToken(bytes(range(1, 11)))
    puts = [KvUpdate.put("a.é", b"1", 1), KvUpdate(Op.PUT, "b", b"x" * 300, stamp)]
    assert encode_puts(puts) == (
        [u.key.encode() for u in puts],
        [encode_record(u.value, u.version) for u in puts],
    )
    assert encode_puts([]) == ([], [])
    for odd in (
        KvUpdate.delete("a", 2),
        KvUpdate.delete("a", None),
        KvUpdate(Op.PURGE, "a", b"", VersionToken.from_u64(2)),
        KvUpdate(Op.PUT, "a", b"", VersionToken.from_u64(2)),  # CAS tombstone
    ):
        assert encode_puts([*puts, odd]) is None
