"""Arrow pages agree with JSON pages (docs/http-api.md, "Arrow pages"), as a hypothesis
property over the no-silent-loss state machines: at every read, the same read
answered as Arrow holds the same records, field for field and byte for byte in
``data``, and the same tombstone and cursor fields, over topics with cap/TTL gaps,
deletes, node filters, recreates, crash holes (``lost``), chunk boundaries, and
records with meta, unicode and nested data.

The mutation tests at the bottom break the columnar read's guards and assert that
the property finds the break.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test
from tests.conftest import only_rules

from waymark.clock import ManualClock
from waymark.log import ConfigPatch, RecordIn, TagMatch, pages
from waymark.log.config import StorageConfig
from waymark.log.storage.restore import open_engine
from waymark.log.storage.segment import SealedChunk
from waymark.log.topic import Topic
from waymark.protocol import DiffResponse
from waymark.protocol.arrow import PAGE_SCHEMA, decode_page

from .test_no_silent_loss import (
    DURABLE_SETTINGS,
    MUTATION_SETTINGS,
    NODES,
    SETTINGS,
    TAGS,
    TOPIC,
    DurableNoSilentLoss,
    ModelRecord,
    NoSilentLoss,
    Reader,
    small_chunks,  # noqa: F401 -- the fixture
)

RAW_PAGE = msgspec.json.Decoder(DiffResponse[msgspec.Raw])


@dataclass
class ShapedRecord(ModelRecord):
    """A model record with meta: its size counts the meta JSON too."""

    meta: dict[str, str] | None = None

    @property
    def size(self) -> int:
        extra = len(orjson.dumps(self.meta)) if self.meta is not None else 0
        return len(orjson.dumps(self.data)) + extra


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
# Objects with a "data" key of their own: its `,"data":` is not the record's.
KEYS = st.sampled_from(["data", "meta", "$seq"]) | TEXT
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=6,
)
# Keys and values that look like the record's own keys: the columnar read must find
# the real "data" key, never one inside a string.
AWKWARD = (
    st.sampled_from(["data", ',"data":', '"data":1}', "meta", "{", "}", ",", "é\u2028", ""]) | TEXT
)


def assert_same_page(json_body: bytes, arrow_body: bytes) -> None:
    """The Arrow page holds exactly what the JSON page holds."""
    wire = orjson.loads(json_body)
    page = decode_page(arrow_body)
    assert page.table.schema == PAGE_SCHEMA
    assert page.count == len(wire["records"])
    assert msgspec.to_builtins(page.tombstone) == wire["tombstone"]
    fields = ("next_from_seq", "head_seq", "earliest_seq", "caught_up", "epoch", "durability")
    assert {f: getattr(page, f) for f in fields} == {f: wire[f] for f in fields}
    raw = RAW_PAGE.decode(json_body).records
    columns = page.table.to_pydict()
    assert columns["data"] == [bytes(r.data).decode() for r in raw]  # the producer's bytes
    assert columns["seq"] == [r["$seq"] for r in wire["records"]]
    assert [int(ts.timestamp() * 1000) for ts in columns["ts"]] == [
        r["$ts"] for r in wire["records"]]  # fmt: skip
    assert columns["node"] == [r.get("$node") for r in wire["records"]]
    assert columns["tag"] == [r.get("$tag") for r in wire["records"]]
    metas = [None if m is None else dict(m) for m in columns["meta"]]
    assert metas == [r.get("meta") for r in wire["records"]]


class ArrowAgrees:
    """Mixed into a no-silent-loss machine: every read is also answered as Arrow."""

    def read_page(self, reader: Reader, limit: int) -> None:
        engine = self.engine  # type: ignore[attr-defined]
        args = (TOPIC, reader.cursor)
        kwargs = {"limit": limit, "nodes": reader.nodes, "epoch": reader.epoch, "touch": False}
        self.model.expire(self.clock.now_ms())  # type: ignore[attr-defined]
        arrow = pages.render(engine.diff(*args, columns=True, **kwargs))
        assert_same_page(engine.diff(*args, **kwargs).to_json(), arrow)
        super().read_page(reader, limit)  # type: ignore[misc]

    @rule(
        batch=st.lists(
            st.tuples(
                st.sampled_from(TAGS),
                st.sampled_from(NODES),
                JSON_VALUES,
                st.none() | st.dictionaries(AWKWARD, AWKWARD, max_size=3),
            ),
            min_size=1,
            max_size=6,
        )
    )
    def append_shaped(
        self, batch: list[tuple[str | None, str | None, object, dict | None]]
    ) -> None:
        """Records with meta and any JSON data, alongside the machine's plain ones."""
        records = [RecordIn.of(d, tag=t, node=n, meta=m) for t, n, d, m in batch]
        now = self.clock.now_ms()  # type: ignore[attr-defined]
        m = self.model  # type: ignore[attr-defined]
        m.expire(now)
        result = self.engine.append(TOPIC, records)  # type: ignore[attr-defined]
        for (tag, node, data, meta), seq in zip(batch, result.seqs, strict=True):
            m.records[seq] = ShapedRecord(seq, now, node, tag, data, meta=meta)  # type: ignore[arg-type]
        m.next_seq += len(batch)
        m.evict()


class ArrowNoSilentLoss(ArrowAgrees, NoSilentLoss):
    pass


class DurableArrowNoSilentLoss(ArrowAgrees, DurableNoSilentLoss):
    pass


ARROW_SETTINGS = SETTINGS.__class__(SETTINGS, max_examples=40)


def test_arrow_pages_agree_with_json_pages(small_chunks: None) -> None:  # noqa: F811
    run_state_machine_as_test(ArrowNoSilentLoss, settings=ARROW_SETTINGS)


def test_arrow_pages_agree_across_seals_and_crashes(small_chunks: None) -> None:  # noqa: F811
    settings = DURABLE_SETTINGS.__class__(DURABLE_SETTINGS, max_examples=15)
    run_state_machine_as_test(DurableArrowNoSilentLoss, settings=settings)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.lists(
        st.tuples(
            st.sampled_from(TAGS), st.sampled_from(NODES), JSON_VALUES,
            st.none() | st.dictionaries(AWKWARD, AWKWARD, max_size=3),
        ),
        min_size=1, max_size=30,
    ),
    before=st.integers(0, 12),
    deleted_tag=st.sampled_from(TAGS),
    reads=st.lists(
        st.tuples(st.integers(0, 31), st.integers(1, 40), st.sampled_from([None, *NODES])),
        min_size=1, max_size=4,
    ),
)  # fmt: skip
def test_arrow_pages_of_sealed_segments_agree_with_json_pages(
    small_chunks: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
    batch: list[tuple[str | None, str | None, object, dict | None]],
    before: int,
    deleted_tag: str | None,
    reads: list[tuple[int, int, str | None]],
) -> None:
    """Chunks sealed into segments are read through their mapped frames, not as one
    run of records: the same agreement, over meta, deletes and node filters."""
    engine, store, _ = open_engine(
        StorageConfig(tmp_path_factory.mktemp("sealed")), clock=ManualClock(1000)
    )
    try:
        engine.put_topic(TOPIC, ConfigPatch())
        engine.append(TOPIC, [RecordIn.of(d, tag=t, node=n, meta=m) for t, n, d, m in batch])
        if before:
            engine.delete(TOPIC, before_seq=before)
        if deleted_tag is not None:
            engine.delete(TOPIC, match=TagMatch(True, deleted_tag))
        store.seal(engine)
        sealed = [c for c in engine.kernel.existing(TOPIC).chunks if isinstance(c, SealedChunk)]
        assert sealed or not engine.kernel.existing(TOPIC).live_count  # what is live is sealed
        for cursor, limit, node in reads:
            kwargs = {"limit": limit, "nodes": None if node is None else frozenset({node})}
            arrow = pages.render(engine.diff(TOPIC, cursor, columns=True, **kwargs))
            assert_same_page(engine.diff(TOPIC, cursor, **kwargs).to_json(), arrow)
    finally:
        store.close()


# --- the property catches broken guards --------------------------------------------------


def test_catches_deleted_records_in_an_arrow_page(
    fixed_constants: None,  # the same search alone and in the suite
    small_chunks: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = Topic._span

    def undeleting(chunk, i, k, nodes):  # keeps the node filter, forgets deletions
        span = real(chunk, i, k, nodes)
        if nodes is None:
            span.keep = None
        return span

    monkeypatch.setattr(Topic, "_span", staticmethod(undeleting))
    with pytest.raises(AssertionError):
        # More examples than the other mutants: since a deletion takes a seq of its own,
        # a deleted record between two live ones in one page is a rarer draw.
        settings = MUTATION_SETTINGS.__class__(MUTATION_SETTINGS, max_examples=1200)
        machine = only_rules(ArrowNoSilentLoss, "append", "append_shaped", "delete",
                             "add_reader", "read")  # fmt: skip
        run_state_machine_as_test(machine, settings=settings)


def test_catches_an_arrow_page_that_skips_the_node_filter(
    fixed_constants: None,  # the same search alone and in the suite
    small_chunks: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = Topic._span
    monkeypatch.setattr(Topic, "_span", staticmethod(lambda c, i, k, nodes: real(c, i, k, None)))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(ArrowNoSilentLoss, settings=MUTATION_SETTINGS)


def test_catches_data_cut_without_the_meta_check(
    fixed_constants: None,  # the same search alone and in the suite
    small_chunks: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = pages._data

    def every_record_plain(buf, stops, size):  # cut by size, never looks for meta
        data, _ = real(buf, stops, size)
        return data, real(b"", stops[:0], size[:0])[1]

    monkeypatch.setattr(pages, "_data", every_record_plain)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(ArrowNoSilentLoss, settings=MUTATION_SETTINGS)


def test_catches_meta_left_out_of_an_arrow_page(
    fixed_constants: None,  # the same search alone and in the suite
    small_chunks: None,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pages, "_meta_column", lambda n, rows, maps: pages.pa.nulls(n, pages._META))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(ArrowNoSilentLoss, settings=MUTATION_SETTINGS)


def test_rendering_a_page_does_not_import_pandas() -> None:
    """pa.array(), pa.scalar() and to_numpy() import pandas on first use: seconds in a
    busy server's first Arrow answer. The page is built from buffers instead, and so are
    the engine's bulk layouts (a publish's chunks, a seal's segment data)."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from waymark.log import Engine, RecordIn\n"
        "from waymark.log.pages import render\n"
        "e = Engine()\n"
        "e.append('t', [RecordIn.of(1, meta={'a': 'b'}), RecordIn.of(2, tag='x', node='n')])\n"
        "e.delete('t', before_seq=2)\n"
        "e.append('t', [RecordIn.of(3, node='m'), RecordIn.of(4, meta={'c': 'd'})])\n"
        "render(e.diff('t', 0, columns=True, nodes=frozenset({'m'})))\n"
        # a sink's publish laid out from its staged runs, and a seal's segment data
        "from waymark.log.prebuilt import build\n"
        "from waymark.log.storage.segment import segment_data\n"
        "from waymark.log.writers import PartKey\n"
        "w, parts = e.open_writer('s'), [(PartKey(0, 0), 1)]\n"
        "e.stage('p', 's', w, 0, PartKey(0, 0), [RecordIn.of(5), RecordIn.of(6)])\n"
        "e.publish('p', 's', w, 0, parts, build(e.lay_out_publish('p', 's', w, 0, parts)))\n"
        "c = e.kernel.existing('p').chunks[0]\n"
        "segment_data(c, bytes(2), c.buf)\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_catches_sealed_records_cut_from_the_wrong_frame_bytes(
    small_chunks: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mutant: a segment's records located one byte after where they lie (an
    offset off by one, as a separator counted twice would put them)."""
    real = SealedChunk.records

    def one_off(self, i, j):
        buf, starts, ends = real(self, i, j)
        return buf, starts + 1, ends + 1

    monkeypatch.setattr(SealedChunk, "records", one_off)
    # A disagreement, or a record that no longer decodes (several at once: a group).
    broken = (AssertionError, msgspec.ValidationError, msgspec.DecodeError, ExceptionGroup)
    with pytest.raises(broken):
        test_arrow_pages_of_sealed_segments_agree_with_json_pages(None, tmp_path_factory)
