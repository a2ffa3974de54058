"""The append log's indexed fold, as a hypothesis state machine against a dict.

An open holds what it read as sorted arrays over the log image (``_Index``) and
what is applied afterwards in a dict in front of it; deletes of indexed keys hide
them. The machine drives the real store through batches (single records and runs
of one shape, which the replay indexes in bulk), restarts (each builds a new
index from the log) and compactions, over keys the index holds and keys it
cannot (longer than its cap, ending in NUL, non-ASCII, empty-prefix neighbours).
After every step ``get``, ``range``, ``iter_keys`` and ``len`` must equal the
model. Mutants: a delete that does not hide an indexed put, and an index that
keeps a key's first record instead of its last.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from waymark.kv import KvUpdate, WatchCursor
from waymark.kv.stores import append_log
from waymark.kv.stores.append_log import _KEY_CAP, AppendLogStore, _key_order

ODD = ("a", "ab", "abc", "b", "k" * (_KEY_CAP + 6), "n\x00", "é", "é\x00", "a\x00b", "z")
RUN = tuple(f"r{i:03}" for i in range(60))
KEYS = ODD + RUN
PREFIXES = ("", "a", "ab", "r0", "r05", "k", "n", "é", "zz")
THRESHOLD = 512


class IndexedFold(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="model-fold-index-"))
        self.path = self.dir / "fold.log"
        self.store = AppendLogStore(self.path, compact_threshold=THRESHOLD)
        self.rev = 0
        self.model: dict[str, bytes] = {}

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _apply(self, batch: list[tuple[str, bytes | None]]) -> None:
        out = []
        for key, value in batch:
            self.rev += 1
            if value:
                out.append(KvUpdate.put(key, value, self.rev))
                self.model[key] = value
            else:
                out.append(KvUpdate.delete(key, self.rev))
                self.model.pop(key, None)
        self.store.apply(out, WatchCursor.from_u64(self.rev))

    @rule(
        batch=st.lists(
            st.tuples(
                st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=12))
            ),
            min_size=1,
            max_size=8,
        )
    )
    def apply(self, batch: list[tuple[str, bytes | None]]) -> None:
        self._apply(batch)

    @rule(start=st.integers(0, 40), n=st.integers(16, 20), value=st.binary(min_size=1, max_size=3))
    def apply_run(self, start: int, n: int, value: bytes) -> None:
        """Puts of one shape: a run the replay indexes as one array."""
        self._apply([(k, value) for k in RUN[start : start + n]])

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = AppendLogStore(self.path, compact_threshold=THRESHOLD)

    @rule()
    def compact(self) -> None:
        self.store.compact()

    @invariant()
    def reads_equal_the_model(self) -> None:
        for key in KEYS:
            got = self.store.get(key)
            assert (got.value if got else None) == self.model.get(key), key
        for p in PREFIXES:
            expected = sorted(k for k in self.model if k.startswith(p))
            assert list(self.store.iter_keys(p)) == expected, p
            assert [(e.key, e.value) for e in self.store.range(p)] == [
                (k, self.model[k]) for k in expected
            ], p
        assert len(self.store) == len(self.model)


TestIndexedFold = IndexedFold.TestCase
TestIndexedFold.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def _first_of_each(keys: np.ndarray) -> np.ndarray:
    first = np.empty(len(keys), dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    return first


@pytest.mark.parametrize("mutant", ["delete_does_not_hide", "first_record_wins"])
def test_the_machine_catches_a_broken_index(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mutant == "delete_does_not_hide":
        monkeypatch.setattr(append_log, "_indexed", lambda index, keys: set())
    else:
        monkeypatch.setattr(append_log, "_last_of_each", _first_of_each)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            IndexedFold,
            settings=settings(
                max_examples=200,
                stateful_step_count=30,
                deadline=None,
                database=None,
                derandomize=True,  # a fixed search: the mutant is caught every run
                phases=[Phase.generate],
            ),
        )


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.binary(max_size=10),
    tails=st.lists(st.binary(max_size=20), min_size=1, max_size=80),
)
def test_the_radix_key_order_is_numpys_stable_sort(prefix: bytes, tails: list[bytes]) -> None:
    """The index's sort (a radix sort past the keys' common prefix) orders fixed-width
    bytes exactly as ``np.argsort(kind="stable")`` does, equal keys in their order."""
    keys = np.array([prefix + t for t in tails])
    if keys.itemsize == 0:
        keys = keys.astype("S1")
    assert _key_order(keys).tolist() == np.argsort(keys, kind="stable").tolist()
