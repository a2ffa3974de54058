"""``TopicCheckpoints``: a waymark server's change checkpoints as a
:class:`~waymark.recovery.types.CheckpointSource` (docs/semantics/recovery.md §1.5)."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..client import ApiError, Client
from ..protocol import Checkpoint, ErrorCode, Record, TopicState, key_topic
from .types import CheckpointListener, RecoveryError, ServerView

PAGE = 1000  # checkpoints per page of a recovery walk


def check_topics(url: str, topics: Sequence[str], existing: list[str]) -> None:
    """Refuse a filter naming a topic the server does not hold
    (docs/semantics/recovery.md §3.4): every change of the others would count as
    receipted, the ones meant too."""
    for topic in topics:
        if topic not in existing:
            close = difflib.get_close_matches(topic, existing, n=3)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise RecoveryError(
                f"topic {topic!r} of the filter does not exist on {url}{hint}. A filter "
                "passes every change of the topics it does not name as receipted: create "
                "the topic first if it is new"
            )


def refusal(
    key: str, version: int, epoch: int, state: TopicState | None, found: Record[Any] | None
) -> str | None:
    """Why ``version`` of ``key`` in topic instance ``epoch`` cannot be a committed version,
    from its topic's state and the first record at or after that seq (None: it may be;
    docs/semantics/recovery.md §2.1)."""
    topic = key_topic(key)
    if state is None:
        return (f"unknown key {key!r}: no checkpoint this service saw names it, and topic "
                f"{topic!r} does not exist")  # fmt: skip
    if epoch > state.epoch:
        return f"{key!r} has no version in epoch {epoch}: topic {topic!r} is at epoch {state.epoch}"
    if epoch < state.epoch:
        return None  # of an older instance, gone with it: nothing waits for it
    if version > state.head_seq:
        return (f"{key!r} at version {version} of epoch {epoch} is not committed: topic "
                f"{topic!r} has handed out seqs up to {state.head_seq}")  # fmt: skip
    if found is not None and found.seq == version:
        held = topic if found.tag is None else f"{topic}/{found.tag}"
        if held != key:
            return f"unknown key {key!r}: seq {version} of topic {topic!r} holds {held!r}"
    return None  # committed; a deletion or a drop may have removed what it held


class TopicCheckpoints:
    """The checkpoints of the server at ``url``, only the changes of ``topics`` when
    given (a filtered consumer: the other changes count as receipted,
    docs/semantics/recovery.md §3.4)."""

    def __init__(
        self,
        url: str,
        topics: Sequence[str] | None = None,
        *,
        client: Client | None = None,
        token: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        """``token`` and ``ca_file`` go to every connection it opens: its queries' (unless
        ``client`` is given) and each listener's stream (docs/security.md)."""
        self.url = url
        self.topics = list(topics) if topics else None
        self._token, self._ca_file = token, ca_file
        self.client = client or Client(url, token=token, ca_file=ca_file)
        self.bytes_read = 0  # answer bytes of the recovery walks, for the benchmark
        self._watchers: list[Client] = []
        self._closed = threading.Event()
        self._view = ServerView()

    def newest_id(self) -> int:
        for topic in self.topics or ():  # one cheap look each; the list only on a miss
            try:
                self.client.get_topic(topic, touch=False)
            except ApiError as exc:
                if exc.code != ErrorCode.TOPIC_NOT_FOUND:
                    raise
                check_topics(self.url, self.topics or (),
                             [t.name for t in self.client.list_topics()])  # fmt: skip
        page = self.client.list_checkpoints(limit=1)
        self._view = ServerView(page.instance, page.expired_to)
        # (the newest may have expired with the rest: its id is still the newest one)
        return max(page.checkpoints[0].id if page.checkpoints else 0, page.expired_to)

    def view(self) -> ServerView:
        return self._view

    def request_checkpoints(self, earliest_ms: int) -> Iterator[Checkpoint]:
        before: int | None = None
        while True:
            page = self.client.list_checkpoints(
                earliest_ms=earliest_ms, before=before, limit=PAGE, topics=self.topics
            )
            self._view = ServerView(page.instance, page.expired_to, page.older)
            yield from page.checkpoints
            if page.next_before is None:
                return
            before = page.next_before

    def committed(self, key: str, version: int, epoch: int) -> str | None:
        topic = key_topic(key)
        try:
            state = self.client.get_topic(topic, touch=False)
        except ApiError as exc:
            if exc.code != ErrorCode.TOPIC_NOT_FOUND:
                raise
            return refusal(key, version, epoch, None, None)
        page = self.client.diff(topic, version - 1, limit=1) if version <= state.head_seq else None
        found = page.records[0] if page is not None and page.records else None
        return refusal(key, version, epoch, state, found)

    def register_checkpoint_listener(
        self,
        listener: CheckpointListener,
        after: int,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Follow new checkpoints on a daemon thread, over SSE, until :meth:`close`;
        what ends it otherwise goes to ``on_error`` (else it is raised in the thread)."""
        watcher = Client(self.url, token=self._token, ca_file=self._ca_file)
        self._watchers.append(watcher)

        def follow() -> None:
            try:
                for checkpoint in watcher.watch_checkpoints(after=after, topics=self.topics):
                    listener(checkpoint)
            except Exception as exc:
                if self._closed.is_set():
                    return
                if on_error is None:
                    raise
                on_error(exc)

        threading.Thread(target=follow, name="waymark-checkpoints", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        for watcher in self._watchers:
            watcher.close()
        self.client.close()
