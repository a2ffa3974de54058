"""Which topics a source reads: ``subscribe`` (a comma-separated list) or
``subscribePattern`` (a regular expression), as in Spark's Kafka connector
(docs/spark.md, "Options").

A pattern is a Python regular expression that must match a topic's whole name
(``re.fullmatch``: Kafka's Java pattern is matched whole too); the topics are listed
again before every micro-batch, so a topic created later is read from its start.
The source's own gaps topic is never matched, so that a gap's report is not read
back as data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .options import EDGE, SUBSCRIBE, SUBSCRIBE_PATTERN


@dataclass(frozen=True)
class SourceSubscription:
    topics: tuple[str, ...] | None  # subscribe: these, in this order
    pattern: re.Pattern[str] | None  # subscribePattern
    gaps_topic: str

    def accepts(self, topic: str) -> bool:
        if self.topics is not None:
            return topic in self.topics
        assert self.pattern is not None
        return topic != self.gaps_topic and self.pattern.fullmatch(topic) is not None


def parse_subscription(options: Mapping[str, str], gaps_topic: str) -> SourceSubscription:
    """Exactly one of ``subscribe`` and ``subscribePattern`` (the caller has ruled out
    ``edge``)."""
    listed, pattern = options.get(SUBSCRIBE), options.get(SUBSCRIBE_PATTERN)
    if (listed is None) == (pattern is None):
        raise ValueError(
            f"the waymark source reads exactly one of option {SUBSCRIBE!r} (a comma-separated "
            f"list of topics), {SUBSCRIBE_PATTERN!r} (a regular expression matching whole "
            f"topic names) and {EDGE!r} (a pipeline edge's name)"
        )
    if pattern is not None:
        try:
            return SourceSubscription(None, re.compile(pattern), gaps_topic)
        except re.error as e:
            message = f"option {SUBSCRIBE_PATTERN!r} is not a regular expression: {e}"
            raise ValueError(message) from e
    topics = [t.strip() for t in (listed or "").split(",") if t.strip()]
    if not topics:
        raise ValueError(f"option {SUBSCRIBE!r} names no topic (a comma-separated list)")
    if len(set(topics)) != len(topics):
        raise ValueError(f"option {SUBSCRIBE!r} names a topic twice: {listed!r}")
    return SourceSubscription(tuple(topics), None, gaps_topic)
