"""Rebuild an engine's topics from journal frames, in the order they were written.

Pure: frames in, engine state out. Replay goes through the same topic methods as
live mutations, each at the time it first happened (frames carry it), so eviction,
TTL expiry, deletion and dedupe state come out exactly as they were.
"""

from __future__ import annotations

from ..protocol import Durability, TopicType
from .deletion import TagMatch
from .engine import Engine
from .journal import decode_config, decode_json, decode_records
from .storage.frames import Frame, FrameKind
from .topic import AppendPlan, Hole, Topic


def apply_frame(engine: Engine, frame: Frame) -> None:
    topics = engine._topics
    if frame.kind is FrameKind.RECORDS:
        records = decode_records(frame.payload)
        topic = topics.get(records.name)
        if topic is None or topic.epoch != records.epoch:
            return  # written for an instance that was dropped later
        if records.first_seq > topic.next_seq:
            # The seqs in between were acknowledged before a crash and never landed.
            topic.holes.append(Hole(topic.next_seq, records.first_seq - 1))
            topic.next_seq = records.first_seq
        # What the append's plan did first: expire at its time, so a record the TTL
        # took then is not replayed as one the cap evicts now.
        topic.expire(records.now)
        fresh = records.records
        seqs = list(range(records.first_seq, records.first_seq + len(fresh)))
        plan = AppendPlan(fresh, seqs, records.first_seq, records.ts, sum(r.size for r in fresh))
        topic.apply_append(plan, records.now)
        topic._settle_front()  # after a hole, the front moves past it
        if records.extra and "publish" in records.extra:
            writer, batch_id = records.extra["publish"]
            engine.staging.restore_published(
                records.name, writer, batch_id, records.first_seq, len(fresh)
            )
        return
    body = decode_json(frame.payload)
    # When the mutation first happened: replaying at today's time would apply old TTLs
    # to records that, back then, were not yet expired (or were already deleted).
    now = body.get("now") or engine.clock.now_ms()
    if frame.kind is FrameKind.WRITER:
        engine.staging.restore_writer(body["writer"], body["epoch"])
        return
    if frame.kind is FrameKind.ROUTER:
        engine.routers.replay(body)
        return
    topic = topics.get(body["name"])
    if frame.kind is FrameKind.TOPIC:
        config = decode_config(body["config"])
        if topic is None or topic.epoch != body["epoch"]:
            topic = Topic(body["name"], TopicType(body["type"]), config, body["epoch"],
                          body["created_ts"])  # fmt: skip
            highest = engine._last_epoch
            engine._register(topic)
            # Shards replay one after another: epochs arrive out of order across them.
            engine._last_epoch = max(highest, topic.epoch)
        else:
            topic.reconfigure(config, now)
        return
    if topic is None or topic.epoch != body["epoch"]:
        return
    if frame.kind is FrameKind.DROP:
        del topics[body["name"]]
        engine.routers.topic_dropped(body["name"], body["epoch"])
    elif frame.kind is FrameKind.HEAD:
        topic.ceiling = body["ceiling"]
    elif frame.kind is FrameKind.DELETE and "seqs" in body:
        topic.delete_seqs(body["seqs"], now)
    elif frame.kind is FrameKind.DELETE:
        match = body["match"]
        selector = None if match is None else TagMatch(match[0], match[1])
        topic.delete(body["bound"], selector, now)


def finish(engine: Engine) -> None:
    """After the last frame: never reuse a seq that may have been handed out.

    Seqs between the last recovered record and the ceiling may belong to records
    that were acknowledged (disk) or shown to readers (ephemeral) and then lost: a
    reader crossing them gets a ``lost`` tombstone. An fsync topic lost nothing a
    producer or reader saw, so it just moves past them. An ephemeral topic comes
    back empty whatever a checkpoint knew of it (docs/semantics/topics.md §2.2).
    """
    engine.routers.settle_recovered()
    for topic in engine._topics.values():
        durability = topic.config.durability
        # (memory topics carry no ceiling: their head may regress, docs/semantics/topics.md §2.2)
        if durability is Durability.EPHEMERAL:
            topic.lose_resident_records()
        elif durability is not Durability.MEMORY and topic.ceiling >= topic.next_seq:
            if durability is not Durability.FSYNC:
                topic.holes.append(Hole(topic.next_seq, topic.ceiling))
            topic.next_seq = topic.ceiling + 1
            topic._settle_front()
        # Restarted, a topic is idle: its next ceiling leads by what it hands out from here.
        topic.idle_from = topic.reserved_from = topic.head_seq
        topic.durable_ceiling = topic.ceiling  # read back from disk
