"""Per-stage durable progress: the input offset and the output commit marker
(docs/semantics/pipeline.md §4), saved under a fence: only the stage instance that
claimed the state last may save it (docs/semantics/pipeline.md §4.4)."""

from __future__ import annotations

import msgspec

from waymark.objstore import (
    CREATE,
    IfMatch,
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
    ObjectVersion,
    PreconditionFailed,
    PutMode,
)

from .errors import PipelineError


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
    # The fence (docs/semantics/pipeline.md §4.4): each start of the stage claims the
    # next incarnation; ``owner`` names the instance holding it.
    incarnation: int = 0
    owner: str = ""


class StageFenced(PipelineError):
    """A stage instance tried to save a state a newer instance has claimed."""

    def __init__(self, mine: CheckpointedStageState, current: CheckpointedStageState) -> None:
        super().__init__(
            f"stage {mine.stage!r}: instance {mine.owner!r} (incarnation {mine.incarnation}) "
            f"is superseded by {current.owner!r} (incarnation {current.incarnation})"
        )
        self.current = current


def state_key(stage: str) -> str:
    return f"stages/{stage}/state.json"


_decoder = msgspec.json.Decoder(CheckpointedStageState)


def put_mode(version: ObjectVersion | None) -> PutMode:
    """The conditional write that lands only on the state as last read or written."""
    return CREATE if version is None else IfMatch(version)


class StageStateStore:
    """Stage states in the rendezvous store. Each put replaces the object atomically,
    so a crash leaves the previous state or the new one, never a torn one
    (docs/semantics/pipeline.md §4.2); each is a compare-and-swap on the version this
    instance last saw, so a superseded instance cannot overwrite its successor
    (docs/semantics/pipeline.md §4.4)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._versions: dict[str, ObjectVersion] = {}

    def _read(self, stage: str) -> tuple[CheckpointedStageState | None, ObjectVersion | None]:
        try:
            got = self.store.get(state_key(stage))
        except ObjectNotFound:
            return None, None
        return _decoder.decode(got.data), got.meta.object_version

    def load(self, stage: str) -> CheckpointedStageState | None:
        return self._read(stage)[0]

    def claim(self, state: CheckpointedStageState, owner: str) -> CheckpointedStageState:
        """Make ``owner`` the stage's instance: the stored state (``state`` when there is
        none) under the next incarnation. Every earlier instance is fenced from then on."""
        while True:
            stored, version = self._read(state.stage)
            base = stored if stored is not None else state
            claimed = msgspec.structs.replace(base, incarnation=base.incarnation + 1, owner=owner)
            try:
                self._versions[state.stage] = self.store.put(
                    state_key(state.stage), msgspec.json.encode(claimed), mode=put_mode(version)
                )
            except (ObjectExists, PreconditionFailed):
                continue  # another instance claimed meanwhile: claim above it
            return claimed

    def save(self, state: CheckpointedStageState) -> None:
        """Save the state of the instance that claimed it (:meth:`claim`); raises
        :class:`StageFenced` when a newer instance claimed it since."""
        while True:
            version = self._versions.get(state.stage)
            try:
                self._versions[state.stage] = self.store.put(
                    state_key(state.stage), msgspec.json.encode(state), mode=put_mode(version)
                )
                return
            except (ObjectExists, PreconditionFailed):
                current, seen = self._read(state.stage)
                if current is None or seen is None:
                    raise
                if (current.incarnation, current.owner) != (state.incarnation, state.owner):
                    raise StageFenced(state, current) from None
                self._versions[state.stage] = seen  # our own write, under another version
