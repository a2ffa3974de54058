"""A pipeline's status (docs/pipeline.md, "Running it"): what ``waymark pipeline status
--json`` prints, what a runner started with ``report_to`` sends the server every few
seconds (``POST /v0/pipelines``), and what the console's Pipelines page draws
(docs/console.md). Like the fold and recovery client reports (docs/reports.md), it
is a statement of the runner about the pipeline, kept newest per pipeline run.

Also the shape of a record on a pipeline edge as its consumer reads it
(:class:`EdgePage`, docs/semantics/pipeline.md §3.1).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from .limits import NonNegative
from .records import Tombstone
from .reports import IntervalMs, ReporterName

Name = Annotated[str, Meta(min_length=1, max_length=255)]


class StageReport(Struct, kw_only=True):
    """One stage's counters (or one shard's, ``<stage>.<k>``), kept across restarts in
    the handoff store (``stages/<key>/report.json``)."""

    stage: str
    processed: int = 0
    relocations: int = 0
    rebinds: int = 0
    fenced: int = 0
    replayed: int = 0
    stale_dropped: int = 0
    disconnects: int = 0
    restarts: int = 0
    dead_lettered: int = 0  # poison events sent to the dead-letter topic
    last_error: str = ""  # why the stage last restarted (or stopped)
    recover_s: list[float] = msgspec.field(default_factory=list)
    latency_before_ms: list[int] = msgspec.field(default_factory=list)  # at a sink, sampled
    latency_after_ms: list[int] = msgspec.field(default_factory=list)
    done: bool = False
    updated_ms: int = 0
    # The fence (docs/semantics/pipeline.md §4.7): the stage state's incarnation the
    # publishing instance claimed, and this report's place among the stage's reports
    # (each one published one above the last). A report of an older incarnation is
    # refused by the store and by the server.
    incarnation: int = 0
    serial: int = 0


class PipelineEdge(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """An edge as placed (``<edge>``, or ``<edge>.<k>`` for the part shard k reads)."""

    edge: Name  # the edge the pipeline file declares
    generation: NonNegative  # 0: not placed yet
    server: Name | None
    topic: Name | None
    consumer: Name  # the stage (or shard) reading it
    # Items (events) of the current generation past the consumer's checkpoint, as
    # Kafka's consumer lag counts records; None: the server did not answer.
    lag: NonNegative | None
    # The same lag in edge records, the topic's log offsets: packs of items
    # (docs/semantics/pipeline.md §3.1); None as above, or from an older runner.
    lag_packs: NonNegative | None = None


class PipelineStage(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A stage of the pipeline file: the graph's node."""

    input: Name | None = None
    outputs: list[Name] = msgspec.field(default_factory=list)
    sink: Name | None = None  # the sink topic
    events: NonNegative | None = None  # a source's
    instances: Annotated[int, Meta(ge=1)] = 1
    external: bool = False


class PipelineShard(Struct, forbid_unknown_fields=True, frozen=True):
    """Who holds a shard's lease, and its epoch (docs/semantics/pipeline.md §11.2)."""

    owner: Name
    epoch: Annotated[int, Meta(ge=1)]


class PipelinePlacement(Struct, forbid_unknown_fields=True, frozen=True):
    """One placement of an edge, from its handoff record: the last ones an edge had,
    oldest first, so a move shows when it happened and where to."""

    edge: Name  # as placed
    generation: Annotated[int, Meta(ge=1)]
    server: Name
    placed_ms: NonNegative  # the publishing producer's clock; 0: not recorded


class PipelineReport(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``POST /v0/pipelines``: a pipeline's status as its handoff store says it."""

    pipeline: ReporterName
    run: ReporterName | None  # the handoff store's id (docs/semantics/pipeline.md §8)
    stages: dict[str, StageReport | None]  # by state key: a stage, or <stage>.<k>
    edges: dict[str, PipelineEdge]  # by the name as placed
    shards: dict[str, PipelineShard | None]  # <stage>.<k> of each sharded stage
    topology: dict[str, PipelineStage]  # by stage name, as the file declares them
    placements: list[PipelinePlacement] = msgspec.field(default_factory=list)
    interval_ms: IntervalMs = 5000


# How many reports' lags the server keeps per pipeline run: 6 minutes at the default
# report_every_s of 2 (docs/console.md, "Pipelines").
LAG_HISTORY = 180


class LagSample(Struct, frozen=True):
    """Each edge's lag (by the name as placed; None: its server was silent) as one
    report gave it, and when the server received that report."""

    reported_ms: int
    lags: dict[str, int | None]


class PipelineStatus(Struct, frozen=True):
    """A pipeline run's newest report, as the server keeps it, and the edges' lags of
    its last ``LAG_HISTORY`` reports since the server started, oldest first."""

    report: PipelineReport
    reported_ms: int  # when the server received it (the server's clock)
    age_ms: int
    stale: bool  # no report for STALE_INTERVALS intervals: the runners may be gone
    lag_history: list[LagSample] = msgspec.field(default_factory=list)


class PipelineList(Struct, frozen=True):
    """``GET /v0/pipelines``: every pipeline run that reported, by name then run."""

    pipelines: list[PipelineStatus]


# The meta keys of a pack's generation and item count on a pipeline edge, and the
# meta keys of an item as a Spark stage reading the edge gives it as a row
# (docs/semantics/pipeline.md §3.1, docs/semantics/pipeline.md §7.5).
EDGE_GEN = "wm.gen"
EDGE_ITEMS = "wm.n"
EDGE_EVENT = "wm.event"
EDGE_BORN = "wm.t0"


class EdgeMeta(Struct, frozen=True, gc=False):
    """A pack's meta on an edge, as its consumer takes it: the generation as an int
    (the meta holds its decimal text: :class:`EdgePage` is decoded leniently). A
    missing key reads as generation 0: such a record is stale
    (docs/semantics/pipeline.md §1.3). ``items``: how many items the pack holds, so
    that what is counted in items (lag, stale drops, a Spark stage's admission) needs
    no look into its data; 0 when a pack written before the key existed has none."""

    generation: int = msgspec.field(default=0, name=EDGE_GEN)
    items: int = msgspec.field(default=0, name=EDGE_ITEMS)


class EdgePack(Struct, kw_only=True, gc=False):
    """The data of a record on an edge: a pack of items, each an event id (its JSON
    string), a birth time and a JSON value, in push order
    (docs/semantics/pipeline.md §3.1)."""

    events: list[msgspec.Raw]
    born_ms: list[int]
    items: list[msgspec.Raw]


class EdgeRecord(Struct, kw_only=True, gc=False):
    """A stored record of an edge's topic: what a consumer needs of a ``Record``."""

    seq: int = msgspec.field(name="$seq")
    meta: EdgeMeta = EdgeMeta()
    data: msgspec.Raw

    def count(self) -> int:
        """The items of the pack: its meta's count, else its data's (a pack written
        before the count was in its meta); 1 for a record that is not a pack, as it
        is taken for one record (docs/semantics/pipeline.md §3.1)."""
        if self.meta.items:
            return self.meta.items
        try:
            return len(_decode_pack(self.data).events) or 1
        except msgspec.DecodeError:
            return 1


_decode_pack = msgspec.json.Decoder(EdgePack).decode


class EdgePage(Struct, kw_only=True, gc=False):
    """A diff page of an edge's topic (``POST /v0/topics/{topic}/diff``, JSON), with
    only the fields a consumer reads: decoded in one call, with no dict per record's
    meta (docs/pipeline.md, "In-flight records")."""

    records: list[EdgeRecord]
    tombstone: Tombstone | None = None
    next_from_seq: int
