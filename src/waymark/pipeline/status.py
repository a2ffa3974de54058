"""A pipeline's status, read from its handoff store and its edges' servers: what
``waymark pipeline status`` shows, ``--json`` prints and a runner with ``report_to``
sends the server for the console (docs/pipeline.md, "Running it"). The wire shape is
:class:`waymark.protocol.pipelines.PipelineReport`."""

from __future__ import annotations

from dataclasses import dataclass

from waymark.client import ApiError, Client, TransportError
from waymark.objstore import ObjectStore
from waymark.pipeline.identity import load_identity
from waymark.pipeline.locator import HandoffReader, QueueLocator
from waymark.pipeline.placement import packs_after
from waymark.pipeline.report import load_report
from waymark.pipeline.shard import part_name, read_lease
from waymark.pipeline.spec import PipelineSpec
from waymark.pipeline.state import StageStateStore
from waymark.protocol.pipelines import (
    PipelineEdge,
    PipelinePlacement,
    PipelineReport,
    PipelineShard,
    PipelineStage,
)


@dataclass(frozen=True)
class EdgeStatus:
    edge: str  # as placed: the edge, or <edge>.<k> for the part of shard k
    locator: QueueLocator | None
    consumer: str = ""  # the state key of the stage (or shard) reading it
    logical: str = ""  # the edge the pipeline file declares


def edge_statuses(spec: PipelineSpec, store: ObjectStore) -> list[EdgeStatus]:
    return [EdgeStatus(p.name, HandoffReader(store, p.name).current(), p.consumer, p.edge)
            for p in spec.all_parts()]  # fmt: skip


@dataclass(frozen=True)
class EdgeLag:
    """What an edge's consumer has not acknowledged on its current placement: ``items``
    (events, as Kafka's consumer lag counts records) in the ``packs`` (edge records)
    of this generation past its checkpoint (docs/pipeline.md, "Running it")."""

    items: int
    packs: int


LAG_PAGE = 200  # packs a page of the lag's read: a few MB at most (256 KiB a pack)


def edge_lag(spec: PipelineSpec, store: ObjectStore, status: EdgeStatus) -> EdgeLag | None:
    """The lag of the edge's current placement past its consumer's checkpointed input
    position (or past the placement's start when that is of another generation): the
    packs there are read to count their items, as the meta of each gives them; None
    when the edge is not placed or its server does not answer within a second."""
    loc = status.locator
    if loc is None:
        return None
    state = StageStateStore(store).load(status.consumer or spec.consumers[status.edge])
    acked = state.input if state is not None else None
    done = acked.seq if acked is not None and acked.generation == loc.generation else loc.start_seq
    items = packs = 0
    try:
        with Client(loc.server, timeout=1.0, connect_timeout=1.0) as client:
            head = client.get_topic(loc.topic, touch=False).head_seq
            for r in packs_after(client, loc.topic, done, head, page=LAG_PAGE):
                if r.meta.generation == loc.generation:
                    items += r.count()
                    packs += 1
    except (TransportError, ApiError):
        return None
    return EdgeLag(items, packs)


def shard_holders(spec: PipelineSpec, store: ObjectStore) -> dict[str, PipelineShard | None]:
    """Per shard of each sharded stage (``<stage>.<k>``): the instance holding its lease
    and the lease's epoch; None when nobody took it yet."""
    held: dict[str, PipelineShard | None] = {}
    for stage in spec.stages.values():
        for k in range(stage.instances if stage.sharded else 0):
            lease, _ = read_lease(store, stage.name, k)
            held[part_name(stage.name, k)] = (
                PipelineShard(lease.owner, lease.epoch) if lease is not None else None
            )
    return held


def pipeline_status(spec: PipelineSpec, store: ObjectStore, *,
                    interval_ms: int = 5000) -> PipelineReport:  # fmt: skip
    """The pipeline as its handoff store says it now (raises ``ObjectStoreError`` while
    the store does not answer)."""
    identity = load_identity(store)
    edges: dict[str, PipelineEdge] = {}
    placements: list[PipelinePlacement] = []
    for s in edge_statuses(spec, store):
        loc = s.locator
        lag = edge_lag(spec, store, s)
        edges[s.edge] = PipelineEdge(
            edge=s.logical, generation=loc.generation if loc else 0,
            server=loc.server if loc else None, topic=loc.topic if loc else None,
            consumer=s.consumer, lag=lag.items if lag else None,
            lag_packs=lag.packs if lag else None,
        )  # fmt: skip
        if loc is not None:
            placements += [PipelinePlacement(s.edge, p.generation, p.server, p.placed_ms)
                           for p in loc.past()]  # fmt: skip
    topology = {
        s.name: PipelineStage(
            input=s.input,
            outputs=list(s.outputs),
            sink=s.sink.topic if s.sink else None,
            events=s.events,
            instances=s.instances,
            external=s.external,
        )
        for s in spec.stages.values()
    }
    return PipelineReport(
        pipeline=spec.name, run=identity.run if identity is not None else None,
        stages={key: load_report(store, key) for s in spec.stages.values()
                for key in s.state_keys()},
        edges=edges, shards=shard_holders(spec, store), topology=topology,
        placements=sorted(placements, key=lambda p: (p.placed_ms, p.edge, p.generation)),
        interval_ms=interval_ms,
    )  # fmt: skip
