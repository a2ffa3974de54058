"""What the engine's parts may use of it: the narrow interface queues, routers and the
exactly-once writers are built over (docs/architecture.md, "The engine kernel").

:class:`~waymark.log.engine.Engine` is the composition root: it makes its parts and
passes itself to each as a :class:`TopicLog`, so no part imports the engine nor calls
its façade back beyond these methods. The topic table and the journal are the
kernel's; a topic's own invariants are :class:`~waymark.log.topic.Topic`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..clock import Clock, IdSource
    from ..protocol import (
        ConfigPatch,
        DeleteResponse,
        Limits,
        RecordIn,
        TopicConfig,
        TopicState,
        TopicType,
    )
    from .deletion import TagMatch
    from .journal import BodyRun, Commit, Journal
    from .kernel import Kernel
    from .origin import Origin, Published, StagedChunks
    from .prebuilt import Layout, Prebuilt
    from .records import Records
    from .results import AppendResult, DeleteResult, DiffResult
    from .topic import Hole


class TopicLog(Protocol):
    """Topics as the engine's parts see them: read, append, delete, and the kernel."""

    clock: Clock
    ids: IdSource  # lease ids
    limits: Limits
    defaults: TopicConfig  # what a topic an append creates is configured with
    kernel: Kernel

    @property
    def journal(self) -> Journal | None: ...

    def put_topic(
        self, name: str, patch: ConfigPatch, topic_type: TopicType | None = None
    ) -> tuple[TopicState, bool]: ...

    def append(
        self,
        name: str,
        records: Sequence[RecordIn],
        *,
        create: bool | None = None,
        config: ConfigPatch | None = None,
    ) -> AppendResult: ...

    def append_encoded(
        self,
        name: str,
        encoded: Records,
        *,
        create: bool | None = None,
        config: ConfigPatch | None = None,
        origin: Origin | None = None,
        prebuilt: Prebuilt | None = None,
        staged: StagedChunks | None = None,
    ) -> AppendResult: ...

    def lay_out(
        self,
        name: str,
        encoded: Records,
        *,
        create: bool | None = None,
        config: ConfigPatch | None = None,
        publish: Published | None = None,
        runs: list[BodyRun] | None = None,
        staged: StagedChunks | None = None,
    ) -> Layout: ...

    def skip_derived(self, name: str, n: int, reason: str) -> Hole: ...

    def diff(
        self,
        name: str,
        from_seq: int,
        *,
        limit: int = 1000,
        nodes: frozenset[str] | None = None,
        epoch: int | None = None,
        per_record: bool = False,
        touch: bool = True,
        columns: bool = False,
    ) -> DiffResult: ...

    def delete(
        self, name: str, *, before_seq: int | None = None, match: TagMatch | None = None
    ) -> DeleteResult: ...

    def delete_seqs(self, name: str, seqs: list[int]) -> DeleteResponse: ...

    def commit_point(self, name: str) -> Commit | None: ...
