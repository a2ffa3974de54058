"""Where an edge is placed, and moving it: the part of a relocatable edge that both
its sides and a Spark stage share (docs/semantics/pipeline.md §3.2).

:class:`EdgePlacement` allocates the edge's topic on a candidate server, publishes
the placement one generation up with a compare-and-swap on the handoff record (or
adopts a newer one published meanwhile), and moves the edge past records gone from
its topic. It holds no records and keeps no backoff, so a Spark stage's read moves an
edge as a pipeline consumer does without loading the producer's machinery (the
shipper's backoff, docs/architecture.md); :mod:`waymark.pipeline.edge` builds the
producer and the consumer on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from waymark.client import (
    ApiError,
    Client,
    ConfigPatch,
    Discard,
    Tombstone,
    TopicState,
    TransportError,
)
from waymark.clock import Clock, SystemClock
from waymark.objstore import ObjectStore
from waymark.pipeline.fence import FenceEpoch
from waymark.pipeline.identity import PipelineIdentity, identity_of
from waymark.pipeline.locator import (
    Fenced,
    HandoffReader,
    HandoffWriter,
    Observed,
    QueueLocator,
)
from waymark.protocol import EdgePage, EdgeRecord

from .errors import PipelineError

Connect = Callable[[str], Client]
log = logging.getLogger("waymark.pipeline.edge")


class EdgeUnavailable(PipelineError):
    """The edge could not be reached nor moved within the retry budget."""


class EdgeOwned(PipelineError):
    """A server holds the edge's topic for another pipeline: never retried, the
    pipeline stops (docs/semantics/pipeline.md §8.2)."""


@dataclass(frozen=True, slots=True)
class Relocation:
    """A planned move: the handoff as read, and the placement to publish over it."""

    observed: Observed
    locator: QueueLocator


@dataclass(slots=True)
class EdgeStats:
    relocations: int = 0  # placements this side published
    rebinds: int = 0  # newer placements this side adopted (its own included)
    fenced: int = 0  # publishes lost to a concurrent producer
    replayed: int = 0  # items pushed again after a move
    stale_dropped: int = 0  # items of the older generations' packs a consumer dropped
    disconnects: int = 0
    recover_s: list[float] = field(default_factory=list)  # disconnect -> next success


def client_factory(timeout_s: float = 5.0, connect_s: float = 1.0) -> Connect:
    """Clients by server URL, made once each."""
    clients: dict[str, Client] = {}

    def connect(url: str) -> Client:
        if url not in clients:
            clients[url] = Client(url, timeout=timeout_s, connect_timeout=connect_s)
        return clients[url]

    return connect


def gone(error: Exception) -> bool:
    """Whether an error means the placement is unusable (docs/semantics/pipeline.md §3.3):
    the server is unreachable, or the topic is not there."""
    if isinstance(error, TransportError):
        return True
    return isinstance(error, ApiError) and (error.status >= 500 or error.status == 404)


def packs_after(client: Client, topic: str, after: int, head: int, *, page: int,
                most: int | None = None) -> Iterator[EdgeRecord]:  # fmt: skip
    """The records of an edge's ``topic`` after seq ``after`` up to ``head``, in order,
    read ``page`` at a time (doubling up to ``most`` where given: a pack may be 256
    KiB, so a reader that may stop early starts small). What a tombstone names is gone
    and not the consumer's to read (docs/semantics/pipeline.md §3.1)."""
    at = after
    while at < head:
        read = client.diff_as(topic, at, EdgePage, limit=min(page, head - at))
        yield from (r for r in read.records if r.seq <= head)
        if read.next_from_seq <= at:
            return
        at = read.next_from_seq
        if most is not None:
            page = min(2 * page, most)


class EdgePlacement:
    """One edge's placement as one side sees it: the generation it is bound to, and
    how it moves the edge. ``candidates`` are the server URLs the edge may live on, in
    preference order; ``handoff`` is the rendezvous store; ``identity`` is the
    pipeline's (default: the one kept in ``handoff``), which scopes the edge's topic."""

    def __init__(
        self,
        name: str,
        candidates: Sequence[str],
        handoff: ObjectStore,
        *,
        capacity: int = 1_000_000,
        connect: Connect | None = None,
        clock: Clock | None = None,
        identity: PipelineIdentity | None = None,
    ) -> None:
        if not candidates:
            raise ValueError(f"edge {name!r} has no candidate servers")
        self.name = name
        self.identity = identity or identity_of(handoff)
        self.topic = self.identity.edge_topic(name)
        self.candidates = list(candidates)
        self.capacity = capacity
        self.connect = connect or client_factory()
        self.clock = clock or SystemClock()
        self.writer = HandoffWriter(handoff, name)
        self.reader = HandoffReader(handoff, name)
        self.locator: QueueLocator | None = None
        self.stats = EdgeStats()

    def generation(self) -> FenceEpoch:
        """The generation this side is bound to (0 before it is bound)."""
        return FenceEpoch(self.locator.generation if self.locator else 0)

    def bind(self, locator: QueueLocator) -> None:
        """Take ``locator`` as the edge's placement."""
        self.locator = locator
        self.reader.seen = max(self.reader.seen, locator.epoch)
        self.stats.rebinds += 1

    def _allocate(self, url: str) -> TopicState:
        """The edge's topic on ``url``, created with the edge's capacity if missing and
        claimed for this pipeline; raises :class:`EdgeOwned` when the server holds it
        for another (docs/semantics/pipeline.md §8.2)."""
        try:
            state, _ = self.connect(url).put_topic(
                self.topic,
                ConfigPatch(cap_records=self.capacity, discard=Discard.REJECT,
                            idempotency_window_ms=24 * 3_600_000, owner=self.identity.scope),
            )  # fmt: skip
        except ApiError as error:
            if error.detail.get("reason") == "topic_owned":
                raise EdgeOwned(f"edge {self.name!r} on {url}: {error.message}") from error
            raise
        return state

    def prepare_relocation(self, observed: Observed | None = None) -> Relocation:
        """Allocate the edge on the next healthy candidate after the current server
        and plan its publication one generation above the newest known
        (docs/semantics/pipeline.md §3.2)."""
        observed = observed or self.writer.observe()
        known = max(self.generation().value, observed.locator.generation if observed.locator else 0)
        current = self.locator.server if self.locator else None
        start = self.candidates.index(current) + 1 if current in self.candidates else 0
        order = self.candidates[start:] + self.candidates[:start]
        if current in order and len(order) > 1:  # the current server last: it just failed
            order.remove(current)
            order.append(current)
        for url in order:
            try:
                state = self._allocate(url)
            except (TransportError, ApiError):
                continue  # dead or refusing: the next candidate
            locator = QueueLocator(
                edge=self.name, server=url, topic=self.topic, generation=known + 1,
                capacity=self.capacity, start_seq=state.assigned_head_seq,
                placed_ms=self.clock.now_ms(),
                history=observed.locator.past() if observed.locator else (),
            )  # fmt: skip
            return Relocation(observed, locator)
        raise EdgeUnavailable(f"edge {self.name!r}: no healthy candidate among {order}")

    def commit_relocation(self, plan: Relocation) -> bool:
        """Publish a planned placement. True when it won; False when another producer
        published first, in which case this side adopts the newer placement
        (docs/semantics/pipeline.md §2.2)."""
        observed = plan.observed
        while True:
            try:
                won = self.writer.try_publish(observed, plan.locator)
            except Fenced as fenced:
                self.stats.fenced += 1
                if FenceEpoch(fenced.current.generation) > self.generation():
                    self.bind(fenced.current)
                return False
            if won is not None:
                if plan.observed.locator is not None:  # a move, not the first placement
                    self.stats.relocations += 1
                self.bind(won)
                return True
            observed = self.writer.observe()

    def relocate(self) -> QueueLocator:
        """Move the edge to the next healthy candidate, publish it, bump the generation
        (or adopt a concurrent producer's newer placement); returns the bound placement."""
        self.commit_relocation(self.prepare_relocation())
        assert self.locator is not None
        return self.locator

    def move(self) -> None:
        """After a failure: adopt a newer published placement, else relocate."""
        observed = self.writer.observe()
        newer = observed.locator
        if newer is not None and newer.epoch > self.generation():
            self.bind(newer)
            return
        self.commit_relocation(self.prepare_relocation(observed))

    def lost(self, gone: Tombstone) -> None:
        """Records of the bound placement are gone from its topic (a crash took a tail
        its server had acknowledged before syncing it). Whoever reads the edge never
        read them, so never acknowledged them, and their producers still hold them;
        but a producer writes them again only into a newer generation, and it cannot
        know they are gone. So the reader moves the edge itself (or adopts a newer
        placement published meanwhile) (docs/semantics/pipeline.md §3.5, §7.4)."""
        locator = self.locator
        log.warning(
            "edge %r: records [%s, %s] are gone from %s (%s); moving the edge so that "
            "they are written again", self.name, gone.gap_from, gone.gap_to,
            locator.server if locator else "?", gone.reason,
        )  # fmt: skip
        self.move()
