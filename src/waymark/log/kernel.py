"""The engine kernel: the one internal API over the topic table.

It owns the topics, the epochs that name topic instances, the journal the frames go
to, what memory recovery still holds back, and the listeners woken by each commit.
The engine and its parts (queues, routers, writers, replay, sealing, restore) reach
topics only through it; none of them touches another object's private state
(docs/architecture.md#the-engine-kernel).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, KeysView
from typing import TYPE_CHECKING

from .errors import ErrorCode, TopicError
from .journal import Commit, Journal, TopicFrame
from .records import check_topic_name
from .topic import Topic

if TYPE_CHECKING:
    from .gradual import GradualReplay

Listener = Callable[[str], None]


class Kernel:
    def __init__(self, journal: Journal | None = None) -> None:
        self.journal = journal
        # memory topics whose WAL frames replay set aside; applied before any use
        # (docs/semantics/topics.md §2.2)
        self.replaying: GradualReplay | None = None
        self._topics: dict[str, Topic] = {}
        self._user_topics = 0  # kept with the table: the topic limit is checked per create
        self._last_epoch = 0  # topic-instance epochs are unique for the engine's life
        self._listeners: list[Listener] = []

    # --- the topic table ----------------------------------------------------------------
    def get(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._topics

    def __len__(self) -> int:
        return len(self._topics)

    @property
    def user_topics(self) -> int:
        """Topics other than internal logs (a queue's leases, the change checkpoints:
        names with ``$``, which no request can reach)."""
        return self._user_topics

    def names(self) -> KeysView[str]:
        return self._topics.keys()

    def topics(self) -> Iterable[Topic]:
        return self._topics.values()

    def existing(self, name: str, *, replay: bool = True) -> Topic:
        """The topic ``name`` (404 topic_not_found); ``replay`` first applies what
        gradual replay holds back for it."""
        if replay and self.replaying is not None:
            self.replaying.finish(name)
        topic = self._topics.get(name)
        if topic is None:
            check_topic_name(name)
            raise TopicError(
                ErrorCode.TOPIC_NOT_FOUND, f"topic {name!r} does not exist", {"topic": name}
            )
        return topic

    def finish_replay(self, name: str) -> None:
        """Apply what gradual replay set aside for ``name`` before it is used, so
        nothing is appended or read out of order."""
        if self.replaying is not None:
            self.replaying.finish(name)

    # --- epochs -------------------------------------------------------------------------
    @property
    def last_epoch(self) -> int:
        return self._last_epoch

    def next_epoch(self) -> int:
        """The epoch of the next topic instance."""
        return self._last_epoch + 1

    def register(self, topic: Topic) -> None:
        """Add ``topic`` to the table. Its epoch counts as used: replay meets epochs out
        of order across WAL shards, so the highest stays the last."""
        self._last_epoch = max(self._last_epoch, topic.epoch)
        if topic.name not in self._topics and "$" not in topic.name:
            self._user_topics += 1
        self._topics[topic.name] = topic

    def restore_epoch(self, last_epoch: int) -> None:
        """The last epoch a snapshot recorded (its topics may since have been dropped)."""
        self._last_epoch = max(self._last_epoch, last_epoch)

    def create(self, topic: Topic) -> None:
        """Journal and register a new topic instance."""
        self.write_topic(topic)
        self.register(topic)

    def drop(self, name: str) -> Topic | None:
        """Remove ``name`` from the table (the caller journals the drop)."""
        topic = self._topics.pop(name, None)
        if topic is not None and "$" not in name:
            self._user_topics -= 1
        return topic

    # --- the journal --------------------------------------------------------------------
    def write(self, name: str, frame: bytes | list[bytes]) -> Commit | None:
        """Journal ``frame`` for ``name``; the commit that makes it durable (None in memory)."""
        return self.journal.write(name, frame) if self.journal is not None else None

    def write_topic(self, topic: Topic) -> None:
        """Journal ``topic``'s creation (its config as of its creation time)."""
        self.write(
            topic.name,
            TopicFrame.of(topic.name, topic.type, topic.epoch, topic.config, topic.created_ts,
                          now=topic.created_ts).encode(),
        )  # fmt: skip

    def latest(self, name: str) -> Commit | None:
        """The journal commit covering every frame of ``name`` so far (None in memory)."""
        return self.journal.latest(name) if self.journal is not None else None

    def sync_ms(self, name: str) -> int:
        """How long making ``name``'s frames durable takes lately, in ms (0 in memory)."""
        return self.journal.sync_ms(name) if self.journal is not None else 0

    # --- listeners ----------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def commit(self, topic: Topic) -> None:
        """The single commit point: every applied mutation passes here."""
        for listener in self._listeners:
            listener(topic.name)
