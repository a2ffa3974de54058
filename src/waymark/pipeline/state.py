"""Per-stage durable progress: the input offset and the output commit marker
(docs/semantics/pipeline.md §4)."""

from __future__ import annotations

import msgspec

from waymark.objstore import ObjectNotFound, ObjectStore


class Position(msgspec.Struct, frozen=True, order=True, array_like=True):
    """A place on an edge: generation first, then the seq in that generation's topic.
    Positions order by generation, then seq (docs/semantics/pipeline.md §4.1)."""

    generation: int
    seq: int


class CheckpointedStageState(msgspec.Struct, kw_only=True):
    """What a stage has durably done.

    ``input`` is the position on the input edge up to which every record's outputs
    are acknowledged downstream (a restart reads after it); ``source_offset`` plays
    that part for a stage without an input edge (the next event to produce);
    ``output`` is the commit marker: the last position of the output edge the
    downstream stage acknowledged.
    """

    stage: str
    input_edge: str | None = None
    input: Position | None = None
    source_offset: int = 0
    output_edge: str | None = None
    output: Position | None = None


def state_key(stage: str) -> str:
    return f"stages/{stage}/state.json"


_decoder = msgspec.json.Decoder(CheckpointedStageState)


class StageStateStore:
    """Stage states in the rendezvous store. Each put replaces the object atomically,
    so a crash leaves the previous state or the new one, never a torn one
    (docs/semantics/pipeline.md §4.2)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def load(self, stage: str) -> CheckpointedStageState | None:
        try:
            return _decoder.decode(self.store.get(state_key(stage)).data)
        except ObjectNotFound:
            return None

    def save(self, state: CheckpointedStageState) -> None:
        self.store.put(state_key(state.stage), msgspec.json.encode(state))
