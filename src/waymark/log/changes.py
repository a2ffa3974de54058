"""What the engine committed, per key, since the last change checkpoint
(docs/semantics/recovery.md §1).

Pure bookkeeping: the engine notes every committed change of a key of a log topic
with the journal commit that makes it durable; :meth:`Changes.take` hands back the
changes that are durable now, merged per key into the first and the last version.
The server turns them into a checkpoint every interval (``--checkpoint-interval-s``).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import takewhile

from ..protocol import KeyChange
from .deletion import TagMatch
from .journal import Commit
from .records import EncodedRecord
from .topic import Topic

# The internal topic the checkpoints are kept in: its seqs are the checkpoint ids, so
# they increase strictly and are never reused across restarts (docs/durability.md).
CHANGES_TOPIC = "waymark$changes"

Versions = dict[str, list[int]]  # key -> [first, last, epoch]


def record_key(topic: str, tag: str | None) -> str:
    """The key of a record (docs/semantics/recovery.md §1.1)."""
    return topic if tag is None else f"{topic}/{tag}"


def _merge(into: Versions, key: str, first: int, last: int, epoch: int) -> None:
    """Merge a change into the key's versions of the interval. A newer instance's
    change replaces an older one's: a consumer reading the new instance's state
    covers every change of the old (docs/semantics/recovery.md §1.2)."""
    seen = into.get(key)
    if seen is None or seen[2] < epoch:
        into[key] = [first, last, epoch]
    elif seen[2] == epoch:
        seen[0] = min(seen[0], first)
        seen[1] = max(seen[1], last)


class Changes:
    """Changes committed but not yet in a checkpoint, each with its journal commit
    (None: no journal, committed when applied).

    An append is noted in O(1), in parallel lists (its commit, topic, epoch, first seq,
    and its one record's tag or its batch of records): a one-record append allocates
    no object the garbage collector tracks. The per-key merge runs in :meth:`take`,
    once per interval, off the append path."""

    def __init__(self) -> None:
        self._commits: list[Commit | None] = []
        self._topics: list[str] = []
        self._epochs: list[int] = []
        self._firsts: list[int] = []
        self._tags: list[str | list[EncodedRecord] | None] = []  # one tag, or a batch
        self._removals: list[tuple[Commit | None, list[str], int, int]] = []

    def __len__(self) -> int:
        return len(self._commits) + len(self._removals)

    def appended(
        self,
        topic: str,
        epoch: int,
        first_seq: int,
        records: list[EncodedRecord],
        commit: Commit | None,
    ) -> None:
        """An append of ``records`` from ``first_seq`` on (docs/semantics/recovery.md §1.2)."""
        # One record's tag (a string: the collector never tracks it), or the batch itself,
        # whose tags are read at the interval.
        tags = records[0].tag if len(records) == 1 else records
        self._note(commit, topic, epoch, first_seq, tags)

    def removed(self, topic: Topic, keys: list[str], version: int, commit: Commit | None) -> None:
        """A deletion or a drop changed ``keys`` at ``version``: the seq the deletion
        took, or the one a dropped instance would have handed out next; later than every
        version of those keys before it (docs/semantics/recovery.md §1.3)."""
        self._removals.append((commit, keys, version, topic.epoch))

    def take(self) -> list[KeyChange]:
        """The changes that are durable now, merged per key; the rest stay. The changes
        of one key are of one topic, whose frames one WAL shard makes durable in order,
        so a key's later change is never taken before its earlier one, and the appends
        taken of one topic instance come in seq order."""
        # Per topic instance, tag -> [first, last]: one dict step per record, each key's
        # string built once per interval, not once per append.
        by_instance: dict[tuple[str, int], dict[str | None, list[int]]] = {}
        noted = zip(self._commits, self._topics, self._epochs, self._firsts, self._tags,
                    strict=True)  # fmt: skip
        self._commits, self._topics, self._epochs, self._firsts, self._tags = [], [], [], [], []
        for commit, topic, epoch, first_seq, tags_of in noted:
            if commit is not None and not commit.durable:
                self._note(commit, topic, epoch, first_seq, tags_of)
                continue
            tags = by_instance.get((topic, epoch))
            if tags is None:
                tags = by_instance[topic, epoch] = {}
            if not isinstance(tags_of, list):
                seen = tags.get(tags_of)
                if seen is None:
                    tags[tags_of] = [first_seq, first_seq]
                else:
                    seen[1] = first_seq  # seqs only grow within an instance
                continue
            seq = first_seq
            for record in tags_of:
                tag = record.tag
                seen = tags.get(tag)
                if seen is None:
                    tags[tag] = [seq, seq]
                else:
                    seen[1] = seq
                seq += 1
        merged: Versions = {}
        for (topic, epoch), tags in by_instance.items():
            for tag, (first, last) in tags.items():
                _merge(merged, record_key(topic, tag), first, last, epoch)
        removals, self._removals = self._removals, []
        for removal in removals:
            commit, keys, version, epoch = removal
            if commit is not None and not commit.durable:
                self._removals.append(removal)
                continue
            for key in keys:
                _merge(merged, key, version, version, epoch)
        return [KeyChange(k, first, last, epoch) for k, (first, last, epoch) in merged.items()]

    def _note(
        self,
        commit: Commit | None,
        topic: str,
        epoch: int,
        first_seq: int,
        tags: str | list[EncodedRecord] | None,
    ) -> None:
        self._commits.append(commit)
        self._topics.append(topic)
        self._epochs.append(epoch)
        self._firsts.append(first_seq)
        self._tags.append(tags)


def deleted_keys(topic: Topic, bound: int, match: TagMatch | None) -> list[str]:
    """The keys a deletion below ``bound`` may change: the matching tags with a record
    below it, and the topic itself when it deletes untagged records (an upper bound:
    reporting a key that did not change costs a re-check, missing one a stale entity)."""
    keys = [] if match is not None else [topic.name]
    tags = topic.tag_index
    if match is None:
        candidates: Iterable[str] = tags.keys()
    elif match.exact:
        candidates = [match.value] if match.value in tags else []
    else:
        prefix = match.value
        candidates = takewhile(lambda t: t.startswith(prefix), tags.irange(minimum=prefix))
    for tag in candidates:
        seqs = tags[tag]
        if seqs and seqs[0] < bound:
            keys.append(f"{topic.name}/{tag}")
    return keys


def dropped_keys(topic: Topic) -> list[str]:
    """Every key of a dropped topic."""
    return [topic.name, *(f"{topic.name}/{tag}" for tag in topic.tag_index)]
