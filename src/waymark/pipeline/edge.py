"""A relocatable queue edge: a waymark topic on one of several servers that moves
when its server dies (docs/semantics/pipeline.md §3).

The producing side pushes records and keeps them, column by column in a
:class:`~waymark.pipeline.window.Window` of the pushes' ``InFlight`` records, until the
consuming stage's checkpoint acknowledges them; when the server under the edge is gone, or a newer
generation is published, it moves (relocates or adopts the newer placement) and
pushes everything unacknowledged again. The consuming side reads the topic of
the generation it is bound to, drops records of older generations, and rebinds
when the handoff record names a newer one; when it finds records gone from the topic
(a tombstone), it moves the edge itself so that its producers write them again.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence

import msgspec
import numpy as np

from waymark.client import ApiError, ErrorCode, Tombstone, TransportError
from waymark.clock import Backoff, Clock
from waymark.objstore import ObjectStore
from waymark.pipeline.batch import InFlight
from waymark.pipeline.fence import FenceEpoch
from waymark.pipeline.identity import PipelineIdentity
from waymark.pipeline.locator import HandoffRolledBack, QueueLocator
from waymark.pipeline.placement import (  # the placement's names, as this module gave them
    Connect,
    EdgeOwned,
    EdgePlacement,
    EdgeStats,
    EdgeUnavailable,
    Relocation,
    client_factory,
    gone,
)
from waymark.pipeline.state import Position, StageStateStore
from waymark.pipeline.window import Window
from waymark.protocol import EdgePack, EdgePage, EdgeRecord

from .errors import EdgeMalformed

Sleep = Callable[[float], None]

__all__ = [
    "Connect",
    "EdgeOwned",
    "EdgeStats",
    "EdgeUnavailable",
    "RelocatableQueueEdge",
    "Relocation",
    "Sleep",
    "client_factory",
]


class RelocatableQueueEdge(EdgePlacement):
    """One edge, from the side of one stage: the producer's (:meth:`push`) or the
    consumer's (:meth:`pop`).

    ``candidates``, ``handoff`` and ``identity`` are the placement's
    (:class:`~waymark.pipeline.placement.EdgePlacement`); ``consumer`` names the stage
    that reads the edge, whose checkpoint acknowledges what a producer may forget.
    """

    def __init__(
        self,
        name: str,
        candidates: Sequence[str],
        handoff: ObjectStore,
        *,
        consumer: str,
        capacity: int = 1_000_000,
        connect: Connect | None = None,
        clock: Clock | None = None,
        sleep: Sleep = time.sleep,
        retries: int = 8,
        backoff: Backoff | None = None,
        poll_interval_ms: int = 200,
        rng: random.Random | None = None,
        identity: PipelineIdentity | None = None,
    ) -> None:
        super().__init__(name, candidates, handoff, capacity=capacity, connect=connect,
                         clock=clock, identity=identity)  # fmt: skip
        self.consumer = consumer
        self.sleep = sleep
        self.retries = retries
        self.backoff = backoff or Backoff(0.05, 1.0)
        self.poll_interval_ms = poll_interval_ms
        self.rng = rng or random.Random()
        self.acks = StageStateStore(handoff)
        self.unacked = Window()  # producer: pushed, not yet acknowledged
        self.cursor: Position | None = None  # consumer: last seq read in the bound generation
        self._down_since_ms: int | None = None
        self._polled_ms: int | None = None
        self._probed_ms: int | None = None
        self._released = 0  # consumer: seqs at or below this are deleted from the topic
        # consumer: items per pack, as last read (one until a pack is read: a first pop
        # may take up to max_items packs, as a pop of single records did)
        self._per_pack = 1.0

    # --- both sides ---------------------------------------------------------------
    def _disconnected(self, since_ms: int) -> None:
        """A call that began at ``since_ms`` failed: the outage counts from then, not
        from when the failure surfaced (a hung server answers nothing until the client's
        timeout; docs/semantics/pipeline.md §3.3)."""
        self.stats.disconnects += 1
        if self._down_since_ms is None:
            self._down_since_ms = since_ms

    def _succeeded(self) -> None:
        if self._down_since_ms is not None:
            self.stats.recover_s.append((self.clock.now_ms() - self._down_since_ms) / 1000)
            self._down_since_ms = None

    # --- producer -----------------------------------------------------------------
    def open(self) -> QueueLocator:
        """Bind to the published placement, placing the edge first if it has none."""
        if self.locator is None:
            current = self.reader.current()
            if current is None:
                self.move()
            else:
                self.bind(current)
        assert self.locator is not None
        return self.locator

    def push(self, records: InFlight) -> None:
        """Write ``records`` to the edge and keep them until acknowledged. A push that
        finds the server gone or the edge moved moves with it and writes every
        unacknowledged record again, with bounded retries and backoff
        (docs/semantics/pipeline.md §3.3)."""
        self.enqueue(records)
        self.send()

    def enqueue(self, records: InFlight) -> None:
        """Hold ``records`` until acknowledged, cut into packs; :meth:`send` writes them.
        The cut is made once, here, so that every write of a pack carries the same items
        (docs/semantics/pipeline.md §3.1)."""
        self.unacked += records.packed()

    def send(self) -> None:
        """Write what is held and not yet written, as :meth:`push` does."""
        self.open()
        self._send()

    def _send(self) -> None:
        """Write every unacknowledged record not yet written under the bound generation:
        after a move that is all of them, after a push that gave up those it left."""
        self.open()
        attempt = 0
        while True:
            locator = self.locator
            assert locator is not None
            start = self.unacked.placed(locator.generation)
            if start == len(self.unacked):
                return
            # Each pack's id is its first event id, its size and the generation: a
            # retried write in one generation is absorbed, a replay into the next one is
            # not (docs/semantics/pipeline.md §3.1).
            # One write carries whole packs, at most what the server takes; the loop
            # writes the rest, each placed as it lands (docs/semantics/pipeline.md §3.7).
            end = self.unacked.write_end(start)
            body = self.unacked.edge_packs(start, locator.generation, end)
            began = self.clock.now_ms()
            try:
                answer = self.connect(locator.server).append(locator.topic, body, create=False)
            except (TransportError, ApiError) as error:
                full = isinstance(error, ApiError) and error.code == ErrorCode.TOPIC_FULL
                if not full and not gone(error):
                    raise
                if not full:
                    self._disconnected(began)
                attempt += 1
                if attempt > self.retries:
                    raise EdgeUnavailable(f"edge {self.name!r}: {error}") from error
                self.sleep(self.backoff.delay(attempt, self.rng))
                if full:
                    continue
                try:
                    self.move()
                except EdgeUnavailable:
                    continue
                continue
            self._succeeded()
            self.stats.replayed += self.unacked.written(start, end)  # written before, elsewhere
            self.unacked.place(start, locator.generation, answer.seqs, end)
            # The write counts only if the edge has not moved meanwhile: a consumer
            # bound to a newer generation never reads it (docs/semantics/pipeline.md §3.4).
            if self._newer_published():
                attempt += 1
                if attempt > self.retries:
                    raise EdgeUnavailable(f"edge {self.name!r}: moving on and on")

    def _newer_published(self) -> bool:
        current = self.reader.current()
        if current is not None and self.generation().is_stale(current.epoch):
            self.bind(current)
            return True
        return False

    def settle(self) -> None:
        """Forget what the consumer acknowledged; follow a newer placement and write
        the rest there (docs/semantics/pipeline.md §3.4)."""
        self.trim()
        if self.locator is not None:
            self._newer_published()
            pending = self.unacked.placed(self.generation().value) < len(self.unacked)
            if self.unacked and not pending and not self._reachable():
                # Nothing is pushed, but the consumer cannot read what waits here: move
                # it (docs/semantics/pipeline.md §3.4).
                self._disconnected(self._probed_ms or self.clock.now_ms())
                try:
                    self.move()
                except EdgeUnavailable:
                    return
        if self.unacked.placed(self.generation().value) < len(self.unacked):
            self._send()

    def _reachable(self) -> bool:
        """Whether the bound placement answers; probed at most every ``poll_interval_ms``."""
        now = self.clock.now_ms()
        if self._probed_ms is not None and now - self._probed_ms < self.poll_interval_ms:
            return True
        self._probed_ms = now
        assert self.locator is not None
        try:
            self.connect(self.locator.server).get_topic(self.locator.topic, touch=False)
        except (TransportError, ApiError) as error:
            if gone(error):
                return False
            raise
        self._succeeded()
        return True

    def trim(self) -> None:
        state = self.acks.load(self.consumer)
        acked = state.input if state is not None else None
        if acked is None:
            return
        self.unacked.forget(acked)

    def oldest_origin(self) -> Position | None:
        """The input position of the oldest unacknowledged record."""
        return self.unacked.oldest_origin()

    # --- consumer -----------------------------------------------------------------
    def resume(self, checkpoint: Position | None) -> None:
        """Bind to the published placement, reading after ``checkpoint`` when it is of
        that generation, else from the placement's start (docs/semantics/pipeline.md §4.3)."""
        current = self.reader.current()
        if current is None:
            return
        self.bind(current)
        self.cursor = Position(current.generation, current.start_seq)
        if checkpoint is not None and checkpoint.generation == current.generation:
            self.cursor = max(self.cursor, checkpoint)

    def lost(self, gone: Tombstone) -> None:
        """Move the edge past records gone from its topic, then read the new generation
        from its start (docs/semantics/pipeline.md §3.5)."""
        super().lost(gone)
        assert self.locator is not None
        self.rebind(self.locator)

    def rebind(self, locator: QueueLocator) -> None:
        """Read the placement ``locator`` from its start."""
        self.bind(locator)
        self.cursor = Position(locator.generation, locator.start_seq)
        self._released = 0

    def release(self, acked: Position) -> None:
        """Delete what the consumer's checkpoint acknowledged from the bound topic, a
        tenth of the capacity (items, at the size of the packs read last) at a time, so
        a bounded edge never fills up with records already read
        (docs/semantics/pipeline.md §3.6). Best effort: a failure waits for the next
        checkpoint."""
        locator = self.locator
        if locator is None or acked.generation != locator.generation:
            return
        moved = (acked.seq - self._released) * self._per_pack
        if moved < max(1, min(self.capacity // 10, 10_000)):
            return
        try:
            self.connect(locator.server).delete(locator.topic, before_seq=acked.seq + 1)
        except (TransportError, ApiError):
            return
        self._released = acked.seq

    def poll(self, *, force: bool = False) -> bool:
        """Follow the handoff record; True when this side rebound to a newer generation.
        Reads the record at most every ``poll_interval_ms`` unless ``force``."""
        now = self.clock.now_ms()
        if (
            not force
            and self._polled_ms is not None
            and (now - self._polled_ms < self.poll_interval_ms)
        ):
            return False
        self._polled_ms = now
        current = self.reader.current()
        seen = self.reader.seen
        if (current is None and seen.value) or (current is not None and current.epoch < seen):
            raise HandoffRolledBack(self.name, current, seen.value)
        if current is None or not seen.is_stale(current.epoch):
            return False
        self.reader.seen = current.epoch
        if not self.generation().is_stale(current.epoch):
            return False
        self.rebind(current)
        return True

    def stale(self, stamped: FenceEpoch) -> bool:
        """Whether a record stamped ``stamped`` is of a generation older than the bound
        one, and must be dropped (docs/semantics/pipeline.md §1.3)."""
        return stamped.is_stale(self.generation())

    def pop(self, max_items: int = 1000, *, wait_ms: int = 0) -> InFlight:
        """The items of whole packs of the bound generation, in order, each with its
        pack's position on the edge (its generation the one it was written under):
        about ``max_items`` of them, at least one pack. Records of older generations
        are dropped and their items counted (docs/semantics/pipeline.md §3.5)."""
        if self.locator is None:
            self.resume(None)
            if self.locator is None:
                return InFlight.empty()
        self.poll()
        locator, cursor = self.locator, self.cursor
        assert locator is not None and cursor is not None
        began = self.clock.now_ms()
        try:
            # one C call for the page, each record's meta as typed fields; as many packs
            # as hold about max_items at the size of the last ones
            # (docs/pipeline.md, "In-flight records")
            page = self.connect(locator.server).diff_as(
                locator.topic, cursor.seq, EdgePage, wait_ms=wait_ms,
                limit=max(1, min(max_items, round(max_items / self._per_pack))),
            )  # fmt: skip
        except (TransportError, ApiError) as error:
            if not gone(error):
                raise
            # a long poll may have waited wait_ms on a live server before it died
            self._disconnected(min(self.clock.now_ms(), began + wait_ms))
            self.poll(force=True)
            return InFlight.empty()
        self._succeeded()
        if page.tombstone is not None:
            self.lost(page.tombstone)
            return InFlight.empty()
        current = locator.epoch
        accepted: list[EdgeRecord] = []
        last = cursor.seq
        for record in page.records:
            stamped = FenceEpoch(record.meta.generation)
            if self.stale(stamped):
                self.stats.stale_dropped += record.count()  # items, as the meta counts them
                last = record.seq
                continue
            if current.is_stale(stamped):
                # a newer generation is written here: read it from its own start
                taken = self._unpack(accepted, current.value)
                if not self.poll(force=True):
                    break  # its handoff is not readable yet; read this again later
                return taken
            accepted.append(record)
            last = record.seq
        else:
            last = max(last, page.next_from_seq)
        taken = self._unpack(accepted, current.value)  # raises before the cursor moves
        self.cursor = Position(current.value, last)
        return taken

    def _unpack(self, records: list[EdgeRecord], generation: int) -> InFlight:
        """The items of ``records``' packs, each with its pack's position: the packs'
        data decoded in one call, the columns joined with no step per item in Python
        (docs/pipeline.md, "In-flight records")."""
        if not records:
            return InFlight.empty()
        try:
            packs = _decode_packs(b"[%s]" % b",".join([record.data for record in records]))
        except msgspec.ValidationError:
            for record in records:  # which one: named in the error
                try:
                    _decode_pack(record.data)
                except msgspec.ValidationError as error:
                    raise EdgeMalformed(
                        f"edge {self.name!r}: the record at seq {record.seq} of generation "
                        f"{generation} is not a pack: {error}"
                    ) from error
            raise
        counts = [len(pack.items) for pack in packs]
        for record, pack, n in zip(records, packs, counts, strict=True):
            if len(pack.events) != n or len(pack.born_ms) != n or not n:
                raise EdgeMalformed(f"edge {self.name!r}: the pack at seq {record.seq} has "
                                    f"{len(pack.events)} ids, {len(pack.born_ms)} birth "
                                    f"times and {n} items")  # fmt: skip
        self._per_pack = max(1.0, sum(counts) / len(counts))
        chain = itertools.chain.from_iterable
        # each item at its pack's position, the generation the pack was written under
        stamped = np.fromiter((r.meta.generation for r in records), np.int64, len(records))
        return InFlight.build(
            list(chain(pack.events for pack in packs)), list(chain(pack.items for pack in packs)),
            born_ms=list(chain(pack.born_ms for pack in packs)),
            generation=np.repeat(stamped, counts),
            seq=np.repeat(np.fromiter((r.seq for r in records), np.int64, len(records)), counts),
        )  # fmt: skip


_decode_packs = msgspec.json.Decoder(list[EdgePack]).decode
_decode_pack = msgspec.json.Decoder(EdgePack).decode
