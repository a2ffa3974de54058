"""Source offsets: per topic, the topic instance epoch and the seq cursor.

An offset is ``{"<topic>": {"epoch": E, "seq": S}}``: every record of topic
instance ``E`` with ``$seq <= S`` has been handed to Spark (``S`` is the
exclusive lower bound of the next read, the log's own cursor convention,
docs/semantics/topics.md §4.3). Carrying the epoch is what makes a deleted-and-recreated
topic visible (docs/semantics/topics.md §5.5): its new instance has a new epoch, so a
checkpointed offset can never be read as if it continued into it. Epoch 0 names a
topic that did not exist yet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

EARLIEST = -2  # Kafka's spelling, accepted in startingOffsets JSON
LATEST = -1


@dataclass(frozen=True, slots=True)
class TopicOffset:
    epoch: int
    seq: int

    def to_json(self) -> dict[str, int]:
        return {"epoch": self.epoch, "seq": self.seq}

    @classmethod
    def from_json(cls, value: dict[str, int]) -> TopicOffset:
        return cls(int(value["epoch"]), int(value["seq"]))


Offsets = dict[str, TopicOffset]


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    return {topic: offsets[topic].to_json() for topic in sorted(offsets)}


def from_json(value: dict[str, dict[str, int]]) -> Offsets:
    return {topic: TopicOffset.from_json(v) for topic, v in value.items()}


def parse_topics(option: str | None) -> list[str]:
    topics = [t.strip() for t in (option or "").split(",") if t.strip()]
    if not topics:
        raise ValueError("the waymark source needs option 'topics' (a comma-separated list)")
    if len(set(topics)) != len(topics):
        raise ValueError(f"option 'topics' names a topic twice: {option!r}")
    return topics


def parse_starting(option: str | None, topics: list[str]) -> dict[str, TopicOffset | int]:
    """``startingOffsets``: ``earliest`` (default) | ``latest`` | JSON per topic.

    JSON values are ``-2`` (earliest), ``-1`` (latest) or ``{"epoch": E, "seq": S}``
    (continue after seq S of instance E; an epoch that no longer exists is a
    recreate and follows onDataLoss). Topics the JSON does not name start at earliest.
    """
    text = (option or "earliest").strip()
    if text == "earliest":
        return dict.fromkeys(topics, EARLIEST)
    if text == "latest":
        return dict.fromkeys(topics, LATEST)
    try:
        given = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"startingOffsets is earliest, latest or JSON per topic: {e}") from e
    if not isinstance(given, dict):
        raise ValueError("startingOffsets JSON is an object keyed by topic")
    unknown = set(given) - set(topics)
    if unknown:
        raise ValueError(f"startingOffsets names topics not in 'topics': {sorted(unknown)}")
    out: dict[str, TopicOffset | int] = {}
    for topic in topics:
        value = given.get(topic, EARLIEST)
        if value in (EARLIEST, LATEST):
            out[topic] = value
        elif isinstance(value, dict) and {"epoch", "seq"} <= set(value):
            out[topic] = TopicOffset.from_json(value)
        else:
            raise ValueError(
                f'startingOffsets[{topic!r}] is -2, -1 or {{"epoch": E, "seq": S}}: {value!r}'
            )
    return out


def admit(backlog: dict[str, int], max_rows: int | None) -> dict[str, int]:
    """How many seqs each topic may advance in one batch under ``max_rows``.

    Seqs are an upper bound on rows (deleted and node-filtered seqs yield no row),
    so a batch never exceeds ``max_rows``. The budget is shared fairly: every
    topic with a backlog gets an equal share, and what a small backlog leaves
    unused goes to the others, so no topic starves behind a busy one.
    """
    if max_rows is None:
        return dict(backlog)
    grant = dict.fromkeys(backlog, 0)
    budget = max_rows
    # Water-filling, smallest need first: each topic takes min(need, an equal share
    # of what is left), so what small backlogs leave unused flows to the larger ones.
    waiting = sorted((t for t, n in backlog.items() if n > 0), key=lambda t: (backlog[t], t))
    while waiting and budget > 0:
        share = budget // len(waiting)
        if share == 0:
            for topic in waiting[:budget]:
                grant[topic] += 1
            break
        topic = waiting.pop(0)
        grant[topic] = min(share, backlog[topic])
        budget -= grant[topic]
    return grant
