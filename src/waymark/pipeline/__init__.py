"""waymark.pipeline: stages joined by relocatable edges (docs/pipeline.md).

An edge is a waymark topic on one of several servers. When the server under it
dies, the producing stage moves the edge to another server, publishes a handoff
record (a conditional write in a :mod:`waymark.objstore` store) and bumps the
edge's generation; the consuming stage follows the handoff and resumes from its
checkpoint; the sink writes each event under its stable id, so the replays a
move causes are absorbed. The semantics are docs/semantics/pipeline.md.

The names below are imported when first asked for: a Spark stage imports only the
locator and the state of a pipeline, and must not load the edge and the stage
on Spark's workers (docs/architecture.md, "Enforcing the layers").
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from waymark.pipeline.batch import InFlight
    from waymark.pipeline.edge import RelocatableQueueEdge
    from waymark.pipeline.fence import FenceEpoch
    from waymark.pipeline.locator import (
        Fenced,
        HandoffReader,
        HandoffRolledBack,
        HandoffWriter,
        Observed,
        QueueLocator,
    )
    from waymark.pipeline.placement import (
        EdgeStats,
        EdgeUnavailable,
        Relocation,
        client_factory,
    )
    from waymark.pipeline.stage import Sink, SinkUnavailable, Stage, output_event
    from waymark.pipeline.state import (
        CheckpointedStageState,
        Position,
        StageFenced,
        StageStateStore,
    )

_HOME = {
    "InFlight": "batch",
    "EdgeStats": "placement",
    "EdgeUnavailable": "placement",
    "RelocatableQueueEdge": "edge",
    "Relocation": "placement",
    "client_factory": "placement",
    "FenceEpoch": "fence",
    "Fenced": "locator",
    "HandoffReader": "locator",
    "HandoffRolledBack": "locator",
    "HandoffWriter": "locator",
    "Observed": "locator",
    "QueueLocator": "locator",
    "Sink": "stage",
    "SinkUnavailable": "stage",
    "Stage": "stage",
    "output_event": "stage",
    "CheckpointedStageState": "state",
    "Position": "state",
    "StageFenced": "state",
    "StageStateStore": "state",
}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'waymark.pipeline' has no attribute {name!r}")
    return getattr(import_module(f"waymark.pipeline.{home}"), name)


__all__ = [
    "CheckpointedStageState",
    "EdgeStats",
    "EdgeUnavailable",
    "FenceEpoch",
    "Fenced",
    "HandoffReader",
    "HandoffRolledBack",
    "HandoffWriter",
    "InFlight",
    "Observed",
    "Position",
    "QueueLocator",
    "RelocatableQueueEdge",
    "Relocation",
    "Sink",
    "SinkUnavailable",
    "Stage",
    "StageFenced",
    "StageStateStore",
    "client_factory",
    "output_event",
]
