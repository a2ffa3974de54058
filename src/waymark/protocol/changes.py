"""Change checkpoints: the server's statements of what it committed
(docs/semantics/recovery.md §1).

A change checkpoint names, for one commit interval that committed anything, every
key changed in it with the first and the last version committed in that interval. A
key is ``"<topic>/<tag>"`` for a tagged record and ``"<topic>"`` for an untagged one;
a version is a seq of the key's topic instance, named by its epoch. Ids increase
strictly and are never reused, also across restarts.
"""

from __future__ import annotations

from msgspec import Struct, field

# (topic, epoch, seq): every change of ``topic`` up to ``(epoch, seq)`` is named by this
# checkpoint or an older one (docs/semantics/recovery.md §1.6).
Covered = tuple[str, int, int]


class KeyChange(Struct, array_like=True, frozen=True):
    """One key of a checkpoint: ``[key, first, last, epoch]`` on the wire (compact: a
    checkpoint of 10k keys is one array of small arrays). A version is a seq of the
    topic instance ``epoch``; a key's versions are ordered by ``(epoch, version)``
    (docs/semantics/recovery.md §1.1)."""

    key: str
    first: int  # the first version of the key committed in the interval
    last: int  # the last one; a deletion's version is the seq it took, a drop's the next
    epoch: int  # the topic instance of both (the newest one, if the interval saw several)


class Checkpoint(Struct, array_like=True, frozen=True):
    """A change checkpoint, ``[id, time_ms, [[key, first, last], ...], instance]`` on
    the wire (a day of 1 s checkpoints is 86 400 of them: no field names repeated).
    ``changes`` is empty when a topic filter left nothing of it: the id still tells a
    filtered reader that it exists (docs/semantics/recovery.md §3.4). ``instance`` names
    the server's data directory: ids are comparable only within one instance
    (docs/semantics/recovery.md §3.5; empty from a server before it was sent)."""

    id: int
    time_ms: int
    changes: list[KeyChange]
    instance: str = ""


class CheckpointData(Struct, array_like=True, frozen=True):
    """What the server stores per checkpoint in its internal topic (the record's seq
    is the id). ``covered`` is what a restart rebuilds after: per topic it names, the
    version up to which that topic's changes are in checkpoints (absent before it was
    kept: readers of older records see none)."""

    time_ms: int
    changes: list[KeyChange]
    covered: list[Covered] = field(default_factory=list)


class CheckpointPage(Struct, frozen=True):
    """``GET /v0/changes/checkpoints``: newest first. ``next_before`` continues the
    walk back (None: nothing older in the range)."""

    checkpoints: list[Checkpoint]
    next_before: int | None = None
    instance: str = ""  # the server's instance id, also when no checkpoint is kept yet
    # The highest checkpoint id the recovery window removed (0: none), and the newest
    # one this page left out for being older than earliest_ms (0: none): what a
    # recovery query needs to tell ids that held checkpoints it cannot see from ids
    # that never held one (docs/semantics/recovery.md §3.2).
    expired_to: int = 0
    older: int = 0


def key_topic(key: str) -> str:
    """The topic of ``key`` (a tag may itself hold ``/``; a topic name never does)."""
    return key.split("/", 1)[0]
