"""Where an edge lives now, and the handoff record that tells everyone
(docs/semantics/pipeline.md §2).

The handoff record is one object per edge in a :mod:`waymark.objstore` store
(``file://`` or ``s3://``). A publish is a compare-and-swap on it: create-only
when there is none, If-Match on the version read otherwise, and only for a
generation newer than the one read. Two producers relocating at once both read
generation g; exactly one of their swaps to g + 1 lands, the other is fenced.
"""

from __future__ import annotations

from dataclasses import dataclass

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
from waymark.pipeline.fence import FenceEpoch

from .errors import PipelineError

HISTORY = 20  # earlier placements a handoff record keeps, for status


class PastPlacement(msgspec.Struct, frozen=True, array_like=True):
    """An earlier placement of an edge: its generation, server and when it was made."""

    generation: int
    server: str
    placed_ms: int


class QueueLocator(msgspec.Struct, frozen=True, kw_only=True):
    """One placement of an edge: the server and topic holding it, its generation, the
    topic's capacity in records, and the first seq that belongs to this generation
    (the topic's head when it was allocated; docs/semantics/pipeline.md §2.1)."""

    edge: str
    server: str
    topic: str
    generation: int
    capacity: int = 0
    start_seq: int = 0
    # When the producer that published it planned it (its clock; 0 in records from
    # before this field), and the placements before it, oldest first: what the status
    # shows as the edge's moves (docs/pipeline.md, "Running it").
    placed_ms: int = 0
    history: tuple[PastPlacement, ...] = ()

    @property
    def epoch(self) -> FenceEpoch:
        return FenceEpoch(self.generation)

    def past(self) -> tuple[PastPlacement, ...]:
        """This placement's history with itself appended, for the next one's."""
        mine = PastPlacement(self.generation, self.server, self.placed_ms)
        return (*self.history, mine)[-HISTORY:]


class Fenced(PipelineError):
    """A publish lost: the handoff already names ``current`` (same or newer generation)."""

    def __init__(self, attempted: QueueLocator, current: QueueLocator) -> None:
        super().__init__(
            f"edge {attempted.edge!r}: generation {attempted.generation} is fenced by "
            f"generation {current.generation} on {current.server}"
        )
        self.attempted = attempted
        self.current = current


class HandoffRolledBack(PipelineError):
    """The handoff record names an older generation than one already seen, or is gone
    (the store was restored or tampered with; docs/semantics/pipeline.md §2.3): a
    consumer that waited for a newer one would stall silently, so it stops instead."""

    def __init__(self, edge: str, current: QueueLocator | None, seen: int) -> None:
        found = f"generation {current.generation}" if current else "no handoff record"
        super().__init__(
            f"edge {edge!r}: the handoff store holds {found}, but generation {seen} was "
            "published: it was rolled back (docs/semantics/pipeline.md §2.3)"
        )


@dataclass(frozen=True, slots=True)
class Observed:
    """The handoff record as read: its locator (None when there is none) and the
    store version a conditional write compares against."""

    locator: QueueLocator | None
    version: ObjectVersion | None


_decoder = msgspec.json.Decoder(QueueLocator)


def put_mode(observed: Observed) -> PutMode:
    """The conditional write that lands only on the record as ``observed``: create-only
    when there was none, else If-Match its version (docs/semantics/pipeline.md §2.2)."""
    return CREATE if observed.version is None else IfMatch(observed.version)


def handoff_key(edge: str) -> str:
    return f"edges/{edge}/handoff.json"


def observe(store: ObjectStore, edge: str) -> Observed:
    """Read the handoff record of ``edge``."""
    try:
        got = store.get(handoff_key(edge))
    except ObjectNotFound:
        return Observed(None, None)
    return Observed(_decoder.decode(got.data), got.meta.object_version)


class HandoffWriter:
    """Publishes an edge's new locator (docs/semantics/pipeline.md §2.2)."""

    def __init__(self, store: ObjectStore, edge: str) -> None:
        self.store = store
        self.edge = edge

    def observe(self) -> Observed:
        return observe(self.store, self.edge)

    def try_publish(self, observed: Observed, locator: QueueLocator) -> QueueLocator | None:
        """One compare-and-swap against what was ``observed``: ``locator`` once it is
        the handoff record; None when the record changed since (read again).

        Raises :class:`Fenced` when ``observed`` already holds this generation or a
        newer one.
        """
        if locator.edge != self.edge:
            raise ValueError(f"locator of edge {locator.edge!r} published on {self.edge!r}")
        current = observed.locator
        if current is not None and current.generation >= locator.generation:
            raise Fenced(locator, current)
        try:
            self.store.put(
                handoff_key(self.edge), msgspec.json.encode(locator), mode=put_mode(observed)
            )
        except (ObjectExists, PreconditionFailed):
            return None
        return locator

    def publish(self, locator: QueueLocator) -> QueueLocator:
        """Make ``locator`` the handoff record, or raise :class:`Fenced` when a
        generation as new or newer is (or becomes) published first."""
        while True:
            published = self.try_publish(self.observe(), locator)
            if published is not None:
                return published


class HandoffReader:
    """Follows an edge's handoff record (docs/semantics/pipeline.md §2.3)."""

    def __init__(self, store: ObjectStore, edge: str, *, seen: int = 0) -> None:
        self.store = store
        self.edge = edge
        self.seen = FenceEpoch(seen)

    def current(self) -> QueueLocator | None:
        """The published locator, whatever its generation."""
        return observe(self.store, self.edge).locator

    def poll(self) -> QueueLocator | None:
        """A locator newer than any this reader returned before, or None."""
        locator = self.current()
        if locator is None or not self.seen.is_stale(locator.epoch):
            return None
        self.seen = locator.epoch
        return locator
