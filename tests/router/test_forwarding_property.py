"""A hypothesis property of docs/semantics/topics.md §8.1/§8.2: whatever the interleaving of
source appends, forwarding steps of any size, a full discard:"reject" dest being drained,
seals and restarts, every source record reaches dest, and the first copy of each is in
source order (at-least-once: repeats only after a restart). With ``exactly_once``,
dest never holds two copies with one key at once, and a key always names its data."""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Engine, RecordIn
from waymark.log.config import StorageConfig
from waymark.log.storage.restore import open_engine
from waymark.log.storage.store import Store
from waymark.protocol import Discard

Op = tuple[str, int]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 20)),
        st.tuples(st.just("forward"), st.integers(1, 8)),
        st.tuples(st.just("drain"), st.just(0)),
        st.tuples(st.just("seal"), st.just(0)),
        st.tuples(st.just("restart"), st.just(0)),
    ),
    max_size=40,
)


class Run:
    def __init__(self, directory: Path, guarantee: str) -> None:
        self.directory = directory
        self.guarantee = guarantee
        self.clock = ManualClock()
        self.engine, self.store = self._open()
        self.engine.put_topic("dst", ConfigPatch(cap_records=10, discard=Discard.REJECT))
        self.engine.put_topic("src", ConfigPatch())
        self.engine.put_router("r", "src", "dst", create_dest=False, guarantee=guarantee)
        self.produced = 0
        self.seq_of: dict[int, int] = {}  # source value -> its source seq
        self.seen: list[int] = []  # dest data drained so far
        self.drained_to = 0  # dest seqs up to here were drained

    def _open(self) -> tuple[Engine, Store]:
        engine, store, _ = open_engine(StorageConfig(self.directory), clock=self.clock)
        return engine, store

    def read_dest(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        cursor = self.drained_to
        keys = []
        while True:
            page = self.engine.diff("dst", cursor, limit=1000)
            for record in page.records():
                out.append((record["$seq"], record["data"]))
                if self.guarantee == "exactly_once":
                    key = orjson.loads(record["meta"]["_topics_router"])
                    assert key[3] == self.seq_of[record["data"]]  # it names its source record
                    keys.append(key[3])
            if page.next_from_seq >= page.head_seq:
                assert len(keys) == len(set(keys)), "dest holds a source record twice"
                return out
            cursor = page.next_from_seq

    def apply(self, op: Op) -> None:
        kind, n = op
        self.clock.advance(1)
        if kind == "append":
            values = range(self.produced, self.produced + n)
            result = self.engine.append("src", [RecordIn.of(v) for v in values])
            self.seq_of.update(zip(values, result.seqs, strict=True))
            self.produced += n
        elif kind == "forward":
            self.engine.forward(max_records=n)
        elif kind == "drain":
            self.drain()
        elif kind == "seal":
            self.store.seal(self.engine)
        else:
            self.store.sync_blocking()
            self.store.close()  # no engine.close(): like a kill after the last sync
            self.engine, self.store = self._open()

    def drain(self) -> None:
        records = self.read_dest()
        self.seen += [data for _, data in records]
        if records:
            self.drained_to = records[-1][0]
            self.engine.delete("dst", before_seq=self.drained_to + 1)

    def finish(self) -> list[int]:
        for _ in range(10_000):
            result = self.engine.forward(max_records=5)
            if result.blocked:
                self.drain()
            elif not result.pending:
                break
        self.drain()
        self.store.close()
        return self.seen


def first_occurrences(values: list[int]) -> list[int]:
    seen: set[int] = set()
    out = []
    for value in values:
        if value not in seen:
            seen.add(value)
            out.append(value)
    return out


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(ops)
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_every_source_record_reaches_dest_in_source_order(guarantee: str, script: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        run = Run(Path(directory), guarantee)
        restarted = False
        for op in script:
            run.apply(op)
            run.read_dest()
            restarted = restarted or op[0] == "restart"
        copies = run.finish()
        assert first_occurrences(copies) == list(range(run.produced))
        if not restarted:
            assert copies == list(range(run.produced))  # duplicates only after a crash
