"""waymark.pipeline: stages joined by relocatable edges (docs/pipeline.md).

An edge is a waymark topic on one of several servers. When the server under it
dies, the producing stage moves the edge to another server, publishes a handoff
record (a conditional write in a :mod:`waymark.objstore` store) and bumps the
edge's generation; the consuming stage follows the handoff and resumes from its
checkpoint; the sink writes each event under its stable id, so the replays a
move causes are absorbed. The semantics are docs/semantics/pipeline.md.
"""

from waymark.pipeline.batch import InFlight
from waymark.pipeline.edge import (
    EdgeStats,
    EdgeUnavailable,
    RelocatableQueueEdge,
    Relocation,
    client_factory,
)
from waymark.pipeline.fence import FenceEpoch
from waymark.pipeline.locator import (
    Fenced,
    HandoffReader,
    HandoffRolledBack,
    HandoffWriter,
    Observed,
    QueueLocator,
)
from waymark.pipeline.stage import Sink, SinkUnavailable, Stage, output_event
from waymark.pipeline.state import (
    CheckpointedStageState,
    Position,
    StageFenced,
    StageStateStore,
)

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
