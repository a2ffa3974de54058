"""Append-rate history: each topic's head seq and bytes sampled over the last half hour,
kept by the server so a console reload (or a second browser) sees the same charts
(docs/console.md, "Rate history").

Sampling is driven by change, not by listing topics: the engine's commit listener
marks a topic, and each tick samples only the marked ones. A topic that goes quiet
gets no samples until it changes again; its series then gains a point at the tick
before, holding the old values, so a rate computed between consecutive points is
exact: zero through the quiet stretch, the whole burst in the interval it happened.

Memory is bounded: ``keep`` points per topic (flat ``array('q')``, three integers a
point) and ``max_topics`` topics, the least recently changed dropped first. It lives
in memory only: a restart starts the history again.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable

from ..protocol.topics import TopicHistory

DEFAULT_INTERVAL_MS = 5_000
DEFAULT_KEEP = 360  # half an hour at 5 s
DEFAULT_MAX_TOPICS = 500

# What a tick needs of a topic: (epoch, head_seq, bytes), or None once it is gone.
Read = Callable[[str], "tuple[int, int, int] | None"]


class _Series:
    __slots__ = ("epoch", "points")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.points = array("q")  # t_ms, head_seq, bytes, t_ms, ...


class AppendHistory:
    """Per-topic samples of (time, head seq, bytes); pure: the caller brings the time
    and a way to read a topic, so tests drive it with a manual clock."""

    def __init__(
        self,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        keep: int = DEFAULT_KEEP,
        max_topics: int = DEFAULT_MAX_TOPICS,
    ) -> None:
        if interval_ms <= 0 or keep < 2 or max_topics < 1:
            raise ValueError("interval_ms > 0, keep >= 2 and max_topics >= 1")
        self.interval_ms, self.keep, self.max_topics = interval_ms, keep, max_topics
        self._changed: set[str] = set()
        self._series: OrderedDict[str, _Series] = OrderedDict()  # least recent first

    def changed(self, topic: str) -> None:
        """The engine's commit listener: ``topic`` changed since the last tick."""
        self._changed.add(topic)

    def tick(self, now_ms: int, read: Read) -> None:
        """Sample every topic that changed since the last tick."""
        changed, self._changed = self._changed, set()
        for topic in changed:
            state = read(topic)
            if state is None:  # deleted: its history goes with it
                self._series.pop(topic, None)
                continue
            epoch, head, size = state
            series = self._series.get(topic)
            if series is None or series.epoch != epoch:  # new, or deleted and recreated
                series = self._series[topic] = _Series(epoch)
            self._series.move_to_end(topic)
            points = series.points
            if points and points[-3] < now_ms - self.interval_ms:
                # Quiet since its last point: hold the old values up to the tick before.
                points.extend((now_ms - self.interval_ms, points[-2], points[-1]))
            points.extend((now_ms, head, size))
            if len(points) >= 6 * self.keep:  # trimmed in bulk: amortised O(1) a point
                del points[: len(points) - 3 * self.keep]
        while len(self._series) > self.max_topics:
            self._series.popitem(last=False)

    def sampled(self) -> list[str]:
        """The topics with a history, the one that changed least recently first: at most
        ``max_topics``."""
        return list(self._series)

    @property
    def points_held(self) -> int:
        """Samples held in memory over all topics: under ``2 * keep`` per topic."""
        return sum(len(s.points) for s in self._series.values()) // 3

    def of(self, topic: str, epoch: int, now_ms: int, head: int, size: int) -> TopicHistory:
        """The topic's samples, oldest first, ending with its values now (``head`` and
        ``size``); none from another instance of the name."""
        series = self._series.get(topic)
        flat = series.points[-3 * self.keep :] if series and series.epoch == epoch else ()
        samples = [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
        if samples and samples[-1][0] < now_ms - self.interval_ms:
            samples.append((now_ms - self.interval_ms, samples[-1][1], samples[-1][2]))
        if not samples or samples[-1][0] < now_ms:
            samples.append((now_ms, head, size))
        return TopicHistory(topic, epoch, self.interval_ms, samples)
