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
from collections.abc import Callable
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


@dataclass(frozen=True, slots=True)
class FromSeq:
    """A position given as a seq, Kafka's way: the first seq to read (``startingOffsets``)
    or the first seq not to read (``endingOffsets``), in whichever instance of the topic
    exists when the query resolves it. As a cursor: ``seq - 1``."""

    seq: int


Position = int | TopicOffset | FromSeq  # EARLIEST, LATEST, an exact cursor, or a seq


@dataclass(frozen=True, slots=True)
class Positions:
    """``startingOffsets`` or ``endingOffsets``: a position per topic named in its JSON,
    ``default`` for every other topic (a topic a pattern finds later included)."""

    default: int
    given: dict[str, Position]

    def of(self, topic: str) -> Position:
        return self.given.get(topic, self.default)


def parse_positions(
    name: str, option: str | None, default: int, accepts: Callable[[str], bool]
) -> Positions:
    """``startingOffsets`` / ``endingOffsets``: ``earliest`` | ``latest`` | JSON per topic.

    JSON values are ``-2`` (earliest), ``-1`` (latest), a seq ``n >= 1`` as Kafka gives
    an offset (start: read from seq n on; end: read the seqs below n), or
    ``{"epoch": E, "seq": S}``, an exact cursor as Spark's offset log holds it (after
    seq S of instance E; an instance that no longer exists is a recreate and follows
    ``failOnDataLoss``). Topics the JSON does not name take ``default``.
    """
    text = (option or ("earliest" if default == EARLIEST else "latest")).strip()
    if text.lower() == "earliest":
        return Positions(EARLIEST, {})
    if text.lower() == "latest":
        return Positions(LATEST, {})
    try:
        given = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is earliest, latest or JSON per topic: {e}") from e
    if not isinstance(given, dict):
        raise ValueError(f'{name} JSON is an object keyed by topic, like {{"clicks": 23}}')
    unknown = sorted(t for t in given if not accepts(t))
    if unknown:
        raise ValueError(f"{name} names topics the query does not subscribe to: {unknown}")
    out: dict[str, Position] = {}
    for topic, value in given.items():
        if value in (EARLIEST, LATEST):
            out[topic] = value
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            out[topic] = FromSeq(value)
        elif isinstance(value, dict) and set(value) == {"epoch", "seq"}:
            out[topic] = TopicOffset.from_json(value)
        else:
            raise ValueError(
                f"{name}[{topic!r}] is -2 (earliest), -1 (latest), a seq n >= 1 or "
                f'{{"epoch": E, "seq": S}}: {value!r}'
            )
    return Positions(default, out)


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
