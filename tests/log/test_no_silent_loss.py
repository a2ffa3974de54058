"""The no-silent-loss contract (docs/semantics/topics.md §9.2-§9.4), as a hypothesis state
machine.

Random appends, deletions, cap/TTL eviction under a manual clock, recreates and
reads run against the production engine and an independent model. Every read
checks that each seq the reader passes is delivered (byte for byte), inside the
tombstone's gap, deleted, or node-filtered — and that a tombstone appears exactly
when live records past the cursor were lost involuntarily.

The mutation tests at the bottom break the engine's guards and assert that this
machine finds the break.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, Durability, Engine, RecordIn, TagMatch
from waymark.log import chunk as chunk_module
from waymark.log import journal as journal_module
from waymark.log import topic as topic_module
from waymark.log.chunk import Chunk
from waymark.log.config import StorageConfig
from waymark.log.prebuilt import build
from waymark.log.records import plain_records
from waymark.log.storage import catalog as catalog_module
from waymark.log.storage import seal as seal_module
from waymark.log.storage.catalog import TopicEntry
from waymark.log.storage.restore import open_engine
from waymark.log.topic import Topic
from waymark.log.writers import PartKey
from waymark.protocol import DiffResponse, Limits

TOPIC = "t"
WRITER = "sink"
DIFF_PAGE = msgspec.json.Decoder(DiffResponse)
RAW_DIFF_PAGE = msgspec.json.Decoder(DiffResponse[msgspec.Raw])
TAGS = ["a", "ab", "b", None]
NODES = ["n1", "n2", None]


@dataclass
class ModelRecord:
    seq: int
    ts: int
    node: str | None
    tag: str | None
    data: int
    status: str = "live"  # live | deleted | cap | ttl

    @property
    def size(self) -> int:
        return len(orjson.dumps(self.data))


@dataclass
class Reader:
    cursor: int
    epoch: int
    nodes: frozenset[str] | None


@dataclass
class Model:
    epoch: int
    records: dict[int, ModelRecord] = field(default_factory=dict)
    next_seq: int = 1
    cap_records: int = 0
    ttl_ms: int = 0
    # Seqs skipped by a crash: (lo, hi, the most the model says that crash could lose).
    holes: list[tuple[int, int, int]] = field(default_factory=list)
    # Seqs handed out since the topic was last idle (two trim passes with no seq handed
    # out between them): what a crash may take, since everything before is synced.
    idle_head: int = 0
    pass_mark: int = 0  # next_seq at the previous trim pass

    @property
    def head(self) -> int:
        return self.next_seq - 1

    def live(self) -> list[ModelRecord]:
        return [r for r in self.records.values() if r.status == "live"]

    def earliest(self) -> int:
        live = self.live()
        return live[0].seq if live else self.head + 1

    @property
    def exposed(self) -> int:
        return self.head - self.idle_head

    def hole_after(self, cursor: int) -> tuple[int, int, int] | None:
        return next((h for h in self.holes if h[1] > cursor), None)

    def lost(self) -> list[ModelRecord]:
        return [r for r in self.records.values() if r.status in ("cap", "ttl")]

    def expire(self, now: int) -> None:
        if self.ttl_ms:
            for r in self.live():
                if now - r.ts > self.ttl_ms:
                    r.status = "ttl"

    def evict(self) -> None:
        if self.cap_records:
            live = self.live()
            for r in live[: max(0, len(live) - self.cap_records)]:
                r.status = "cap"


class NoSilentLoss(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.engine = self.open()
        state, _ = self.engine.put_topic(TOPIC, ConfigPatch())
        self.model = Model(epoch=state.epoch)
        self.readers: list[Reader] = [Reader(0, state.epoch, None)]

    def open(self) -> Engine:
        return Engine(clock=self.clock)

    # --- writers ---------------------------------------------------------------
    @rule(
        batch=st.lists(
            st.tuples(st.sampled_from(TAGS), st.sampled_from(NODES), st.integers(0, 10**6)),
            min_size=1,
            max_size=6,
        )
    )
    def append(self, batch: list[tuple[str | None, str | None, int]]) -> None:
        records = [RecordIn.of(data, tag=tag, node=node) for tag, node, data in batch]
        now = self.clock.now_ms()
        m = self.model
        m.expire(now)
        result = self.engine.append(TOPIC, records)
        assert result.seqs == list(range(m.next_seq, m.next_seq + len(batch)))
        for (tag, node, data), seq in zip(batch, result.seqs, strict=True):
            m.records[seq] = ModelRecord(seq, now, node, tag, data)
        m.next_seq += len(batch)
        m.evict()

    @rule(cap=st.integers(0, 8), ttl=st.sampled_from([0, 50, 200]))
    def configure(self, cap: int, ttl: int) -> None:
        m = self.model
        m.expire(self.clock.now_ms())
        self.engine.put_topic(TOPIC, ConfigPatch(cap_records=cap, ttl_ms=ttl))
        m.cap_records, m.ttl_ms = cap, ttl
        m.expire(self.clock.now_ms())
        m.evict()

    @rule(ms=st.integers(0, 150))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.model.expire(self.clock.now_ms())

    @rule(
        before=st.one_of(st.none(), st.integers(0, 40)),
        match=st.one_of(
            st.none(),
            st.sampled_from([["tag", "Eq", "a"], ["tag", "Glob", "a*"], "b", ["tag", "Glob", "*"]]),
        ),
    )
    def delete(self, before: int | None, match: object) -> None:
        if before is None and match is None:
            return
        selector = TagMatch.parse(match) if match is not None else None
        now = self.clock.now_ms()
        result = self.engine.delete(TOPIC, before_seq=before, match=selector).response
        m = self.model
        bound = m.next_seq if before is None else min(m.next_seq, before)
        deleted = 0
        for r in m.live():
            if r.seq >= bound:
                continue
            if selector is not None and (r.tag is None or not selector.matches(r.tag)):
                continue
            r.status = "deleted"
            deleted += 1
        assert result.deleted == deleted
        if deleted:  # the deletion's own seq, born deleted (docs/semantics/topics.md §7.1)
            m.records[m.next_seq] = ModelRecord(m.next_seq, now, None, None, 0, "deleted")
            m.next_seq += 1
        assert result.head_seq == m.head

    @rule()
    def recreate(self) -> None:
        self.engine.delete_topic(TOPIC)
        state, created = self.engine.put_topic(TOPIC, ConfigPatch())
        assert created and state.epoch > self.model.epoch
        self.model = Model(epoch=state.epoch)

    # --- readers ---------------------------------------------------------------
    @rule(nodes=st.sampled_from([None, frozenset({"n1"}), frozenset({"n1", "n2"})]))
    def add_reader(self, nodes: frozenset[str] | None) -> None:
        if len(self.readers) < 4:
            self.readers.append(Reader(0, self.model.epoch, nodes))

    @rule(data=st.data(), limit=st.integers(1, 5), pages=st.integers(1, 4))
    def read(self, data: st.DataObject, limit: int, pages: int) -> None:
        reader = data.draw(st.sampled_from(self.readers))
        for _ in range(pages):  # a reader follows its cursor page after page
            self.read_page(reader, limit)

    def read_page(self, reader: Reader, limit: int) -> None:
        m = self.model
        m.expire(self.clock.now_ms())
        result = self.engine.diff(
            TOPIC, reader.cursor, limit=limit, nodes=reader.nodes, epoch=reader.epoch
        )
        earliest = m.earliest()
        tomb = result.tombstone
        if reader.epoch != m.epoch:
            assert tomb is not None and tomb.reason == "recreated"
            assert (tomb.gap_from, tomb.gap_to) == (1, m.head)
            effective = earliest - 1
            reader.epoch = m.epoch
        else:
            lost = [r for r in m.lost() if r.seq > reader.cursor]
            if lost:
                assert tomb is not None, f"silent loss of {[r.seq for r in lost]}"
                assert tomb.gap_from == reader.cursor + 1
                assert tomb.gap_to == earliest - 1 == tomb.seq - 1
                assert all(r.seq <= tomb.gap_to for r in lost)
                reasons = {r.status for r in lost}
                assert tomb.reason in (reasons.pop() if len(reasons) == 1 else "mixed", "mixed")
                effective = tomb.gap_to
            elif (hole := m.hole_after(reader.cursor)) and hole[0] <= reader.cursor + 1:
                # Seqs a crash skipped read like eviction: a tombstone, never silence.
                assert tomb is not None and tomb.reason == "lost", f"silent crash hole {hole}"
                assert (tomb.gap_from, tomb.gap_to) == (reader.cursor + 1, hole[1])
                assert tomb.gap_to - tomb.gap_from + 1 <= hole[2], (
                    f"told of {tomb.gap_to - tomb.gap_from + 1} lost seqs; at most "
                    f"{hole[2]} could have been lost"
                )
                effective = hole[1]
            else:
                assert tomb is None, f"tombstone {tomb} without involuntary loss"
                effective = reader.cursor
        if tomb is not None:
            # $seq - 1 is the SSE id: resuming there must be where this read went on from.
            assert tomb.seq - 1 == effective, f"tombstone {tomb} resumes elsewhere"
        # A page stops before the next hole, so that hole's tombstone opens the next page.
        next_hole = m.hole_after(effective)
        stop = next_hole[0] - 1 if next_hole else m.head
        next_from = result.next_from_seq
        assert effective <= next_from <= max(stop, effective)
        window = [r for r in m.live() if effective < r.seq <= next_from]
        candidates = [r for r in m.live() if effective < r.seq <= stop]
        assert len(window) <= limit
        if candidates:
            assert window, "a read with live records ahead made no progress"
        if len(candidates) < limit:
            assert next_from == max(stop, effective)
        expected = [r for r in window if not (reader.nodes and r.node in reader.nodes)]
        got = result.records()
        body = result.to_json()
        wire = orjson.loads(body)  # the HTTP body agrees with the page
        assert wire["records"] == got and wire["next_from_seq"] == next_from
        assert wire["tombstone"] == (msgspec.to_builtins(tomb) if tomb else None)
        # ... and is exactly the contract's DiffResponse: its types read every field back.
        assert msgspec.to_builtins(DIFF_PAGE.decode(body)) == wire
        raw = RAW_DIFF_PAGE.decode(body).records
        assert [orjson.loads(bytes(r.data)) for r in raw] == [g["data"] for g in got]
        assert [g["$seq"] for g in got] == [r.seq for r in expected]
        for g, r in zip(got, expected, strict=True):
            assert g["data"] == r.data and g["$ts"] == r.ts
            assert g.get("$tag") == r.tag and g.get("$node") == r.node
        assert result.caught_up == (next_from >= m.head)
        reader.cursor = next_from

    # --- state -----------------------------------------------------------------
    @invariant()
    def watermarks_match_the_model(self) -> None:
        m = self.model
        m.expire(self.clock.now_ms())
        state = self.engine.get_topic(TOPIC, touch=False)
        live = m.live()
        assert state.head_seq == m.head
        assert state.earliest_seq == m.earliest()
        assert state.count == len(live)
        assert state.bytes == sum(r.size for r in live)
        lost = m.lost()
        assert state.evict_floor == (max(r.seq for r in lost) + 1 if lost else 1)
        assert state.evict_floor <= state.earliest_seq


SETTINGS = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tiny chunks so chunk boundaries, drops and payload release happen constantly.
    monkeypatch.setattr(chunk_module, "CHUNK_RECORDS", 4)


def test_no_silent_loss(small_chunks: None) -> None:
    run_state_machine_as_test(NoSilentLoss, settings=SETTINGS)


# --- the machine catches broken guards ------------------------------------------------

# Finding one failure is the point; shrinking it is not. The search is fixed (no database,
# derandomized), so whether a mutant is caught never depends on what an earlier run found.
MUTATION_SETTINGS = settings(
    SETTINGS, max_examples=400, database=None, derandomize=True, phases=[Phase.generate]
)


def test_catches_loss_that_never_raises_the_evict_floor(
    small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutation: involuntary loss no longer advances evict_floor, so it would be silent.
    monkeypatch.setattr(Topic, "evict_floor", property(lambda self: self.seq_base))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(NoSilentLoss, settings=MUTATION_SETTINGS)


def test_catches_deletion_that_raises_the_evict_floor(
    small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutation: deletion treated as involuntary loss, so a deleted gap would tombstone.
    original = Topic._remove_front

    def remove_front_as_loss(self: Topic, upto: int, reason: str | None) -> int:
        return original(self, upto, reason or "cap")

    monkeypatch.setattr(Topic, "_remove_front", remove_front_as_loss)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(NoSilentLoss, settings=MUTATION_SETTINGS)


def test_catches_a_read_that_skips_the_node_filter_boundary(
    small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutation: the reader's node filter also drops records with no node at all.
    original = Topic._reader_node_ids

    def overeager(chunk: Chunk, nodes: frozenset[str] | None) -> frozenset[int] | None:
        ids = original(chunk, nodes)
        return None if ids is None else ids | {0}

    monkeypatch.setattr(Topic, "_reader_node_ids", staticmethod(overeager))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(NoSilentLoss, settings=MUTATION_SETTINGS)


# --- the same contract across seals, clean restarts and crashes ----------------------


class DurableNoSilentLoss(NoSilentLoss):
    """The machine above over durable storage, with seals and restarts thrown in:
    every watermark, floor, deletion and epoch must come back exactly as it was, and a
    crash may only skip seqs — which readers must then see as a ``lost`` tombstone, and
    never more of them than the topic handed out since it was last idle (everything
    before that was synced, so only those could have been lost)."""

    def open(self) -> Engine:
        self.directory = Path(tempfile.mkdtemp(prefix="waymark-machine-"))
        engine, self.store, _ = open_engine(StorageConfig(self.directory), clock=self.clock)
        return engine

    @rule()
    def seal(self) -> None:
        """The server's background work: a trim pass, and a seal."""
        self.trim_pass()
        self.store.seal(self.engine)

    def trim_pass(self) -> None:
        """A topic idle since the previous pass gets its ceiling trimmed to its head, so
        the model's exposure starts again from there."""
        self.engine.trim_ceilings()
        m = self.model
        if m.next_seq == m.pass_mark:
            m.idle_head = m.head
        m.pass_mark = m.next_seq

    @rule(clean=st.booleans(), idle=st.booleans())
    def restart(self, clean: bool, idle: bool) -> None:
        if idle:  # the crash comes after the topic sat idle for two passes
            self.trim_pass()
            self.trim_pass()
        if clean:
            self.engine.close()  # exact heads: no skipped seqs
        self.store.sync_blocking()  # an in-process "crash" loses no synced frame
        self.store.close()
        m = self.model
        before = m.next_seq
        self.engine, self.store, _ = open_engine(StorageConfig(self.directory), clock=self.clock)
        after = self.engine.get_topic(TOPIC, touch=False).next_seq
        if clean:
            assert after == before, "a clean restart skipped seqs"
        else:
            assert after >= before, "a seq could be handed out twice"
            # The reported gap never exceeds what the crash could have taken.
            assert after - before <= m.exposed, (
                f"a crash skipped {after - before} seqs; at most {m.exposed} were handed "
                "out since the topic was last idle"
            )
            if after > before:
                m.holes.append((before, after - 1, m.exposed))
                m.next_seq = after
        m.idle_head, m.pass_mark = m.head, 0  # restarted: idle; no pass has looked yet

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class SinkNoSilentLoss(DurableNoSilentLoss):
    """The durable machine with an exactly-once sink's batches among the appends: their
    full chunks are pending chunks (laid out when first read or sealed) in a topic that
    is read, deleted from, evicted, sealed and restarted around them."""

    def __init__(self) -> None:
        super().__init__()
        self.writer_epoch, self.batch = self.engine.open_writer(WRITER), 0

    @rule(datas=st.lists(st.integers(0, 10**6), min_size=1, max_size=9), laid=st.booleans())
    def publish(self, datas: list[int], laid: bool) -> None:
        """An exactly-once sink's batch: staged columnar, as the server's bulk stage path
        keeps data-only records, then published as one append — laid out ahead as the
        server does for a large one (its full chunks then pending chunks, laid out when
        first read or sealed) or by the engine itself."""
        now = self.clock.now_ms()
        m = self.model
        m.expire(now)
        self.batch += 1
        array = b"[" + b",".join(b'{"data":%d}' % d for d in datas) + b"]"
        plain = plain_records(array, [msgspec.Raw(b"%d" % d) for d in datas], Limits())
        assert plain is not None
        part, epoch = PartKey(0, 0), self.writer_epoch
        assert self.engine.stage(TOPIC, WRITER, epoch, self.batch, part, plain)
        parts = [(part, 1)]
        layout = self.engine.lay_out_publish(TOPIC, WRITER, epoch, self.batch, parts)
        prebuilt = build(layout) if laid and layout is not None else None
        result = self.engine.publish(TOPIC, WRITER, epoch, self.batch, parts, prebuilt)
        assert (result.first_seq, result.count) == (m.next_seq, len(datas))
        for i, data in enumerate(datas):
            m.records[m.next_seq + i] = ModelRecord(m.next_seq + i, now, None, None, data)
        m.next_seq += len(datas)
        m.evict()


DURABLE_SETTINGS = settings(SETTINGS, max_examples=120)


def test_no_silent_loss_across_seals_and_crashes(small_chunks: None) -> None:
    run_state_machine_as_test(DurableNoSilentLoss, settings=DURABLE_SETTINGS)


def test_catches_a_catalog_that_forgets_the_eviction_floor(
    small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutation: seals drop the cap floor, so after a restart earlier cap loss would
    # read silently.
    original = catalog_module.topic_entry

    def forgetful(topic: Topic, segments: list[int]) -> TopicEntry:
        entry = original(topic, segments)
        entry.cap_floor = 0
        return entry

    monkeypatch.setattr(seal_module, "topic_entry", forgetful)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            DurableNoSilentLoss,
            settings=settings(MUTATION_SETTINGS, max_examples=2000),
        )


LOST_TOO_MUCH = r"could have been lost|since the topic was last idle"


def test_catches_a_fixed_seq_reservation(
    small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutation: the old fixed block of 4096 seqs ahead of every append that needs more;
    # a crash then reports thousands of seqs as lost when a few at most could be.
    def fixed_block(self: Topic, last: int, now: int, write: topic_module.WriteFrame) -> bool:
        if self.config.durability is Durability.MEMORY or last <= self.ceiling:
            return False
        self.ceiling = last + topic_module.SEQ_RESERVE
        write(journal_module.HeadFrame(self.name, self.epoch, self.ceiling))
        return True

    monkeypatch.setattr(Topic, "reserve", fixed_block)
    with pytest.raises(AssertionError, match=LOST_TOO_MUCH):
        run_state_machine_as_test(DurableNoSilentLoss, settings=MUTATION_SETTINGS)


def test_catches_ceilings_that_stay_ahead_of_an_idle_topic(
    small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutation: idle topics keep their lead, so a crash while idle reports a gap.
    monkeypatch.setattr(Engine, "trim_ceilings", lambda self: 0)
    with pytest.raises(AssertionError, match=LOST_TOO_MUCH):
        run_state_machine_as_test(DurableNoSilentLoss, settings=MUTATION_SETTINGS)


def test_no_silent_loss_with_sink_batches(small_chunks: None) -> None:
    run_state_machine_as_test(SinkNoSilentLoss, settings=settings(SETTINGS, max_examples=60))
