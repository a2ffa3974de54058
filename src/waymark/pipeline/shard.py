"""Sharded stages: a stage with N instances, each owning a shard of the key space
with its own edge, and shards taken over when their instance dies
(docs/semantics/pipeline.md §11).

An event's shard is ``crc32(event id, UTF-8) mod N``: stable across processes,
runs and Python versions (``hash()`` is salted per process). The producer of an
edge read by a sharded stage writes each record to the part of the edge of its
shard (``<edge>.<k>``, a relocatable edge of its own); shard k of the stage
(``<stage>.<k>``) reads that part and keeps its own checkpoint.

Who runs a shard is a **lease**: one object per shard in the handoff store, written
by the same rule as a handoff record (docs/semantics/pipeline.md §2.2): a
compare-and-swap, and a takeover publishes the next epoch. Its holder renews it
(any change of the object is a sign of life); an instance that sees a shard's lease
unchanged for ``lease_s`` on its own clock takes it over. The old holder learns at
its next renewal that its epoch is gone and drops the shard. A holder that is only
paused is also fenced by the stage state it no longer owns
(docs/semantics/pipeline.md §4.4), and what it still writes to the sink is
absorbed by the event ids (docs/semantics/pipeline.md §5.2).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterable, Sequence

import msgspec
import numpy as np

from waymark.clock import Clock
from waymark.objstore import (
    CREATE,
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
    ObjectVersion,
    PreconditionFailed,
)
from waymark.pipeline.batch import InFlight
from waymark.pipeline.edge import RelocatableQueueEdge
from waymark.pipeline.fence import FenceEpoch
from waymark.pipeline.state import Position, put_mode

from .errors import PipelineError

MAX_INSTANCES = 64


def part_name(name: str, shard: int) -> str:
    """Shard ``shard`` of an edge or a stage: ``<name>.<k>``. A name never holds a
    ``.``, so no declared edge or stage can be taken for a part."""
    return f"{name}.{shard}"


def shard_of(event_id: str, instances: int) -> int:
    """The shard of an event: CRC-32 of its id (UTF-8) mod ``instances``
    (docs/semantics/pipeline.md §11.1)."""
    return zlib.crc32(event_id.encode()) % instances


def _shard_of_json(event: bytes, instances: int) -> int:
    # An id made of names and numbers reads the same inside its JSON quotes.
    if b"\\" not in event:
        return zlib.crc32(event[1:-1]) % instances
    return shard_of(str(msgspec.json.decode(event)), instances)


class ShardedEdge:
    """The producer's side of an edge read by a sharded stage: each record goes to the
    part of its shard, each part a :class:`RelocatableQueueEdge` moving on its own."""

    def __init__(self, name: str, parts: Sequence[RelocatableQueueEdge]) -> None:
        self.name = name
        self.parts = list(parts)
        self.consumer = self.parts[0].consumer  # the output marker shows shard 0's

    def open(self) -> None:
        for part in self.parts:
            part.open()

    def enqueue(self, records: InFlight) -> None:
        """Hold each record in its shard's part until acknowledged; :meth:`send` writes
        them (a stage writing behind sends in its task, docs/semantics/pipeline.md §4.5)."""
        n = len(self.parts)
        shards = np.fromiter(
            (_shard_of_json(event, n) for event in records.event_jsons()), np.int64, len(records)
        )
        for k, part in enumerate(self.parts):
            mask = shards == k
            if mask.any():
                part.enqueue(records.keep(mask))

    def send(self) -> None:
        for part in self.parts:
            part.send()

    def settle(self) -> None:
        for part in self.parts:
            part.settle()

    def oldest_origin(self) -> Position | None:
        return min((o for p in self.parts if (o := p.oldest_origin()) is not None), default=None)

    @property
    def unacked(self) -> int:
        """Records pushed to any part and not yet acknowledged."""
        return sum(len(part.unacked) for part in self.parts)


# --- the layout ----------------------------------------------------------------------
class ShardLayout(msgspec.Struct, frozen=True, kw_only=True):
    """``shards/<stage>/layout.json``: how many instances a stage reading an edge was
    first run with on this handoff store (written once, create-only)."""

    stage: str
    instances: int


class ShardLayoutChanged(PipelineError):
    """A stage's ``instances`` differs from the count its handoff store was run with
    (docs/semantics/pipeline.md §11.4)."""

    def __init__(self, stage: str, was: int, now: int) -> None:
        super().__init__(
            f"stage {stage!r} ran with instances = {was} on this handoff store; the file now "
            f"says {now}. An event's shard is crc32(event id) mod instances, so records in "
            f"flight and the shards' checkpoints belong to {was} shards: set instances back "
            f"to {was}, or run with {now} as a new run (a fresh handoff store, which delivers "
            "every event again under new ids) once this one is done"
        )
        self.stage, self.was, self.now = stage, was, now


def layout_key(stage: str) -> str:
    return f"shards/{stage}/layout.json"


_layout = msgspec.json.Decoder(ShardLayout)


def check_layout(store: ObjectStore, stage: str, instances: int) -> None:
    """Record ``instances`` for ``stage`` on its first run; raise
    :class:`ShardLayoutChanged` when an earlier run recorded another count. Two
    first runs racing end with the count written first (docs/semantics/pipeline.md §11.4)."""
    try:
        store.put(layout_key(stage), msgspec.json.encode(
            ShardLayout(stage=stage, instances=instances)), mode=CREATE)  # fmt: skip
        return
    except ObjectExists:
        pass
    recorded = _layout.decode(store.get(layout_key(stage)).data)
    if recorded.instances != instances:
        raise ShardLayoutChanged(stage, recorded.instances, instances)


# --- leases ------------------------------------------------------------------------
class ShardLease(msgspec.Struct, frozen=True, kw_only=True):
    """``shards/<stage>/<k>/lease.json``: who runs shard ``k`` of ``stage``. ``epoch``
    grows with each takeover; ``beat`` with each renewal."""

    stage: str
    shard: int
    epoch: int
    owner: str
    beat: int = 0


def lease_key(stage: str, shard: int) -> str:
    return f"shards/{stage}/{shard}/lease.json"


_decoder = msgspec.json.Decoder(ShardLease)


def read_lease(
    store: ObjectStore, stage: str, shard: int
) -> tuple[ShardLease | None, ObjectVersion | None]:
    try:
        got = store.get(lease_key(stage, shard))
    except ObjectNotFound:
        return None, None
    return _decoder.decode(got.data), got.meta.object_version


class ShardLeases:
    """The shards of one stage as one instance sees them: which it holds, renewed;
    which it takes over. :meth:`tick` does one round; the runner calls it about four
    times per lease.

    ``home``: the shards this instance claims at once when nobody holds them
    (instance i's own shard; every shard for a runner of the whole pipeline).
    Another shard is taken over only once its lease stayed unchanged for
    ``lease_ms`` (no lease at all counts from when it was first seen missing).
    """

    def __init__(
        self,
        store: ObjectStore,
        stage: str,
        instances: int,
        *,
        owner: str,
        home: Iterable[int],
        clock: Clock,
        lease_ms: int,
    ) -> None:
        self.store, self.stage, self.instances = store, stage, instances
        self.owner = owner
        self.home = set(home)
        self.clock = clock
        self.lease_ms = lease_ms
        self._held: dict[int, int] = {}  # shard -> the epoch held
        self._renewed_ms: dict[int, int] = {}
        self._seen: dict[int, tuple[ObjectVersion | None, int]] = {}  # as seen, since when
        self._dropped: dict[int, int] = {}  # shard -> the epoch given up
        self._lock = threading.Lock()

    def held(self) -> dict[int, int]:
        with self._lock:
            return dict(self._held)

    def owns(self, shard: int) -> bool:
        with self._lock:
            return shard in self._held

    def lose(self, shard: int) -> None:
        """Drop ``shard`` (its lease or its stage state names another instance); its
        current epoch is never taken up again by this instance."""
        with self._lock:
            epoch = self._held.pop(shard, None)
            if epoch is not None:
                self._dropped[shard] = epoch

    def tick(self) -> None:
        for shard in range(self.instances):
            self._tick(shard, self.clock.now_ms())

    def _put(self, lease: ShardLease, version: ObjectVersion | None) -> bool:
        try:
            self.store.put(
                lease_key(self.stage, lease.shard), msgspec.json.encode(lease),
                mode=put_mode(version),
            )  # fmt: skip
        except (ObjectExists, PreconditionFailed):
            return False  # changed since read: the next round reads it again
        return True

    def _tick(self, shard: int, now: int) -> None:
        lease, version = read_lease(self.store, self.stage, shard)
        with self._lock:
            mine = self._held.get(shard)
        if mine is not None:
            if lease is None or lease.owner != self.owner or lease.epoch != mine:
                self.lose(shard)  # taken over: this instance is fenced for it
                self._seen[shard] = (version, now)
                return
            due = now - self._renewed_ms.get(shard, now) >= self.lease_ms // 4
            if due and self._put(msgspec.structs.replace(lease, beat=lease.beat + 1), version):
                self._renewed_ms[shard] = now
            return
        if (
            lease is not None
            and lease.owner == self.owner
            and self._dropped.get(shard) != lease.epoch
        ):
            # a takeover that landed though its answer was lost
            # (docs/semantics/pipeline.md §10)
            with self._lock:
                self._held[shard] = lease.epoch
            self._renewed_ms[shard] = now
            return
        if lease is None and shard in self.home:
            self.take(shard, None, None, now)
            return
        seen = self._seen.get(shard)
        if seen is None or seen[0] != version:
            self._seen[shard] = (version, now)  # a change is a sign of life
            return
        if now - seen[1] >= self.lease_ms:
            self.take(shard, lease, version, now)

    def take(self, shard: int, lease: ShardLease | None, version: ObjectVersion | None,
             now: int) -> None:  # fmt: skip
        """Take ``shard`` over from ``lease`` as read at ``version``: publish its next
        epoch with this instance as owner. A compare-and-swap, so of two instances
        taking one shard over, one wins (docs/semantics/pipeline.md §11.2)."""
        epoch = FenceEpoch(lease.epoch if lease is not None else 0).bump().value
        taken = ShardLease(stage=self.stage, shard=shard, epoch=epoch, owner=self.owner)
        if self._put(taken, version):
            with self._lock:
                self._held[shard] = epoch
            self._renewed_ms[shard] = now
        self._seen.pop(shard, None)
