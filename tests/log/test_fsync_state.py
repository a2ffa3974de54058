"""An fsync topic's state agrees with its reads (docs/semantics/topics.md §2.2, §2.3,
docs/semantics/topics.md §5.5), as a hypothesis state machine: appends, deletes and
group-commit syncs that land in order, whenever the machine says, against the production
engine and a model of what is synced.

Readers of an fsync topic see only synced records. Whatever is waiting for its sync,
the state's head_seq, earliest_seq, count and bytes describe exactly what a read
returns, and a reader starting from that head_seq (or from any seq the topic handed
out) is never mistaken for a cursor of an earlier topic instance.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Durability, Engine, RecordIn
from waymark.log import chunk as chunk_module

TOPIC = "t"


@dataclass
class OrderedCommit:
    journal: OrderedJournal
    lsn: int

    @property
    def durable(self) -> bool:
        return self.journal.synced >= self.lsn

    async def wait(self) -> None:
        raise AssertionError("the engine never waits; the HTTP layer does")


class OrderedJournal:
    """Fault injector: a journal whose group commits land only when :meth:`sync` says,
    in order (a prefix of what was written), as a WAL shard's do."""

    def __init__(self) -> None:
        self.submitted = 0
        self.synced = 0

    def write(self, topic: str, frame: bytes) -> OrderedCommit:
        self.submitted += 1
        return OrderedCommit(self, self.submitted)

    def check_available(self, topic: str) -> None:
        return None

    def admit(self, topic: str) -> contextlib.AbstractContextManager[None]:
        self.check_available(topic)
        return contextlib.nullcontext()

    def latest(self, topic: str) -> OrderedCommit:
        return OrderedCommit(self, self.submitted)

    def sync_ms(self, topic: str) -> int:
        return 0

    def file(self, topic: str) -> int:
        return 0

    def sync(self, upto: int) -> None:
        self.synced = max(self.synced, min(upto, self.submitted))


class FsyncState(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.journal = OrderedJournal()
        self.engine = Engine(clock=ManualClock(), journal=self.journal)
        self.engine.put_topic(TOPIC, ConfigPatch(durability=Durability.FSYNC))
        self.data: dict[int, str] = {}  # seq -> data of every record not deleted
        self.lsn_of: dict[int, int] = {}  # seq -> the lsn of the frame that holds it

    @rule(values=st.lists(st.text(max_size=6), min_size=1, max_size=5))
    def append(self, values: list[str]) -> None:
        seqs = self.engine.append(TOPIC, [RecordIn.of(v) for v in values]).seqs
        lsn = self.journal.submitted  # the records frame is the last one written
        for seq, value in zip(seqs, values, strict=True):
            self.data[seq] = value
            self.lsn_of[seq] = lsn

    @rule(frames=st.integers(0, 3))
    def sync(self, frames: int) -> None:
        self.journal.sync(self.journal.synced + frames)

    @rule(back=st.integers(0, 6))
    def delete_before(self, back: int) -> None:
        # Deletes may reach records still waiting for their sync.
        topic = self.engine.kernel.existing(TOPIC)
        before, slot = max(1, topic.next_seq - back), topic.next_seq
        self.engine.delete(TOPIC, before_seq=before)
        if any(s < before for s in self.data):
            # It takes a seq of its own, in its frame (docs/semantics/topics.md §7.1):
            # readers pass it once that frame is synced.
            self.lsn_of[slot] = self.journal.submitted
        self.data = {s: v for s, v in self.data.items() if s >= before}

    @invariant()
    def state_is_what_reads_return(self) -> None:
        synced = self.journal.synced
        unsynced = [s for s, lsn in self.lsn_of.items() if lsn > synced]
        readable_head = min(unsynced) - 1 if unsynced else max(self.lsn_of, default=0)
        expected = {s: v for s, v in self.data.items() if s <= readable_head}

        state = self.engine.get_topic(TOPIC, touch=False)
        assert state.head_seq == readable_head
        assert state.assigned_head_seq == max(self.lsn_of, default=0)
        assert state.count == len(expected)
        assert state.bytes == sum(len(orjson.dumps(v)) for v in expected.values())
        assert state.earliest_seq == min(expected, default=readable_head + 1)
        assert state.evict_floor <= state.earliest_seq

        records, cursor = [], 0
        while True:
            page = self.engine.diff(TOPIC, cursor, limit=3)
            assert page.tombstone is None  # deletions are silent; nothing else removes
            assert (page.head_seq, page.earliest_seq) == (state.head_seq, state.earliest_seq)
            records += page.records()
            cursor = page.next_from_seq
            if page.caught_up:
                break
        assert {r["$seq"]: r["data"] for r in records} == expected

        # A reader starting at the reported head, or at any seq handed out, is current.
        for start in {state.head_seq, state.assigned_head_seq}:
            page = self.engine.diff(TOPIC, start)
            assert page.tombstone is None and page.records() == []
            assert page.next_from_seq == start


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunk_module, "CHUNK_RECORDS", 4)  # waiting records span chunks


def test_fsync_state_agrees_with_reads(small_chunks: None) -> None:
    run_state_machine_as_test(
        FsyncState,
        settings=settings(
            max_examples=200,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
