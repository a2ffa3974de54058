"""One topic instance: its records, watermarks, eviction, tombstones, deletion, reads.

Watermarks (docs/semantics/topics.md §5.1). ``front`` is the first seq not yet removed from
the head of the log by eviction, expiry or deletion, settled so that it is always a
live record or ``next_seq``; it *is* ``earliest_seq``. Involuntary removal of live
records (cap, TTL) also raises ``cap_floor`` / ``ttl_floor``; ``evict_floor`` derives
from them and is the only tombstone trigger. Deletion moves ``front`` but never a
floor, which is what keeps a purely deleted gap silent.

Time is always passed in (``now``): TTL expiry is applied lazily, at the start of
every operation, before anything is observed.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import NamedTuple

import msgspec
import numpy as np
from sortedcontainers import SortedDict

from ..protocol import (
    DeleteResponse,
    Discard,
    Durability,
    Tombstone,
    TopicConfig,
    TopicState,
    TopicType,
)
from .chunk import DELETED, LIVE, Chunk
from .deletion import TagMatch
from .errors import ErrorCode, TopicError
from .journal import Commit, HeadFrame
from .priority import effective_priority
from .records import EncodedRecord, PlainRecords, Records
from .results import DiffResult, Span

MAX_LOSS_RUNS = 1024
MAX_RESTART_RUNS = 4096  # live runs an ephemeral topic's seal records as holes

# Topics other than memory ones journal a seq ceiling before handing out any seq above
# it, so a crash that loses acknowledged records never lets their seqs be reused. What
# a crash may report as lost is the ceiling's lead over the head, so it stays short
# (docs/durability.md): a raised ceiling leads by about RESERVE_WINDOW_MS of the
# topic's recent appends, by no more than it handed out since it was last idle, and by
# at most SEQ_RESERVE seqs; an idle topic's ceiling is trimmed to its exact head.
SEQ_RESERVE = 4096
RESERVE_WINDOW_MS = 100

# Journals a frame of this topic; the commit that makes it durable (None in memory).
WriteFrame = Callable[[HeadFrame], Commit | None]


class Hole(NamedTuple):
    lo: int
    hi: int
    reason: str = "lost"  # or "source_trim"


def _hole_hi(hole: Hole) -> int:
    return hole.hi


@dataclass(slots=True)
class LossRun:
    """A contiguous seq range whose live records were removed involuntarily."""

    lo: int
    hi: int
    reason: str  # "cap" | "ttl" | "mixed"
    lost: int


class TopicSnapshot(NamedTuple):
    """What a catalog keeps of a topic besides its records (docs/durability.md)."""

    next_seq: int
    front: int
    cap_floor: int
    ttl_floor: int
    losses: list[LossRun]
    ceiling: int
    holes: list[Hole]
    last_ts: int
    last_write_ts: int
    dedupe: list[tuple[str, int, int]]  # (id, seq, ts) inside the idempotency window


class AppendPlan(msgspec.Struct, gc=False):
    """An append validated against the topic, not yet applied (the commit seam).

    A Struct: every append builds one, and it is cheaper to build than a dataclass."""

    fresh: Records  # records that will get new seqs, in order
    # the seq each requested record resolves to (a columnar append's: a range, which a
    # publish of a million records does not build as a list, twice, on the event loop)
    seqs: list[int] | range
    first_seq: int
    ts: int
    fresh_bytes: int


class Topic:
    def __init__(
        self,
        name: str,
        topic_type: TopicType,
        config: TopicConfig,
        epoch: int,
        now: int,
        seq_base: int = 1,
    ) -> None:
        self.name = name
        self.type = topic_type
        self.config = config
        self.epoch = epoch
        self.seq_base = seq_base
        self.next_seq = seq_base
        self.front = seq_base
        self.cap_floor = 0
        self.ttl_floor = 0
        self.losses: list[LossRun] = []
        self.live_count = 0
        self.live_bytes = 0
        self.chunks: list[Chunk] = []
        self._bases: list[int] = []  # chunks[i].base_seq, for bisect
        self.tag_index: SortedDict = SortedDict()  # tag -> array("Q") of seqs, ascending
        self._dedupe: dict[str, tuple[int, int]] = {}  # id -> (seq, ts)
        self._dedupe_order: deque[tuple[int, str]] = deque()
        self.ceiling = 0  # no seq above this was ever handed out (journaled)
        self.durable_ceiling = 0  # nor above this one, whose frame is synced
        self.ceiling_commit: Commit | None = None  # the frame of the ceiling, until durable
        self.refill_at = 0  # an append past this raises the ceiling before it runs out
        self.lead = 0  # how far the last raise put the ceiling above the head
        # What sizes the next lead (docs/durability.md): the head when the topic was last
        # idle, and the head and time of the last ceiling raise; and the next_seq the
        # engine's previous trim pass saw.
        self.idle_from = seq_base - 1
        self.reserved_from = seq_base - 1
        self.reserved_at = now
        self.trim_mark = 0
        # fsync topics: (first seq, commit) of appends not yet durable. Readers stop
        # before the oldest, so nothing they see can be taken back by a crash.
        self.unsynced: deque[tuple[int, Commit]] = deque()
        # Seq ranges with no record that readers must hear about: seqs a crash lost
        # (handed out, never durable) and a router dest's source_trim ranges
        # (docs/semantics/topics.md §8.4).
        # Each reads as a tombstone; those below the evict floor are covered by its own.
        self.holes: list[Hole] = []
        self.created_ts = now
        self.last_ts = 0
        self.last_write_ts = 0
        self.last_read_ts = 0
        self.last_consumed_at = 0
        self.enqueued_at = 0  # oldest unconsumed write's arrival (docs/semantics/topics.md §3)

    # --- derived watermarks -------------------------------------------------------
    @property
    def head_seq(self) -> int:
        return self.next_seq - 1

    @property
    def earliest_seq(self) -> int:
        return self.front

    @property
    def evict_floor(self) -> int:
        floor = max(self.cap_floor, self.ttl_floor) + 1
        return min(max(floor, self.seq_base), self.next_seq)

    def state(self, now: int) -> TopicState:
        """The state readers can act on: for an fsync topic, appends still waiting for
        their sync are left out of head, earliest, count and bytes, exactly as reads
        leave them out (a reader diffing from this head_seq misses nothing and is never
        taken for a stale cursor); ``assigned_head_seq`` still counts them."""
        self.expire(now)
        head = self.readable_head()
        count, nbytes = self.live_count, self.live_bytes
        if head < self.head_seq:
            waiting, waiting_bytes = self._live_between(head + 1, self.head_seq)
            count -= waiting
            nbytes -= waiting_bytes
        earliest = self._readable_earliest(head)
        return TopicState(
            name=self.name,
            type=self.type,
            epoch=self.epoch,
            config=self.config.view(self.type is TopicType.QUEUE),
            durability=self.config.durability,
            fsync_ms=0,  # the engine fills in an fsync topic's (it knows the journal)
            head_seq=head,
            assigned_head_seq=self.head_seq,
            earliest_seq=earliest,
            evict_floor=min(self.evict_floor, earliest),
            next_seq=self.next_seq,
            count=count,
            bytes=nbytes,
            effective_priority=effective_priority(
                self.config.priority,
                self.config.auto_priority,
                now,
                self.last_consumed_at,
                self.enqueued_at,
            ),
            created_ts=self.created_ts,
            last_write_ts=self.last_write_ts,
            last_read_ts=self.last_read_ts,
        )

    def consumed(self, now: int) -> None:
        self.last_consumed_at = now
        self.last_read_ts = now
        self.enqueued_at = 0

    # --- the seq ceiling (docs/durability.md) --------------------------------------
    # Its state is the topic's, and so is every rule that moves it: the engine only
    # journals the frames these methods hand it.
    def reserve(self, last: int, now: int, write: WriteFrame) -> bool:
        """Make a journaled seq ceiling cover ``last``; True while no durable one does
        (disk acks then wait for the sync). A raise counts once ``write`` journaled it.
        memory topics keep none: their head may regress after a crash
        (docs/semantics/topics.md §2.2)."""
        if self.config.durability is Durability.MEMORY:
            return False
        if last <= self.refill_at and last <= self.durable_ceiling:
            return False  # (every append but a few per lead passes here)
        pending = self.ceiling_commit
        if pending is not None and pending.durable:
            self.durable_ceiling, self.ceiling_commit, pending = self.ceiling, None, None
        # Raised early, once a quarter of the lead is used, so that under steady appends
        # the new ceiling is durable before anyone needs it; raised again when an append
        # must wait anyway, so that one wait buys a whole lead from here.
        stalled = last > self.durable_ceiling
        if last > self.ceiling or (last > self.refill_at and (pending is None or stalled)):
            # Lead by RESERVE_WINDOW_MS of appends at the rate since the previous raise
            # (falling by half at most per raise, so one slow sync does not shrink it to
            # nothing), but never by more than the topic handed out since it was last
            # idle: a burst starts with short leads that grow with it.
            elapsed = now - self.reserved_at
            by_rate = (last - self.reserved_from) * RESERVE_WINDOW_MS // max(elapsed, 1)
            lead = min(max(by_rate, self.lead // 2), last - self.idle_from, SEQ_RESERVE)
            commit = write(HeadFrame(self.name, self.epoch, last + lead))
            self.ceiling, self.ceiling_commit, self.lead = last + lead, commit, lead
            self.refill_at = last + lead // 4
            self.reserved_from, self.reserved_at = last, now
        return stalled

    def trim_ceiling(self, write: WriteFrame) -> bool | None:
        """One pass of the idle trim: lower the ceiling to the exact head if no seq was
        handed out since the previous pass, so a crash while idle reports nothing as
        lost. True: trimmed; False: not now; None: exact and durable (or a memory topic,
        which keeps none), nothing left to do. ``write`` may refuse (its WAL shard cannot
        write now): then the wider ceiling stays."""
        if self.config.durability is Durability.MEMORY:
            return None
        if self.ceiling <= self.head_seq:
            pending = self.ceiling_commit
            if pending is None or pending.durable:
                self.ceiling_commit = None
                return None
            return False
        if self.trim_mark != self.next_seq:
            self.trim_mark = self.next_seq  # written since the previous pass
            return False
        commit = write(HeadFrame(self.name, self.epoch, self.head_seq))
        # Acks above the head wait again until a raise is durable: should this frame
        # survive a crash without the raise, the head is the ceiling.
        self.ceiling = self.durable_ceiling = self.head_seq
        self.idle_from = self.reserved_from = self.head_seq
        self.ceiling_commit = commit
        return True

    def close_ceiling(self) -> HeadFrame | None:
        """The frame to journal at a clean stop: the exact head as the ceiling, so a
        restart continues seqs without a gap (None: a memory topic keeps none)."""
        if self.config.durability is Durability.MEMORY:
            return None
        self.ceiling = self.head_seq
        return HeadFrame(self.name, self.epoch, self.ceiling)

    # --- replay and restore (docs/durability.md) ----------------------------------
    @classmethod
    def restored(
        cls,
        snapshot: TopicSnapshot,
        name: str,
        topic_type: TopicType,
        config: TopicConfig,
        epoch: int,
        created_ts: int,
    ) -> Topic:
        """The topic a catalog entry describes, without its segments (add them with
        :meth:`add_chunk`, then :meth:`recount`)."""
        topic = cls(name, topic_type, config, epoch, created_ts)
        topic.next_seq = snapshot.next_seq
        topic.front = snapshot.front
        topic.cap_floor = snapshot.cap_floor
        topic.ttl_floor = snapshot.ttl_floor
        topic.losses = list(snapshot.losses)
        topic.ceiling = snapshot.ceiling
        topic.holes = list(snapshot.holes)
        topic.last_ts = snapshot.last_ts
        topic.last_write_ts = snapshot.last_write_ts
        topic.restore_dedupe(snapshot.dedupe)
        return topic

    def snapshot(self) -> TopicSnapshot:
        """What a catalog keeps of this topic besides its segments. An ephemeral topic's
        records are not kept: a restart from it loses the live ones, which it learns
        as holes, and nothing else (docs/semantics/topics.md §2.2)."""
        front, holes = self.front, self.holes
        if self.config.durability is Durability.EPHEMERAL:
            front, holes = self.next_seq, self.lost_on_restart()
        return TopicSnapshot(
            self.next_seq, front, self.cap_floor, self.ttl_floor, list(self.losses),
            self.ceiling, list(holes), self.last_ts, self.last_write_ts,
            self.dedupe_entries(),
        )  # fmt: skip

    def recount(self) -> None:
        """Live counts, bytes and the tag index of a topic loaded from segments."""
        self.live_count = self.live_bytes = 0
        for chunk in self.chunks:
            live = np.frombuffer(chunk.dead, np.uint8) == 0
            below_front = max(0, min(chunk.n, self.front - chunk.base_seq))
            live[:below_front] = False
            chunk.live = int(np.count_nonzero(live))
            self.live_count += chunk.live
            self.live_bytes += int(np.asarray(chunk.size, np.uint64)[live].sum())
            # The tag index, grouped per tag with one sort instead of a scan per tag.
            tags = np.asarray(chunk.tag)[live]
            if not tags.any():
                continue
            seqs = np.flatnonzero(live).astype(np.uint64) + chunk.base_seq
            order = np.argsort(tags, kind="stable")
            tags, seqs = tags[order], seqs[order]
            bounds = np.flatnonzero(np.diff(tags)) + 1
            for group_tags, group_seqs in zip(np.split(tags, bounds), np.split(seqs, bounds),
                                              strict=True):  # fmt: skip
                tag_id = int(group_tags[0])
                if tag_id == 0:
                    continue
                name = chunk.tag_names.names[tag_id]
                index = self.tag_index.get(name)
                if index is None:
                    index = self.tag_index[name] = array("Q")
                index.extend(group_seqs.tolist())

    def replace_chunk(self, old: Chunk, new: Chunk) -> bool:
        """Put ``new`` (its sealed copy) in ``old``'s place; False if ``old`` is gone
        (evicted meanwhile)."""
        if old not in self.chunks:
            return False
        self.chunks[self.chunks.index(old)] = new
        return True

    def replay_ceiling(self, ceiling: int, next_seq: int | None = None) -> None:
        """A journaled ceiling, read back; ``next_seq``: where a restart moved the topic
        past its lead with nothing lost (:meth:`recovered`), silently."""
        self.ceiling = ceiling
        if next_seq is not None and next_seq > self.next_seq:
            self.next_seq = next_seq
            self.settle_front()

    def skip_to(self, seq: int) -> None:
        """Replay met a frame taking ``seq`` past the next one: the seqs in between were
        handed out before a crash and never landed (a router dest's copies are not
        journaled)."""
        if seq > self.next_seq:
            self.holes.append(Hole(self.next_seq, seq - 1))
            self.next_seq = seq

    def replayed(self) -> HeadFrame | None:
        """After the last frame of a restart: never reuse a seq that may have been handed
        out. Seqs between the last recovered record and the ceiling may belong to records
        that were acknowledged (disk) or shown to readers (ephemeral) and then lost: a
        reader crossing them gets a ``lost`` tombstone. An fsync topic lost nothing a
        producer or reader saw, so it just moves past them, and returns the frame to
        journal that says so: the next restart would otherwise meet the records above
        the skipped seqs and take them for lost (docs/durability.md). An ephemeral topic
        comes back empty whatever a seal knew of it (docs/semantics/topics.md §2.2)."""
        durability = self.config.durability
        moved = None
        # (memory topics carry no ceiling: their head may regress, docs/semantics/topics.md §2.2)
        if durability is Durability.EPHEMERAL:
            self.lose_resident_records()
        elif durability is not Durability.MEMORY and self.ceiling >= self.next_seq:
            if durability is Durability.FSYNC:
                moved = HeadFrame(self.name, self.epoch, self.ceiling, self.ceiling + 1)
            else:
                self.holes.append(Hole(self.next_seq, self.ceiling))
            self.next_seq = self.ceiling + 1
            self.settle_front()
        # Restarted, a topic is idle: its next ceiling leads by what it hands out from here.
        self.idle_from = self.reserved_from = self.head_seq
        self.durable_ceiling = self.ceiling  # read back from disk
        return moved

    # --- configuration ------------------------------------------------------------
    def reconfigure(self, config: TopicConfig, now: int) -> None:
        # Expire under the old TTL first: a record already invisible never comes back.
        self.expire(now)
        self.config = config
        self.expire(now)
        if config.discard is Discard.OLD:
            self._evict_to_cap()

    # --- append -------------------------------------------------------------------
    def plan_append(self, records: Records, now: int) -> AppendPlan:
        """Validate an append (dedupe, caps); raises before anything changes."""
        config = self.config
        if config.ttl_ms:
            self.expire(now)
        first = self.next_seq
        # One record per write is the commonest shape: it skips the generators.
        single = records[0] if len(records) == 1 else None
        fresh: Records
        seqs: list[int] | range
        if isinstance(records, PlainRecords):  # a sink's publish: no ids, sizes in bulk
            fresh, seqs = records, range(first, first + len(records))
            fresh_bytes = records.data_bytes()
        elif single is not None and (single.id is None or not config.idempotency_window_ms):
            fresh, seqs, fresh_bytes = records, [first], single.size
        else:
            ids = list(map(_id_of, records)) if config.idempotency_window_ms else None
            if ids is None or ids.count(None) == len(ids):  # (one C pass: 1M records)
                fresh = records
                seqs = list(range(first, first + len(records)))
            else:
                fresh, seqs = self._dedupe_batch(records, ids, now)
            fresh_bytes = sum(map(_size_of, fresh))  # (one C pass: a publish is 1M records)
        if config.discard is Discard.REJECT:
            self._check_caps(len(fresh), fresh_bytes)
        ts = now if now > self.last_ts else self.last_ts  # never backwards (not max(): slow)
        return AppendPlan(fresh, seqs, first, ts, fresh_bytes)

    def _dedupe_batch(
        self, records: list[EncodedRecord], ids: list[str | None], now: int
    ) -> tuple[list[EncodedRecord], list[int]]:
        """Split a write into new records and repeats of ids seen within the window
        (``ids``: the records' ids, in order)."""
        self._prune_dedupe(now)
        next_seq = self.next_seq
        # A pipeline edge's write: every record has an id, none repeated or known. Proven
        # with C calls over the whole write, where the loop below is ten steps a record.
        if None not in ids:
            distinct = set(ids)
            if len(distinct) == len(ids) and self._dedupe.keys().isdisjoint(distinct):
                return records, list(range(next_seq, next_seq + len(ids)))
        fresh: list[EncodedRecord] = []
        seqs: list[int] = []
        batch_ids: dict[str, int] = {}
        for record in records:
            if record.id is not None:
                known = batch_ids.get(record.id)
                if known is None and record.id in self._dedupe:
                    known = self._dedupe[record.id][0]
                if known is not None:
                    seqs.append(known)
                    continue
                batch_ids[record.id] = next_seq
            fresh.append(record)
            seqs.append(next_seq)
            next_seq += 1
        return fresh, seqs

    def _check_caps(self, n: int, nbytes: int) -> None:
        """discard=reject refuses before any seq is assigned (docs/semantics/topics.md §5.3);
        discard=old never does, so callers check only discard=reject topics."""
        cfg = self.config
        if (cfg.cap_records and n > cfg.cap_records) or (cfg.cap_bytes and nbytes > cfg.cap_bytes):
            raise TopicError(
                ErrorCode.RECORD_TOO_LARGE,
                "this write is larger than the topic's whole cap; it can never be accepted",
                {"records": n, "bytes": nbytes, **self._cap_detail()},
            )
        if (cfg.cap_records and self.live_count + n > cfg.cap_records) or (
            cfg.cap_bytes and self.live_bytes + nbytes > cfg.cap_bytes
        ):
            raise TopicError(
                ErrorCode.TOPIC_FULL,
                "the topic is full (discard: reject); retry after consumers drain it",
                self._cap_detail(),
            )

    def _cap_detail(self) -> dict[str, int]:
        return {
            "cap_records": self.config.cap_records,
            "cap_bytes": self.config.cap_bytes,
            "head_seq": self.head_seq,
            "earliest_seq": self.earliest_seq,
        }

    def apply_append(self, plan: AppendPlan, now: int, built: list[Chunk] | None = None) -> None:
        """Store ``plan``'s records; ``built``: new chunks already holding them, laid out
        off the event loop (:mod:`waymark.log.prebuilt`), which are adopted as they are."""
        fresh = plan.fresh
        if not fresh:
            return
        seq, ts = plan.first_seq, plan.ts
        n = len(fresh)
        config = self.config
        plain = isinstance(fresh, PlainRecords)  # (no tags, no ids: no pass over them)
        tags = [] if plain else list(map(_tag_of, fresh))
        if not plain and tags.count(None) != n:
            for i, tag in enumerate(tags):
                if tag is not None:
                    seqs = self.tag_index.get(tag)
                    if seqs is None:
                        seqs = self.tag_index[tag] = array("Q")
                    seqs.append(seq + i)
        if config.idempotency_window_ms and not plain:
            ids = list(map(_id_of, fresh))
            if None not in ids:  # (each id once: plan_append dropped the repeats)
                self._dedupe.update(zip(ids, zip(range(seq, seq + n), repeat(ts)), strict=True))
                self._dedupe_order.extend(zip(repeat(ts), ids))
            elif ids.count(None) != n:  # (a sink's publish of untagged records: no pass)
                for i, ident in enumerate(ids):
                    if ident is not None:
                        self._dedupe[ident] = (seq + i, ts)
                        self._dedupe_order.append((ts, ident))
        chunks = self.chunks
        done = 0
        for ready in built or ():
            self.add_chunk(ready)
            done += ready.n
        while done < n:
            chunk = chunks[-1] if chunks else None
            # A chunk holds a contiguous seq range: after a hole the next one starts afresh.
            room = chunk.room_at(seq + done) if chunk is not None else 0
            if chunk is None or not room:  # no chunk means no room
                chunk = self._new_chunk(seq + done)
                room = chunk.room()
            end = done + room if done + room < n else n
            chunk.extend(seq + done, ts, fresh if end - done == n else fresh[done:end])
            done = end
        self.next_seq = seq + n
        self.last_ts = ts
        self.live_count += n
        self.live_bytes += plan.fresh_bytes
        self.last_write_ts = now
        if not self.enqueued_at:
            self.enqueued_at = now
        if config.discard is Discard.OLD and (config.cap_records or config.cap_bytes):
            self._evict_to_cap()

    def _new_chunk(self, base_seq: int) -> Chunk:
        chunk = Chunk(base_seq)
        self.add_chunk(chunk)
        return chunk

    def add_chunk(self, chunk: Chunk) -> None:
        """Append ``chunk`` after the last one (recovery adds the sealed segments)."""
        self.chunks.append(chunk)
        self._bases.append(chunk.base_seq)

    def dedupe_entries(self) -> list[tuple[str, int, int]]:
        """The idempotency ids still inside the window: ``(id, seq, ts)`` each."""
        horizon = self.last_ts - self.config.idempotency_window_ms
        return [(i, s, t) for i, (s, t) in self._dedupe.items() if t >= horizon]

    def restore_dedupe(self, entries: list[tuple[str, int, int]]) -> None:
        """Take back what :meth:`dedupe_entries` exported."""
        for ident, seq, ts in sorted(entries, key=lambda d: d[2]):
            self._dedupe[ident] = (seq, ts)
            self._dedupe_order.append((ts, ident))

    def _prune_dedupe(self, now: int) -> None:
        horizon = now - self.config.idempotency_window_ms
        order = self._dedupe_order
        while order and order[0][0] < horizon:
            ts, ident = order.popleft()
            if self._dedupe.get(ident, (0, -1))[1] == ts:
                del self._dedupe[ident]

    # --- involuntary removal: TTL and cap ------------------------------------------
    def expire(self, now: int) -> None:
        """Remove records with now - ts > ttl_ms from the head (docs/semantics/topics.md §5.2)."""
        ttl = self.config.ttl_ms
        if not ttl or self.front >= self.next_seq:
            return
        cutoff = now - ttl  # expired iff ts < cutoff
        upto = self.front - 1
        # ts is non-decreasing in seq, so "expired" is a prefix: binary search it.
        for chunk in self._chunks_from(self.front):
            if chunk.ts[-1] < cutoff:
                upto = chunk.last_seq
                continue
            k = bisect_left(chunk.ts, cutoff)
            upto = chunk.base_seq + k - 1
            break
        if upto >= self.front:
            self._remove_front(upto, "ttl")

    def _evict_to_cap(self) -> None:
        """discard=old: drop the oldest live records until back within both caps
        (docs/semantics/topics.md §5.3).

        Scans forward from the front in geometrically growing windows, so the work
        is proportional to what is evicted, not to the size of the topic.
        """
        cfg = self.config
        need_n = self.live_count - cfg.cap_records if cfg.cap_records else 0
        need_b = self.live_bytes - cfg.cap_bytes if cfg.cap_bytes else 0
        if need_n <= 0 and need_b <= 0:
            return
        window = 64
        for chunk in self._chunks_from(self.front):
            lo = max(self.front - chunk.base_seq, 0)
            while lo < chunk.n:
                hi = min(chunk.n, lo + window)
                live = np.frombuffer(chunk.dead, np.uint8)[lo:hi] == 0
                cum_n = np.cumsum(live, dtype=np.int64)
                sizes = np.frombuffer(chunk.size, np.uint32)[lo:hi]
                cum_b = np.cumsum(sizes * live, dtype=np.int64)
                pos = max(
                    int(np.searchsorted(cum_n, need_n)) if need_n > 0 else -1,
                    int(np.searchsorted(cum_b, need_b)) if need_b > 0 else -1,
                )
                if pos < len(cum_n):
                    self._remove_front(chunk.base_seq + lo + pos, "cap")
                    return
                need_n -= int(cum_n[-1])
                need_b -= int(cum_b[-1])
                lo = hi
                window *= 2
        raise AssertionError("live counters disagree with the chunks")

    def _remove_front(self, upto: int, reason: str | None) -> int:
        """Remove every slot in [front, upto]; ``reason`` None means voluntary deletion.

        Returns the number of live records removed.
        """
        removed = removed_bytes = 0
        last_live = 0
        for chunk, lo, hi in self._spans(self.front, upto):
            live = np.frombuffer(chunk.dead, np.uint8)[lo:hi] == 0
            n = int(np.count_nonzero(live))
            if n:
                removed += n
                removed_bytes += int(np.frombuffer(chunk.size, np.uint32)[lo:hi][live].sum())
                last_live = chunk.base_seq + lo + int(np.flatnonzero(live)[-1])
                chunk.live -= n
        self.live_count -= removed
        self.live_bytes -= removed_bytes
        if removed and reason is not None:
            # Only live records count as loss: popping deleted slots never raises a floor.
            if reason == "cap":
                self.cap_floor = max(self.cap_floor, last_live)
            else:
                self.ttl_floor = max(self.ttl_floor, last_live)
            self._record_loss(self.front, upto, reason, removed)
        self.front = upto + 1
        self.settle_front()
        return removed

    def _record_loss(self, lo: int, hi: int, reason: str, lost: int) -> None:
        runs = self.losses
        if runs and runs[-1].reason == reason and runs[-1].hi + 1 >= lo:
            runs[-1].hi = hi
            runs[-1].lost += lost
        else:
            runs.append(LossRun(lo, hi, reason, lost))
        if len(runs) > MAX_LOSS_RUNS:
            first, second = runs[0], runs[1]
            merged = first.reason if first.reason == second.reason else "mixed"
            runs[0:2] = [LossRun(first.lo, second.hi, merged, first.lost + second.lost)]

    def settle_front(self) -> None:
        """Advance front past deleted slots and holes; drop chunks wholly below it."""
        while self.front < self.next_seq:
            index = self._chunk_index(self.front)
            if index < 0:  # no chunk at or below front: the first chunk (if any) is next
                self.front = self.chunks[0].base_seq if self.chunks else self.next_seq
                continue
            chunk = self.chunks[index]
            if self.front > chunk.last_seq:  # inside a hole: the next chunk starts after it
                following = self.chunks[index + 1] if index + 1 < len(self.chunks) else None
                self.front = following.base_seq if following else self.next_seq
                continue
            j = chunk.dead.find(0, self.front - chunk.base_seq)
            if j >= 0:
                self.front = chunk.base_seq + j
                break
            self.front = chunk.last_seq + 1
        while self.chunks and self.chunks[0].last_seq < self.front:
            self._drop_first_chunk()

    def _drop_first_chunk(self) -> None:
        chunk = self.chunks.pop(0)
        self._bases.pop(0)
        # Prune the tag index of this chunk's seqs: only tags present in it can be touched.
        for tag in chunk.tag_names.names[1:]:
            seqs = self.tag_index.get(tag)
            if seqs is None:
                continue
            del seqs[: bisect_right(seqs, chunk.last_seq)]
            if not seqs:
                del self.tag_index[tag]

    # --- voluntary removal: deletion (docs/semantics/topics.md §7) -----------------------------
    def delete(
        self, bound: int, match: TagMatch | None, now: int, slot: int | None = None
    ) -> DeleteResponse:
        """Delete below ``bound`` (min of before_seq and head_seq + 1 at call time: the
        point in time), every record or only those whose tag matches. ``slot``: the
        deletion's own seq, taken after it (:meth:`removes_any` said it removes
        something)."""
        self.expire(now)
        if match is None:
            deleted = self._remove_front(bound - 1, None) if bound > self.front else 0
        else:
            deleted = self._delete_tagged(match, bound)
        if slot is not None:
            self.take_deleted(slot, now)
        return DeleteResponse(
            deleted, self.earliest_seq, self.head_seq, self.live_count, self.live_bytes
        )

    def removes_any(self, bound: int, match: TagMatch | None, now: int) -> bool:
        """Whether :meth:`delete` now would remove a live record: asked before the
        deletion is journaled, since one that removes anything takes its own seq
        (docs/semantics/topics.md §7.1)."""
        self.expire(now)
        if match is None:
            return bound > self.front  # the front is a live record or next_seq
        for tag in self._matching_tags(match):
            seqs = self.tag_index[tag]
            lo, hi = bisect_left(seqs, self.front), bisect_left(seqs, bound)
            if any(self.slot(seq) is not None for seq in seqs[lo:hi]):
                return True
        return False

    def take_deleted(self, seq: int, now: int) -> None:
        """Hand out ``seq`` (the next one) as a slot born deleted: a deletion's own seq,
        which no reader ever sees (docs/semantics/topics.md §7.1). Replay passes a
        seq a seal already holds: nothing to do."""
        if seq < self.next_seq:
            return
        ts = now if now > self.last_ts else self.last_ts  # ts never goes backwards in seq
        chunk = self.chunks[-1] if self.chunks else None
        if chunk is None or not chunk.room_at(seq):
            chunk = self._new_chunk(seq)
        chunk.extend_deleted(seq, ts)
        self.next_seq = seq + 1
        self.last_ts = ts
        self.settle_front()

    def delete_seqs(self, seqs: list[int], now: int) -> DeleteResponse:
        """Delete exactly these seqs (a queue's ack and dead-letter move,
        docs/semantics/topics.md §10.2).

        Seqs already gone are skipped. Their tag index entries stay behind: every
        reader of the index skips deleted slots, and chunk drops prune them.
        """
        self.expire(now)
        deleted = sum(
            self._mark_deleted(seq)
            for seq in seqs
            if self.front <= seq < self.next_seq and self._chunk_index(seq) >= 0
        )
        self.settle_front()
        return DeleteResponse(
            deleted, self.earliest_seq, self.head_seq, self.live_count, self.live_bytes
        )

    def _matching_tags(self, match: TagMatch) -> list[str]:
        if match.exact:
            return [match.value] if match.value in self.tag_index else []
        prefix, tags = match.prefix, []
        for tag in self.tag_index.irange(minimum=prefix):
            if not tag.startswith(prefix):
                break
            if match.matches(tag):
                tags.append(tag)
        return tags

    def _delete_tagged(self, match: TagMatch, bound: int) -> int:
        deleted = 0
        for tag in self._matching_tags(match):
            seqs = self.tag_index[tag]
            cut = bisect_left(seqs, bound)
            for seq in seqs[bisect_left(seqs, self.front, 0, cut) : cut]:
                deleted += self._mark_deleted(seq)
            del seqs[:cut]
            if not seqs:
                del self.tag_index[tag]
        self.settle_front()
        return deleted

    def _mark_deleted(self, seq: int) -> bool:
        """Mark one retained slot deleted; False if it is not there or already gone."""
        chunk = self.chunks[self._chunk_index(seq)]
        i = seq - chunk.base_seq
        if i >= chunk.n or chunk.dead[i] == DELETED:
            return False
        chunk.dead[i] = DELETED
        chunk.live -= 1
        self.live_count -= 1
        self.live_bytes -= int(chunk.size[i])
        if chunk.live == 0 and chunk is not self.chunks[-1]:
            # A wholly deleted sealed chunk frees its bytes (docs/semantics/topics.md §7.1).
            chunk.release_payloads()
        return True

    # --- reads (docs/semantics/topics.md §4.3, §5.4, §6, §7.3) ------------------------------
    def note_unsynced(self, first_seq: int, commit: Commit) -> None:
        """Remember an fsync append until its commit is durable. Entries already durable
        are dropped here too, so a topic nobody reads holds only what is still waiting."""
        self._drop_synced()
        self.unsynced.append((first_seq, commit))

    def readable_head(self) -> int:
        """The highest seq a reader may see: the head, minus appends not yet durable."""
        self._drop_synced()
        return self.unsynced[0][0] - 1 if self.unsynced else self.head_seq

    def _readable_earliest(self, head: int) -> int:
        # The first live record may still wait for its sync: then nothing is readable yet.
        return min(self.front, head + 1)

    def _live_between(self, lo_seq: int, hi_seq: int) -> tuple[int, int]:
        """How many live records, and their bytes, seqs [lo_seq, hi_seq] hold."""
        count = nbytes = 0
        # Below the front nothing is live, whatever its slot says (a prefix delete only
        # moves the front).
        for chunk, lo, hi in self._spans(max(lo_seq, self.front), hi_seq):
            live = np.frombuffer(chunk.dead, np.uint8)[lo:hi] == 0
            count += int(np.count_nonzero(live))
            nbytes += int(np.frombuffer(chunk.size, np.uint32)[lo:hi][live].sum())
        return count, nbytes

    def _drop_synced(self) -> None:
        unsynced = self.unsynced
        while unsynced and unsynced[0][1].durable:
            unsynced.popleft()

    def read(
        self,
        from_seq: int,
        limit: int,
        nodes: frozenset[str] | None,
        epoch: int | None,
        now: int,
        per_record: bool,
        columns: bool = False,
    ) -> DiffResult:
        """One page after ``from_seq``; ``columns``: as :class:`Span` copies for an
        Arrow page (docs/http-api.md, "Arrow pages") rather than JSON runs."""
        # Not consumption by itself: internal readers (queue claims, lease replay) read
        # here too; Engine.diff marks the topic consumed for consumers' reads
        # (docs/semantics/topics.md §3).
        self.expire(now)
        head = self.readable_head()
        tombstone = None
        cursor = from_seq
        # Against the assigned head, not the readable one: a cursor at a seq this instance
        # handed out (an fsync append still waiting for its sync) is not from the past.
        stale = epoch != self.epoch if epoch is not None else from_seq > self.head_seq
        if stale:
            # The cursor belongs to an earlier instance of this topic
            # (docs/semantics/topics.md §5.5).
            tombstone = Tombstone(
                seq=self.earliest_seq,
                gap_from=self.seq_base,
                gap_to=head,
                reason="recreated",
                missed_estimate=max(0, head - self.seq_base + 1),
                earliest_seq=self.earliest_seq,
                head_seq=head,
            )
            cursor = self.earliest_seq - 1
        elif from_seq + 1 < self.evict_floor:
            gap_to = self.earliest_seq - 1
            reason, missed = self._loss_between(from_seq + 1, gap_to)
            tombstone = Tombstone(
                seq=self.earliest_seq,
                gap_from=from_seq + 1,
                gap_to=gap_to,
                reason=reason,
                missed_estimate=missed,
                earliest_seq=self.earliest_seq,
                head_seq=head,
            )
            cursor = gap_to
        hole = self._hole_after(cursor)
        if tombstone is None and hole is not None and hole.lo <= cursor + 1:
            # Acknowledged records lost in a crash read exactly like eviction
            # (docs/semantics/topics.md §4.2); so does a router dest's source_trim range
            # (docs/semantics/topics.md §8.4).
            lo, hi = cursor + 1, hole.hi
            tombstone = Tombstone(
                # Right after the hole, not the first live seq: a reader resuming from
                # seq - 1 must still meet any later hole that front has already passed.
                seq=hi + 1,
                gap_from=lo,
                gap_to=hi,
                reason=hole.reason,
                missed_estimate=hi - lo + 1,
                earliest_seq=self.earliest_seq,
                head_seq=head,
            )
            cursor = hi
            hole = self._hole_after(cursor)
        # A page stops before the next hole, so its tombstone opens the following page.
        stop = head if hole is None else hole.lo - 1
        runs: list[bytes | memoryview] = []
        seqs: list[int] = []
        spans: list[Span] = []
        delivered = 0
        next_from = max(cursor, min(self.front - 1, stop))
        readers_nodes = nodes if nodes and self.config.dedupe_node else None
        taken = 0
        seq = max(cursor + 1, self.front)
        while seq <= stop and taken < limit:
            index = self._chunk_index(seq)
            if index < 0:  # below the first chunk: nothing there any more
                seq = self.chunks[0].base_seq
                next_from = min(seq - 1, stop)
                continue
            chunk = self.chunks[index]
            if seq > chunk.last_seq:
                # Between chunks: a range whose records are all gone (a dropped segment).
                following = self.chunks[index + 1] if index + 1 < len(self.chunks) else None
                seq = following.base_seq if following else stop + 1
                next_from = min(seq - 1, stop)
                continue
            i = seq - chunk.base_seq
            n = min(chunk.n, stop - chunk.base_seq + 1)
            first = last = -1  # the slots a columnar read delivers: [first, last)
            while i < n and taken < limit:
                if chunk.dead[i] == DELETED:
                    j = chunk.dead.find(0, i, n)
                    i = n if j < 0 else j
                    continue
                k = chunk.dead.find(DELETED, i, min(n, i + limit - taken))
                if k < 0:
                    k = min(n, i + limit - taken)
                if columns:
                    first = i if first < 0 else first
                    last = k
                else:
                    node_ids = self._reader_node_ids(chunk, readers_nodes)
                    self._take(chunk, i, k, node_ids, per_record, runs, seqs)
                taken += k - i
                i = k
            if first >= 0:
                span = self._span(chunk, first, last, readers_nodes)
                spans.append(span)
                delivered += last - first if span.keep is None else int(span.keep.sum())
            next_from = chunk.base_seq + i - 1
            seq = chunk.base_seq + i
        if seq > stop:
            next_from = max(next_from, stop)
        return DiffResult(
            runs=runs,
            seqs=seqs,
            count=delivered if columns else len(seqs),
            tombstone=tombstone,
            next_from_seq=next_from,
            head_seq=head,
            earliest_seq=self._readable_earliest(head),
            epoch=self.epoch,
            durability=self.config.durability,
            caught_up=next_from >= head,
            spans=spans,
        )

    def _hole_after(self, cursor: int) -> Hole | None:
        """The first hole that ends after ``cursor`` (holes are disjoint and in seq order,
        so a binary search: an ephemeral restart may leave one per run of live records)."""
        holes = self.holes
        passed = bisect_left(holes, self.evict_floor, key=_hole_hi)
        if passed:
            del holes[:passed]  # an eviction tombstone reports them from now on
        i = bisect_right(holes, cursor, key=_hole_hi)
        return holes[i] if i < len(holes) else None

    def skip(self, n: int, reason: str) -> Hole:
        """Hand out ``n`` seqs that hold no record, read as a ``reason`` tombstone."""
        hole = Hole(self.next_seq, self.next_seq + n - 1, reason)
        self.holes.append(hole)
        self.next_seq = hole.hi + 1
        self.settle_front()
        return hole

    def lost_on_restart(self) -> list[Hole]:
        """The holes this ephemeral topic would have if the server restarted now: those it
        has, plus one per run of live records (those vanish). Deleted records stay out of
        them, so a reader past the last live record is told of nothing
        (docs/semantics/topics.md §2.2). Past ``MAX_RESTART_RUNS`` runs the last ones merge
        into one hole, an upper bound (docs/durability.md)."""
        runs: list[Hole] = []
        for chunk in self.chunks:
            i = max(0, self.front - chunk.base_seq)
            while i < chunk.n:
                j = chunk.dead.find(0, i, chunk.n)  # the next live slot
                if j < 0:
                    break
                k = chunk.dead.find(DELETED, j, chunk.n)
                k = chunk.n if k < 0 else k
                lo, hi = chunk.base_seq + j, chunk.base_seq + k - 1
                if runs and runs[-1].hi + 1 == lo:  # continues across a chunk boundary
                    lo = runs.pop().lo
                runs.append(Hole(lo, hi))
                i = k
        if len(runs) > MAX_RESTART_RUNS:
            runs[MAX_RESTART_RUNS - 1 :] = [Hole(runs[MAX_RESTART_RUNS - 1].lo, runs[-1].hi)]
        return sorted([*self.holes, *runs], key=_hole_hi)

    def lose_resident_records(self) -> None:
        """After a restart, an ephemeral topic holds no record
        (docs/semantics/topics.md §2.2), yet keeps its head so no seq is handed out twice.
        The last seal recorded its live records as holes (:meth:`lost_on_restart`) and
        moved ``front`` past them; what it did not see — from ``front`` up to the ceiling,
        what may have been handed out since — is one ``lost`` hole, an upper bound."""
        hi = max(self.ceiling, self.head_seq)
        if self.front <= hi:
            self.holes = [h for h in self.holes if h.hi < self.front]  # the new one covers them
            self.holes.append(Hole(self.front, hi))
        self.next_seq = self.front = hi + 1
        self.chunks.clear()
        self._bases.clear()
        self.tag_index.clear()
        self.live_count = self.live_bytes = 0

    @staticmethod
    def _reader_node_ids(chunk: Chunk, nodes: frozenset[str] | None) -> frozenset[int] | None:
        """The reader's own node ids in ``chunk``'s table (None: nothing to drop)."""
        if nodes is None:
            return None
        return chunk.node_names.lookup(nodes) or None

    @classmethod
    def _span(cls, chunk: Chunk, i: int, k: int, nodes: frozenset[str] | None) -> Span:
        """Slots [i, k) of ``chunk`` copied out for a columnar read: deleted slots and
        the reader's own node's records are masked, not delivered."""
        keep = np.frombuffer(chunk.dead, np.uint8, k - i, i) == LIVE
        node = np.array(chunk.node[i:k], np.uint32)
        node_ids = cls._reader_node_ids(chunk, nodes)
        if node_ids is not None:
            keep &= ~np.isin(node, np.fromiter(node_ids, np.uint32, len(node_ids)))
        buf, starts, ends = chunk.records(i, k)
        return Span(
            base_seq=chunk.base_seq + i,
            buf=buf,
            starts=starts,
            ends=ends,
            ts=np.array(chunk.ts[i:k], np.int64),
            node=node,
            tag=np.array(chunk.tag[i:k], np.uint32),
            size=np.array(chunk.size[i:k], np.uint32),
            node_names=chunk.node_names.names,
            tag_names=chunk.tag_names.names,
            keep=None if keep.all() else keep,
        )

    @staticmethod
    def _take(
        chunk: Chunk,
        i: int,
        k: int,
        node_ids: frozenset[int] | None,
        per_record: bool,
        runs: list[bytes | memoryview],
        seqs: list[int],
    ) -> None:
        """Deliver live slots [i, k) of ``chunk``, dropping the reader's own node's records."""
        base = chunk.base_seq
        if node_ids is None and not per_record:
            runs.append(chunk.slice(i, k))
            seqs.extend(range(base + i, base + k))
            return
        run_start = None
        for x in range(i, k):
            keep = node_ids is None or chunk.node[x] not in node_ids
            if keep and per_record:
                runs.append(chunk.slice(x, x + 1))
                seqs.append(base + x)
            elif keep:
                if run_start is None:
                    run_start = x
                seqs.append(base + x)
            elif run_start is not None:
                runs.append(chunk.slice(run_start, x))
                run_start = None
        if run_start is not None:
            runs.append(chunk.slice(run_start, k))

    def _loss_between(self, lo: int, hi: int) -> tuple[str, int]:
        """Best-effort reason and size of the involuntary loss inside [lo, hi]."""
        reasons: set[str] = set()
        missed = 0
        for run in self.losses:
            if run.hi < lo or run.lo > hi:
                continue
            reasons.add(run.reason)
            overlap = min(run.hi, hi) - max(run.lo, lo) + 1
            missed += run.lost * overlap // (run.hi - run.lo + 1)
        reason = reasons.pop() if len(reasons) == 1 else "mixed"
        return reason, max(missed, 1)

    # --- chunk addressing -------------------------------------------------------------
    def slot(self, seq: int) -> tuple[Chunk, int] | None:
        """The chunk and index of the live record ``seq``, or None."""
        if seq < self.front or seq >= self.next_seq:
            return None
        index = self._chunk_index(seq)
        if index < 0:
            return None
        chunk = self.chunks[index]
        i = seq - chunk.base_seq
        if i >= chunk.n or chunk.dead[i] == DELETED:
            return None
        return chunk, i

    def _chunk_index(self, seq: int) -> int:
        """The chunk holding ``seq``, or the last one before it (-1: none starts at or
        below ``seq``)."""
        return bisect_right(self._bases, seq) - 1

    def _chunks_from(self, seq: int) -> list[Chunk]:
        """The chunks that may hold ``seq`` or later ones, in order."""
        return self.chunks[max(0, self._chunk_index(seq)) :]

    def _spans(self, lo_seq: int, hi_seq: int):
        """(chunk, lo, hi) index ranges covering seqs [lo_seq, hi_seq]."""
        if hi_seq < lo_seq or not self.chunks:
            return
        for chunk in self._chunks_from(lo_seq):
            if chunk.base_seq > hi_seq:
                return
            lo = max(lo_seq - chunk.base_seq, 0)
            hi = min(hi_seq - chunk.base_seq + 1, chunk.n)
            if lo < hi:
                yield chunk, lo, hi


_size_of = attrgetter("size")
_id_of = attrgetter("id")
_tag_of = attrgetter("tag")
