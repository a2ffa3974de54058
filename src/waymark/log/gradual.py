"""Gradual replay of ``memory``-class topics: it never blocks readiness
(docs/semantics/topics.md §2.2).

While recovery reads the WAL, the frames of memory topics are set aside per topic
(offsets into the file bytes already read, not decoded records); control frames
that create or drop a topic still apply at once, so every topic exists with its
config before the server listens. The set-aside frames are then applied a step at
a time (:meth:`GradualReplay.step`, or one topic's with :meth:`~GradualReplay.step_topic`,
which the server schedules between requests by the topics' priority), each topic's in
the order they were written.

Anything that uses a topic first applies what is left of it
(:meth:`GradualReplay.finish`, called by the engine), so no record is appended
before an older one or read before it arrived. Only a topic's state may be looked
at mid-way: it then says ``recovering``, and its counts are those applied so far.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import TYPE_CHECKING

import msgspec

from ..protocol import Durability, TopicConfig, TopicState, TopicType
from .journal import TopicFrame, decode, frame_topic
from .priority import effective_priority
from .replay import apply_frame
from .storage.frames import Frame, FrameKind, frame_at

if TYPE_CHECKING:
    from .engine import Engine
    from .topic import Topic

# Frame bytes applied per step: a few milliseconds of work between two requests.
STEP_BYTES = 256 * 1024


class _Backlog:
    """One topic instance's set-aside frames, oldest first."""

    __slots__ = ("config", "epoch", "files", "frames", "next")

    def __init__(self, epoch: int, config: TopicConfig) -> None:
        self.epoch = epoch
        self.config = config  # the latest config among its frames: the one its state shows
        self.files: deque[tuple[bytes, array[int]]] = deque()  # (file bytes, frame offsets)
        self.next = 0  # the next frame's index in files[0]
        self.frames = 0

    def add(self, data: bytes, offset: int) -> None:
        if not self.files or self.files[-1][0] is not data:
            self.files.append((data, array("Q")))
        self.files[-1][1].append(offset)
        self.frames += 1

    def pop(self) -> Frame | None:
        if not self.files:
            return None
        data, offsets = self.files[0]
        frame = frame_at(data, offsets[self.next])
        self.next += 1
        self.frames -= 1
        if self.next == len(offsets):
            self.files.popleft()  # and with it the file's bytes, once no backlog needs them
            self.next = 0
        return frame


class GradualReplay:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._backlogs: dict[str, _Backlog] = {}  # in the order their first frame was read

    # --- while recovery reads the WAL ------------------------------------------------
    def set_aside(self, data: bytes, frame: Frame) -> bool:
        """Keep ``frame`` (read from ``data``) for later if it belongs to a memory
        topic's backlog; False: recovery applies it now."""
        kind = frame.kind
        instance = frame_topic(frame)
        if instance is None:
            return False  # a sink writer's epoch, a router definition: not one topic's
        name, epoch = instance
        backlog = self._backlogs.get(name)
        if backlog is None:
            # A backlog starts with a memory topic's first records; what came before
            # them (its creation, deletions of records from the seal) applies now.
            topic = self._engine.kernel.get(name)
            if (kind is not FrameKind.RECORDS or topic is None or topic.epoch != epoch
                    or topic.config.durability is not Durability.MEMORY):  # fmt: skip
                return False
            backlog = self._backlogs[name] = _Backlog(epoch, topic.config)
        elif (kind is FrameKind.DROP and epoch == backlog.epoch) or (
            kind is FrameKind.TOPIC and epoch != backlog.epoch
        ):
            # The instance is dropped or replaced by a new one: its frames never apply,
            # unless changes are tracked: the drop is a change of every key the
            # instance had, those frames' included (docs/semantics/recovery.md §1.6).
            if self._engine.changes is not None:
                self.finish(name)
            else:
                del self._backlogs[name]
            return False
        elif epoch != backlog.epoch:
            return False  # written for an older instance: replay ignores it
        elif kind is FrameKind.TOPIC:
            entry = decode(frame)
            assert isinstance(entry, TopicFrame)
            backlog.config = entry.config
        backlog.add(data, frame.offset)
        return True

    def settle(self) -> None:
        """After the last frame: a topic whose class is no longer ``memory`` recovers
        whole before readiness, like every disk and fsync topic; so does one a router
        reads or writes, whose recovery resumes from what both ends hold."""
        routed = {end for router in self._engine.routers.list()
                  for end in (router.source, router.dest)}  # fmt: skip
        for name, backlog in list(self._backlogs.items()):
            if backlog.config.durability is not Durability.MEMORY or name in routed:
                self.finish(name)
        self._done()

    # --- afterwards -------------------------------------------------------------------
    @property
    def topics(self) -> int:
        """Topics still recovering."""
        return len(self._backlogs)

    @property
    def frames(self) -> int:
        """Set-aside frames not applied yet."""
        return sum(backlog.frames for backlog in self._backlogs.values())

    def holds(self, topic: Topic) -> bool:
        backlog = self._backlogs.get(topic.name)
        return backlog is not None and backlog.epoch == topic.epoch

    def step(self, max_bytes: int = STEP_BYTES) -> bool:
        """Apply about ``max_bytes`` of set-aside frames, oldest topic first; True
        while some are left."""
        spent = 0
        while spent < max_bytes and self._backlogs:
            name, backlog = next(iter(self._backlogs.items()))
            spent += self._apply(name, backlog, max_bytes - spent)
            if not backlog.frames:
                self._backlogs.pop(name, None)
        self._done()
        return bool(self._backlogs)

    def names(self) -> list[str]:
        """The topics still recovering, in the order their first frame was read."""
        return list(self._backlogs)

    def step_topic(self, name: str, max_bytes: int = STEP_BYTES) -> bool:
        """Apply about ``max_bytes`` of ``name``'s set-aside frames; True while some of
        them are left. The server schedules these steps by the topics' priority."""
        backlog = self._backlogs.get(name)
        if backlog is None:
            return False
        self._apply(name, backlog, max_bytes)
        if not backlog.frames:
            self._backlogs.pop(name, None)
        self._done()
        return name in self._backlogs

    def finish(self, name: str) -> None:
        """Apply what is left of ``name``'s backlog: the topic is about to be used."""
        backlog = self._backlogs.pop(name, None)
        if backlog is not None:
            self._apply(name, backlog, None)
            self._done()

    def finish_all(self) -> None:
        for name in list(self._backlogs):
            self.finish(name)

    def config(self, topic: Topic) -> TopicConfig:
        """The latest config among a recovering topic's frames: the one it recovers to."""
        return self._backlogs[topic.name].config

    def state(self, topic: Topic, now: int) -> TopicState:
        """A recovering topic's state: its latest config, the counts applied so far."""
        config = self.config(topic)
        # Observed at time 0, where no TTL takes anything: expiring now, under the
        # config applied so far, could remove records a later config keeps.
        state = topic.state(0)
        priority = effective_priority(config.priority, config.auto_priority, now,
                                      topic.last_consumed_at, topic.enqueued_at)  # fmt: skip
        return msgspec.structs.replace(
            state, config=config.view(topic.type is TopicType.QUEUE),
            durability=config.durability, effective_priority=priority, recovering=True,
        )  # fmt: skip

    def _apply(self, name: str, backlog: _Backlog, max_bytes: int | None) -> int:
        """Apply ``backlog``'s frames in order (up to about ``max_bytes``); returns the
        bytes applied. Each frame leaves the backlog before it applies, so a nested
        :meth:`finish` of the same topic can never apply one twice."""
        engine = self._engine
        spent = 0
        while max_bytes is None or spent < max_bytes:
            topic = engine.kernel.get(name)
            if topic is None or topic.epoch != backlog.epoch:
                backlog.files.clear()  # the instance was dropped meanwhile: nothing applies
                backlog.frames = 0
                return spent
            frame = backlog.pop()
            if frame is None:
                return spent
            apply_frame(engine, frame)
            spent += len(frame.payload)
        return spent

    def _done(self) -> None:
        if not self._backlogs and self._engine.replaying is self:
            self._engine.replaying = None  # the engine's hooks cost nothing from now on
