"""The topic log engine: synchronous, in-process, no I/O.

The engine owns every topic and applies every mutation at one commit point
(:meth:`Engine._commit`), which is where the durable-storage journal plugs in.
Callers that need to wake on new data register a listener with
:meth:`Engine.add_listener`; it is called synchronously after each commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..clock import Clock, SystemClock  # noqa: F401  (used once implemented)
from .config import ConfigPatch, TopicConfig, TopicType
from .deletion import TagMatch
from .records import Limits, RecordIn
from .results import AppendResult, DeleteResult, DiffResult, TopicState

Listener = Callable[[str], None]


class Engine:
    def __init__(
        self,
        clock: Clock | None = None,
        defaults: TopicConfig | None = None,
        limits: Limits | None = None,
    ) -> None:
        raise NotImplementedError

    # --- topics -----------------------------------------------------------------
    def list_topics(self) -> list[TopicState]:
        """Every topic's state, sorted by name."""
        raise NotImplementedError

    def put_topic(
        self, name: str, patch: ConfigPatch, type: TopicType | None = None
    ) -> tuple[TopicState, bool]:
        """Create or update a topic; returns (state, created). The type is immutable:
        a different type for an existing topic is 409 topic_exists_incompatible."""
        raise NotImplementedError

    def get_topic(self, name: str, *, touch: bool = True) -> TopicState:
        """State of a topic (404 topic_not_found); ``touch`` counts as consumption (§3)."""
        raise NotImplementedError

    def delete_topic(self, name: str) -> None:
        """Tear a topic down: records, tag index, dedupe state (404 if missing)."""
        raise NotImplementedError

    # --- records ----------------------------------------------------------------
    def append(
        self,
        name: str,
        records: Sequence[RecordIn],
        *,
        create: bool | None = None,
        config: ConfigPatch | None = None,
    ) -> AppendResult:
        """Append atomically: all records get contiguous seqs, or none is stored.

        ``create`` None follows the topic defaults' ``auto_create``; ``config`` is
        applied only when this write creates the topic.
        """
        raise NotImplementedError

    def diff(
        self,
        name: str,
        from_seq: int,
        *,
        limit: int = 1000,
        nodes: frozenset[str] | None = None,
        epoch: int | None = None,
        per_record: bool = False,
    ) -> DiffResult:
        """Records with seq > from_seq, in seq order, at most ``limit`` scanned.

        ``nodes`` drops records whose $node is in the set (§6); ``epoch`` names the
        topic instance the cursor belongs to, so a recreated topic is detected (§5.5).
        """
        raise NotImplementedError

    def delete(
        self, name: str, *, before_seq: int | None = None, match: TagMatch | None = None
    ) -> DeleteResult:
        """Permanent, point-in-time deletion (§7)."""
        raise NotImplementedError

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(topic)`` after every commit that changes ``topic``."""
        raise NotImplementedError
