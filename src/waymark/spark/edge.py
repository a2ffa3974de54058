"""Spark as a pipeline stage: the rules of the topic source reading a relocatable
edge instead of a topic (docs/spark.md, "A Spark stage of a pipeline";
docs/semantics/pipeline.md §7).

Everything here is pure (no Spark, no I/O): the offset that carries the edge's
generation, following a handoff between micro-batches, the seq range a batch
reads, which rows a read accepts, what a commit acknowledges to the producers and
what a read does when its server is gone. :mod:`waymark.spark.edge_source` wires
these into Spark; ``tests/spark/test_edge_plan.py`` drives them with hypothesis.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from waymark.pipeline.errors import EdgeMalformed
from waymark.pipeline.locator import HandoffRolledBack, QueueLocator
from waymark.pipeline.patience import STORE_BUDGET_S
from waymark.pipeline.state import Position
from waymark.protocol import EDGE_BORN, EDGE_EVENT, EDGE_GEN, EDGE_ITEMS, EdgePack

from .options import (
    EDGE,
    EDGE_SOURCE,
    FAIL_ON_DATA_LOSS,
    HANDOFF,
    STAGE,
    STARTING,
    STORE_BUDGET,
    SUBSCRIBE,
    SUBSCRIBE_PATTERN,
    flag,
    milliseconds,
    resolve,
)

GEN = EDGE_GEN  # the meta key of a pack's generation (docs/semantics/pipeline.md §3.1)


@dataclass(frozen=True, slots=True)
class EdgeOffset:
    """Where a Spark stage is on its input edge: the placement it is bound to (its
    generation, server, topic and ``start_seq``) and the seq up to which records of
    that placement were handed to Spark. Generation 0 means the edge was not placed
    yet. The placement travels in the offset so that Spark's offset log alone
    re-plans a batch, whatever the handoff record says by then
    (docs/semantics/pipeline.md §7.2)."""

    generation: int
    server: str
    topic: str
    start_seq: int
    seq: int

    def to_json(self) -> dict[str, int | str]:
        return {
            "generation": self.generation,
            "server": self.server,
            "topic": self.topic,
            "start_seq": self.start_seq,
            "seq": self.seq,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, int | str]) -> EdgeOffset:
        return cls(
            int(value["generation"]),
            str(value["server"]),
            str(value["topic"]),
            int(value["start_seq"]),
            int(value["seq"]),
        )

    @property
    def position(self) -> Position:
        return Position(self.generation, self.seq)


UNPLACED = EdgeOffset(0, "", "", 0, 0)


def offsets_json(edge: str, offset: EdgeOffset) -> dict[str, dict[str, int | str]]:
    """The offset as Spark's offset log holds it: ``{"<edge>": {...}}``."""
    return {edge: offset.to_json()}


def parse_offsets(edge: str, value: Mapping[str, Mapping[str, int | str]]) -> EdgeOffset:
    if set(value) != {edge}:
        raise ValueError(
            f"the checkpoint's offset names {sorted(value)}, this query reads edge {edge!r}: "
            "a checkpoint belongs to one edge"
        )
    return EdgeOffset.from_json(value[edge])


@dataclass(frozen=True, slots=True)
class EdgeOptions:
    """The source's options when it reads an edge (docs/spark.md, the options table)."""

    edge: str
    handoff: str
    stage: str
    # how long one call to the handoff store waits out an outage (docs/semantics/pipeline.md §10)
    store_budget_s: float = STORE_BUDGET_S
    # Records gone from the edge's topic fail the query instead of moving the edge; off
    # by default: the producers still hold them (docs/semantics/pipeline.md §7.4).
    fail_on_data_loss: bool = False


def parse_options(options: Mapping[str, str]) -> EdgeOptions | None:
    """``edge``, ``handoff`` and ``stage`` when the source reads an edge, None when it
    reads topics. ``options`` are already resolved (:func:`waymark.spark.options.resolve`).
    Exactly one of ``subscribe``, ``subscribePattern`` and ``edge`` is given, like the
    Kafka source's ``subscribe`` / ``subscribePattern`` / ``assign``; an edge takes the
    options of :data:`waymark.spark.options.EDGE_SOURCE` and needs ``handoff`` (where
    its handoff record is) and ``stage`` (the pipeline's name of this stage, under
    which its progress acknowledges what the producers may forget)."""
    chosen = [name for name in (SUBSCRIBE, SUBSCRIBE_PATTERN, EDGE) if name in options]
    if len(chosen) != 1:
        raise ValueError(
            "the waymark source reads exactly one of option 'subscribe' (a comma-separated "
            "list of topics; alias 'topics'), 'subscribePattern' (a regular expression "
            f"matching whole topic names) and 'edge' (a pipeline edge's name); given: {chosen}"
        )
    edge = options.get(EDGE)
    if edge is None:
        for name in (HANDOFF, STAGE, STORE_BUDGET):
            if name in options:
                raise ValueError(f"option {name!r} goes with option 'edge', not with topics")
        return None
    if not edge.strip():
        raise ValueError("option 'edge' names a pipeline edge")
    if STARTING in options:
        raise ValueError(
            "option 'startingOffsets' does not apply to an edge: a stage starts at its "
            "checkpointed input position, else at the published placement's start"
        )
    resolve(options, EDGE_SOURCE)  # what an edge does not honour fails the query
    missing = [name for name in (HANDOFF, STAGE) if not options.get(name)]
    if missing:
        raise ValueError(
            f"the waymark source reading edge {edge!r} needs option(s) {missing}: 'handoff' "
            "is the pipeline's handoff store (file:///dir or s3://bucket/prefix), 'stage' "
            "this stage's name in the pipeline"
        )
    budget_ms = milliseconds(options, STORE_BUDGET, int(STORE_BUDGET_S * 1000))
    return EdgeOptions(edge.strip(), options["handoff"], options["stage"], budget_ms / 1000,
                       flag(options, FAIL_ON_DATA_LOSS, False))  # fmt: skip


def bind(locator: QueueLocator) -> EdgeOffset:
    """The start of a placement: nothing of it read yet."""
    return EdgeOffset(
        locator.generation, locator.server, locator.topic, locator.start_seq, locator.start_seq
    )


def initial(published: QueueLocator | None, resume: Position | None) -> EdgeOffset:
    """Where a new query starts: the published placement, after the stage's
    checkpointed input position when that is of the same generation, else at the
    placement's start (docs/semantics/pipeline.md §4.3)."""
    if published is None:
        return UNPLACED
    start = bind(published)
    if resume is not None and resume.generation == published.generation:
        return replace(start, seq=max(start.seq, resume.seq))
    return start


def follow(start: EdgeOffset, published: QueueLocator | None) -> EdgeOffset:
    """The placement the next batch reads: the published one when it is newer than
    ``start``'s (a rebind, from its ``start_seq``), else ``start``'s. A batch planned
    after a newer handoff was seen never reads an older generation
    (docs/semantics/pipeline.md §7.1)."""
    if published is not None and published.generation > start.generation:
        return bind(published)
    if start.generation and (published is None or published.generation < start.generation):
        # restored or edited: waiting for a newer one would stall the query silently
        raise HandoffRolledBack(published.edge if published else start.topic, published,
                                start.generation)  # fmt: skip
    return start


PackAt = tuple[int, int, int]  # a record of an edge: its seq, generation and item count


def advance(base: EdgeOffset, head: int | None, max_items: int | None = None,
            packs: Sequence[PackAt] = ()) -> EdgeOffset:  # fmt: skip
    """The end of the next batch from ``base``: up to the placement's ``head`` (None
    when its server does not answer: no new records). With ``max_items``
    (``maxOffsetsPerTrigger``), whole packs holding at most that many items, at least
    one pack, so every batch progresses: ``packs`` are the ``(seq, generation,
    items)`` of the records after ``base`` in order, read up to ``head`` or one pack
    past the limit. A record of another generation gives this batch no row (a stale
    one is dropped, a newer one is its own placement's read) and counts none
    (docs/spark.md, "A Spark stage of a pipeline")."""
    if base.generation == 0 or head is None or head <= base.seq:
        return base
    end = head
    if max_items is not None:
        taken, last = 0, base.seq
        for seq, generation, items in packs:
            count = items if generation == base.generation else 0
            if taken and taken + count > max_items:
                end = min(head, last)
                break
            taken, last = taken + count, seq
    return replace(base, seq=end)


@dataclass(frozen=True, slots=True)
class EdgeRange:
    """Records of one placement with ``lo < seq <= hi``."""

    generation: int
    server: str
    topic: str
    lo: int
    hi: int


def span(start: EdgeOffset, end: EdgeOffset) -> EdgeRange | None:
    """What the batch ``(start, end]`` reads, from the two offsets alone: within one
    generation, the seqs after ``start``; across a handoff, the new placement from its
    ``start_seq`` (what the old one held unread is unacknowledged, so its producers
    write it again there; docs/semantics/pipeline.md §3.5). None when nothing."""
    if end.generation == 0:
        return None
    if end.generation < start.generation:
        raise ValueError(f"an edge offset went back from generation {start.generation} "
                         f"to {end.generation}")  # fmt: skip
    lo = start.seq if start.generation == end.generation else end.start_seq
    if end.seq <= lo:
        return None
    return EdgeRange(end.generation, end.server, end.topic, lo, end.seq)


def acknowledged(end: EdgeOffset, published_generation: int) -> Position | None:
    """What committing the batch ending at ``end`` tells the producers they may forget:
    ``end``'s position while its generation is still the published one; nothing once
    a newer one is published, since a read of the older placement may have given up
    on what its dead server held (:func:`after_failure`), and those records are
    written again only by producers that still hold them
    (docs/semantics/pipeline.md §7.3)."""
    if end.generation == 0 or published_generation != end.generation:
        return None
    return end.position


class OnUnreachable(Enum):
    """What a read does when its placement's server does not answer."""

    ABANDON = "abandon"  # a newer generation is published: its producers write the rest there
    RETRY = "retry"
    FAIL = "fail"


def after_failure(generation: int, published_generation: int, waited_s: float,
                  limit_s: float) -> OnUnreachable:  # fmt: skip
    """A read of ``generation`` that cannot reach its server: give the rest of its
    range up once a newer generation is published (docs/semantics/pipeline.md §7.3),
    else wait for the server or the handoff until ``limit_s``, then fail the task."""
    if published_generation > generation:
        return OnUnreachable.ABANDON
    return OnUnreachable.RETRY if waited_s < limit_s else OnUnreachable.FAIL


def stamps(batch: pa.RecordBatch, key: str = GEN, missing: int = 0) -> pa.Array:
    """Each row's generation from its ``meta`` (``missing`` where it has none); with
    ``key`` another number the meta holds."""
    meta = batch.column(batch.schema.get_field_index("meta"))
    found = pc.map_lookup(meta, pa.scalar(key, pa.string()), "first")
    return pc.fill_null(pc.cast(found, pa.int64()), missing)


def accept(batch: pa.RecordBatch, generation: int, hi: int) -> tuple[pa.RecordBatch, int]:
    """The rows of a page a read of ``generation`` up to seq ``hi`` accepts, and how
    many items it dropped as stale: rows of ``generation`` are kept, older ones are
    dropped and their items counted (docs/semantics/pipeline.md §1.3: a pack's meta
    holds its count; one for a record without), and newer ones — the edge moved back
    to this server — are left to the read of their own placement."""
    seqs = batch.column(batch.schema.get_field_index("seq"))
    inside = pc.less_equal(seqs, pa.scalar(hi, pa.int64()))
    stamp = stamps(batch)
    keep = pc.and_(inside, pc.equal(stamp, pa.scalar(generation, pa.int64())))
    if pc.all(keep).as_py():  # the usual page: every row of this generation, kept as is
        return batch, 0
    stale = pc.and_(inside, pc.less(stamp, pa.scalar(generation, pa.int64())))
    dropped = pc.sum(pc.filter(stamps(batch, EDGE_ITEMS, 1), stale)).as_py()
    return batch.filter(keep), int(dropped or 0)


_decode_packs = msgspec.json.Decoder(list[EdgePack]).decode
_decode_ids = msgspec.json.Decoder(list[str]).decode


def unpack(rows: pa.RecordBatch) -> pa.RecordBatch:
    """One row per item of each pack in ``rows`` (rows of the source's schema, each an
    edge record): its pack's topic, seq, time, node and tag, its own JSON value as
    ``data`` and as ``meta`` the pack's generation with its event id and birth time
    (``wm.gen``, ``wm.event``, ``wm.t0``), the columns a row had when a record held one
    item (docs/semantics/pipeline.md §7)."""
    n = rows.num_rows
    if not n:
        return rows
    names = rows.schema.names
    data = rows.column(names.index("data"))
    offsets = np.frombuffer(data.buffers()[1], np.int32, n + 1, data.offset * 4)  # type: ignore[call-overload]  # a pa.Buffer is a buffer
    buffer = data.buffers()[2]
    text = buffer.to_pybytes() if buffer is not None else b""
    seqs = rows.column(names.index("seq")).to_pylist()
    bounds = offsets.tolist()
    try:
        packs = _decode_packs(b"[%s]" % b",".join(
            [text[lo:hi] for lo, hi in itertools.pairwise(bounds)]
        ))  # fmt: skip
    except msgspec.ValidationError as error:
        raise EdgeMalformed(f"a record in seqs [{seqs[0]}, {seqs[-1]}] of an edge is not a "
                            f"pack: {error}") from error  # fmt: skip
    counts = [len(pack.items) for pack in packs]
    for seq, pack, count in zip(seqs, packs, counts, strict=True):
        if len(pack.events) != count or len(pack.born_ms) != count or not count:
            raise EdgeMalformed(f"the edge record at seq {seq} has {len(pack.events)} ids, "
                                f"{len(pack.born_ms)} birth times and {count} items")  # fmt: skip
    chain = itertools.chain.from_iterable
    items = list(chain(pack.items for pack in packs))
    events = _decode_ids(b"[%s]" % b",".join(list(chain(pack.events for pack in packs))))
    born = list(chain(pack.born_ms for pack in packs))
    generations = np.repeat(np.asarray(stamps(rows).to_pylist(), np.int64), counts).tolist()
    m = len(items)
    values: list[bytes] = []
    for generation, event, t0 in zip(generations, events, born, strict=True):
        values += (b"%d" % generation, event.encode(), b"%d" % t0)
    keys = [GEN.encode(), EDGE_EVENT.encode(), EDGE_BORN.encode()] * m
    three = _ints(pa.int32(), np.arange(0, 3 * m + 1, 3, dtype=np.int32))  # 3 keys an item
    meta = pa.MapArray.from_arrays(three, _strings(keys), _strings(values))  # type: ignore[call-overload]  # int32 offsets, as the map type's own
    at = _ints(pa.int64(), np.repeat(np.arange(n, dtype=np.int64), counts))
    columns = [rows.column(i).take(at) for i in range(len(names))]
    columns[names.index("meta")] = meta
    columns[names.index("data")] = _strings(items)
    return pa.RecordBatch.from_arrays(columns, schema=rows.schema)


def _ints(kind: pa.DataType, values: np.ndarray) -> pa.Array:
    # from the buffer, not pa.array(): its first call imports pandas (~1 s a process)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])  # type: ignore[arg-type]  # an ndarray is a buffer


def _strings(parts: list[bytes] | list[msgspec.Raw]) -> pa.Array:
    ends = np.cumsum(np.fromiter(map(len, parts), np.int32, len(parts)), dtype=np.int32)
    offsets = pa.py_buffer(np.concatenate([np.zeros(1, np.int32), ends]))  # type: ignore[arg-type]  # an ndarray is a buffer
    return pa.Array.from_buffers(pa.string(), len(parts),
                                 [None, offsets, pa.py_buffer(b"".join(parts))])  # fmt: skip
