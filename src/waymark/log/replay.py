"""Rebuild an engine's topics from journal frames, in the order they were written.

Pure: frames in, engine state out. Each frame is decoded once into its typed form
(:func:`waymark.log.journal.decode`) and applied by a match on that type, through
the same topic methods as live mutations, each at the time it first happened (frames
carry it), so eviction, TTL expiry, deletion and dedupe state come out exactly as
they were.

An engine that tracks changes (``engine.changes``) notes every replayed append,
deletion and drop again, as the live mutation did, and every replayed checkpoint's
coverage: the next checkpoint names what no checkpoint before the crash named
(docs/semantics/recovery.md §1.6).
"""

from __future__ import annotations

from msgspec import UNSET

from .changes import CHANGES_TOPIC, coverage_of, deleted_keys, dropped_keys
from .engine import Engine
from .journal import (
    DeleteFrame,
    DropFrame,
    HeadFrame,
    RecordsFrame,
    RouterFrame,
    TopicFrame,
    WriterFrame,
    decode,
)
from .storage.frames import Frame
from .topic import AppendPlan, Topic


def apply_frame(engine: Engine, frame: Frame) -> None:
    kernel = engine.kernel
    entry = decode(frame)
    match entry:
        case RecordsFrame():
            topic = kernel.get(entry.name)
            if topic is None or topic.epoch != entry.epoch:
                return  # written for an instance that was dropped later
            topic.skip_to(entry.first_seq)
            # What the append's plan did first: expire at its time, so a record the TTL
            # took then is not replayed as one the cap evicts now.
            topic.expire(entry.now)
            fresh = entry.records
            seqs = list(range(entry.first_seq, entry.first_seq + len(fresh)))
            plan = AppendPlan(fresh, seqs, entry.first_seq, entry.ts, sum(r.size for r in fresh))
            topic.apply_append(plan, entry.now)
            topic.settle_front()  # after a hole, the front moves past it
            if engine.changes is not None:
                if entry.name == CHANGES_TOPIC:
                    engine.changes.cover(coverage_of(fresh))
                elif (changes := engine.changes_of(topic)) is not None:
                    changes.replayed().appended(entry.name, entry.epoch, entry.first_seq, fresh,
                                                None)  # fmt: skip
            if entry.publish is not None:
                engine.writers.restore_published(entry.name, entry.publish, entry.first_seq,
                                                 len(fresh))  # fmt: skip
        case WriterFrame():
            engine.writers.restore_writer(entry.writer, entry.epoch)
        case RouterFrame():
            engine.routers.replay(entry.router, entry.definition)
        case TopicFrame():
            topic = kernel.get(entry.name)
            if topic is None or topic.epoch != entry.epoch:
                # Shards replay one after another: epochs arrive out of order across
                # them, and registering keeps the highest.
                kernel.register(Topic(entry.name, entry.type, entry.config, entry.epoch,
                                      entry.created_ts))  # fmt: skip
            else:
                topic.reconfigure(entry.config, _when(engine, entry.now))
        case DropFrame():
            topic = kernel.get(entry.name)
            if topic is not None and topic.epoch == entry.epoch:
                if topic.head_seq > 0 and (changes := engine.changes_of(topic)) is not None:
                    # The version the live drop was named at (older frames: the next
                    # seq replay reached, which a restart's move past a lead may pass).
                    version = topic.next_seq if entry.next_seq is UNSET else entry.next_seq
                    changes.replayed().removed(topic, dropped_keys(topic), version, None)
                kernel.drop(entry.name)
                engine.routers.topic_dropped(entry.name, entry.epoch)
        case HeadFrame():
            topic = kernel.get(entry.name)
            if topic is not None and topic.epoch == entry.epoch:
                moved = None if entry.next_seq is UNSET else entry.next_seq
                topic.replay_ceiling(entry.ceiling, moved)
        case DeleteFrame():
            topic = kernel.get(entry.name)
            if topic is None or topic.epoch != entry.epoch:
                return
            now = _when(engine, entry.now)
            if entry.seqs is not UNSET:
                topic.delete_seqs(entry.seqs, now)
                return
            slot = None
            if entry.slot is not UNSET and entry.slot >= topic.next_seq:
                topic.skip_to(entry.slot)
                slot = entry.slot
            changes = engine.changes_of(topic) if slot is not None else None
            keys = deleted_keys(topic, entry.bound, entry.selector) if changes is not None else None
            topic.delete(entry.bound, entry.selector, now, slot)
            if changes is not None and slot is not None and keys:
                changes.replayed().removed(topic, keys, slot, None)


def _when(engine: Engine, now: int | None) -> int:
    # When the mutation first happened: replaying at today's time would apply old TTLs
    # to records that, back then, were not yet expired (or were already deleted).
    return now or engine.clock.now_ms()


def finish(engine: Engine) -> list[HeadFrame]:
    """After the last frame: never reuse a seq that may have been handed out.

    The rule is each topic's own (:meth:`Topic.replayed`). Returns the frames to
    journal before anything else: the fsync topics moved past a lead without a loss.
    """
    engine.routers.settle_replayed()
    return [moved for topic in engine.kernel.topics() if (moved := topic.replayed())]
