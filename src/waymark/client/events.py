"""SSE watch streams: event parsing, the resumable cursor and the reconnect policy.

Shared by the sync and async clients; they only feed lines in and sleep.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import urlencode

import msgspec

from ..protocol import ENDPOINT, Record, Tombstone
from .errors import Answer, ApiError
from .http11 import LineSplitter

_record = msgspec.json.Decoder(Record)
_tombstone = msgspec.json.Decoder(Tombstone)


@dataclass(frozen=True, slots=True)
class RecordEvent:
    cursor: str  # "<epoch>:<seq>": resume after this record
    record: Record


@dataclass(frozen=True, slots=True)
class TombstoneEvent:
    cursor: str  # "<epoch>:<$seq - 1>": resume right after the gap
    tombstone: Tombstone


WatchEvent = RecordEvent | TombstoneEvent
E = TypeVar("E")


class Subscription(Generic[E]):
    """One logical subscription across any number of connections.

    It remembers the ``id:`` of the last event handed out and sends it back as
    ``Last-Event-ID`` on reconnect, so no event is delivered twice or skipped.
    """

    def __init__(self, target: str, cursor: str | None, max_retries: int | None,
                 max_backoff_s: float = 5.0) -> None:  # fmt: skip
        self.target = target
        self.cursor = cursor
        self._max_retries = max_retries
        self._max_backoff_s = max_backoff_s
        self._failures = 0
        self._event = ""
        self._id: str | None = None
        self._data: list[str] = []
        self._lines = LineSplitter()

    @property
    def headers(self) -> dict[str, str]:
        headers = {"accept": "text/event-stream"}
        if self.cursor is not None:
            headers["last-event-id"] = self.cursor
        return headers

    def connected(self, response: Answer) -> None:
        """Accept a response whose body (if an error) has been read."""
        if response.status_code != 200:
            raise ApiError.from_response(response)
        self._failures = 0
        # A connection that dropped mid-event leaves a partial one behind: drop it.
        self._event, self._id, self._data = "", None, []
        self._lines = LineSplitter()

    def receive(self, chunk: bytes) -> list[E]:
        """The events a chunk of the stream's body completes."""
        return [event for line in self._lines.feed(chunk) if (event := self.feed(line))]

    def backoff(self, error: Exception) -> float:
        """Seconds to wait before reconnecting after ``error``, or re-raise it."""
        self._failures += 1
        if self._max_retries is not None and self._failures > self._max_retries:
            raise error
        # A dropped connection usually reconnects at once; a dead server backs off.
        return min(self._max_backoff_s, 0.05 * 2 ** (self._failures - 1))

    def complete(self, line: str) -> tuple[str, str | None, str] | None:
        """One line of the stream; ``(event, id, data)`` when a blank line completes an
        event (an in-band ``error`` raises)."""
        if line:
            if line.startswith(":"):
                return None  # a heartbeat comment
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
            elif name == "id":
                self._id = value
            return None
        event, id_, data = self._event, self._id, "\n".join(self._data)
        self._event, self._id, self._data = "", None, []
        if event == "error":
            raise ApiError.from_body(200, data)
        return event, id_, data

    @abstractmethod
    def feed(self, line: str) -> E | None:
        """One line of the stream; returns an event when a blank line completes one."""


class Watch(Subscription[WatchEvent]):
    """A topic's watch: records and tombstones, resumed from ``<epoch>:<seq>``."""

    def __init__(
        self,
        topic: str,
        *,
        from_seq: int,
        node: str | Sequence[str] | None,
        epoch: int | None,
        cursor: str | None,
        max_retries: int | None,
        max_backoff_s: float = 5.0,
    ) -> None:
        params: list[tuple[str, str | int]] = [("from_seq", from_seq)]
        if epoch is not None:
            params.append(("epoch", epoch))
        nodes = [node] if isinstance(node, str) else list(node or ())
        params += [("node", n) for n in nodes]
        target = f"{ENDPOINT['watch'].url(topic=topic)}?{urlencode(params)}"
        super().__init__(target, cursor, max_retries, max_backoff_s)

    def feed(self, line: str) -> WatchEvent | None:
        """One line of the stream; returns an event when a blank line completes one."""
        if (done := self.complete(line)) is None:
            return None
        event, id_, data = done
        if id_ is None or event not in ("record", "tombstone"):
            return None
        self.cursor = id_
        if event == "record":
            return RecordEvent(id_, _record.decode(data))
        return TombstoneEvent(id_, _tombstone.decode(data))
