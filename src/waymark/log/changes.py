"""What the engine committed, per key, since the last change checkpoint
(docs/semantics/recovery.md §1).

Pure bookkeeping: the engine notes every committed change of a key of a log topic
with the journal commit that makes it durable; :meth:`Changes.take` hands back the
changes that are durable now, merged per key into the first and the last version.
The server turns them into a checkpoint every interval (``--checkpoint-interval-s``).

The changes not yet in a checkpoint are never only here
(docs/semantics/recovery.md §1.6): each checkpoint states, per topic it names, the
version up to which that topic's changes are in checkpoints (its *coverage*); a seal
keeps the changes still waiting in the catalog (:meth:`Changes.pending`); and restore
notes again every change of the WAL it replays, dropping those a replayed checkpoint
covers.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import takewhile

import msgspec

from ..protocol import Covered, KeyChange, key_topic
from .deletion import TagMatch
from .journal import Commit
from .records import EncodedRecord, PlainRecords, Records
from .topic import Topic

# The internal topic the checkpoints are kept in: its seqs are the checkpoint ids, so
# they increase strictly and are never reused across restarts (docs/durability.md).
CHANGES_TOPIC = "waymark$changes"

Versions = dict[str, list[int]]  # key -> [first, last, epoch]
Version = tuple[int, int]  # (epoch, seq): a topic's changes in the order they happen


class _Coverage(msgspec.Struct, array_like=True):
    """A stored checkpoint's coverage alone (its changes left undecoded)."""

    time_ms: int
    changes: msgspec.Raw
    covered: list[Covered] = msgspec.field(default_factory=list)


_coverage = msgspec.json.Decoder(_Coverage)
_DATA = b',"data":'


def coverage_of(records: list[EncodedRecord]) -> list[Covered]:
    """What the checkpoints ``records`` (of :data:`CHANGES_TOPIC`, replayed) cover."""
    covered: list[Covered] = []
    for record in records:
        body = record.body
        if body.startswith(_DATA):  # (the engine writes no node, tag or meta for them)
            covered.extend(_coverage.decode(body[len(_DATA) : -1]).covered)
    return covered


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
        self._restored: list[KeyChange] = []  # kept by a seal, back from the catalog
        # Per topic, the version up to which its changes are in checkpoints: what a
        # restore's notes are filtered by (docs/semantics/recovery.md §1.6).
        self.covered: dict[str, Version] = {}
        # The changes a restore noted again (replayed frames, the catalog's): kept
        # apart, as only they can be covered already.
        self.rebuilt: Changes | None = None

    def __len__(self) -> int:
        rebuilt = 0 if self.rebuilt is None else len(self.rebuilt)
        return len(self._commits) + len(self._removals) + len(self._restored) + rebuilt

    def replayed(self) -> Changes:
        """Where a restore notes the changes it replays."""
        if self.rebuilt is None:
            self.rebuilt = Changes()
        return self.rebuilt

    def appended(
        self,
        topic: str,
        epoch: int,
        first_seq: int,
        records: Records,
        commit: Commit | None,
    ) -> None:
        """An append of ``records`` from ``first_seq`` on (docs/semantics/recovery.md §1.2)."""
        # One record's tag (a string: the collector never tracks it), or the batch itself,
        # whose tags are read at the interval.
        if isinstance(records, PlainRecords):
            # Untagged, all one key: noted as its first and its last record.
            self._note(commit, topic, epoch, first_seq, None)
            if len(records) > 1:
                self._note(commit, topic, epoch, first_seq + len(records) - 1, None)
            return
        tags = records[0].tag if len(records) == 1 else records
        self._note(commit, topic, epoch, first_seq, tags)

    def removed(self, topic: Topic, keys: list[str], version: int, commit: Commit | None) -> None:
        """A deletion or a drop changed ``keys`` at ``version``: the seq the deletion
        took, or the one a dropped instance would have handed out next; later than every
        version of those keys before it (docs/semantics/recovery.md §1.3)."""
        self._removals.append((commit, keys, version, topic.epoch))

    def restored(self, changes: list[KeyChange]) -> None:
        """Changes a seal kept because no checkpoint named them yet (the catalog's): a
        restore notes them in :meth:`replayed`."""
        self._restored.extend(changes)

    def cover(self, covered: list[Covered]) -> None:
        """A checkpoint (replayed, or just written) covers these topics' changes up to
        their versions."""
        for topic, epoch, seq in covered:
            if self.covered.get(topic, (-1, -1)) < (epoch, seq):
                self.covered[topic] = (epoch, seq)

    def unsynced_topics(self) -> set[str]:
        """The topics with a change noted that is not durable yet."""
        topics = {t for c, t in zip(self._commits, self._topics, strict=True)
                  if c is not None and not c.durable}  # fmt: skip
        topics.update(key_topic(keys[0]) for c, keys, _, _ in self._removals
                      if c is not None and not c.durable)  # fmt: skip
        if self.rebuilt is not None:
            topics.update(self.rebuilt.unsynced_topics())
        return topics

    def pending(self) -> list[KeyChange]:
        """Every change not yet taken, durable or not, merged per key, taking nothing:
        what a seal keeps in the catalog, whose segments make them all durable."""
        merged: Versions = {}
        for change in self._restored:
            _merge(merged, change.key, change.first, change.last, change.epoch)
        noted = zip(self._topics, self._epochs, self._firsts, self._tags, strict=True)
        for topic, epoch, first_seq, tags_of in noted:
            tags = [r.tag for r in tags_of] if isinstance(tags_of, list) else [tags_of]
            for offset, tag in enumerate(tags):
                seq = first_seq + offset
                _merge(merged, record_key(topic, tag), seq, seq, epoch)
        for _, keys, version, epoch in self._removals:
            for key in keys:
                _merge(merged, key, version, version, epoch)
        if self.rebuilt is not None:
            # Without those a replayed checkpoint covers: after the seal that checkpoint
            # is in the segments, no longer replayed to say so.
            for change in self.rebuilt.pending():
                cover = self.covered.get(key_topic(change.key), (-1, -1))
                if (change.epoch, change.last) <= cover:
                    continue
                first = change.first if (change.epoch, change.first) > cover else cover[1] + 1
                _merge(merged, change.key, first, change.last, change.epoch)
        return [KeyChange(k, first, last, epoch) for k, (first, last, epoch) in merged.items()]

    def take(self) -> tuple[list[KeyChange], list[Covered]]:
        """The changes that are durable now, merged per key, and the coverage of the
        checkpoint that names them (per topic, the version up to which its changes are
        taken now or were before); the rest stay. The changes of one key are of one
        topic, whose frames one WAL shard makes durable in order, so a key's later
        change is never taken before its earlier one, and the appends taken of one
        topic instance come in seq order. Of the changes a restore noted again, those a
        checkpoint already covers are dropped."""
        merged: Versions = {}
        reached: dict[str, Version] = {}  # per topic, the newest version taken
        waiting: dict[str, Version] = {}  # per topic, its oldest change left for later
        self.collect(merged, reached, waiting, None)
        if self.rebuilt is not None:
            self.rebuilt.collect(merged, reached, waiting, self.covered)
        coverage: list[Covered] = []
        for topic, (epoch, seq) in reached.items():
            left = waiting.get(topic)
            if left is not None and left <= (epoch, seq):
                # A router's copies become durable with their source, maybe before an
                # older change of the topic itself: the coverage stops below that one.
                epoch, seq = left[0], left[1] - 1
            coverage.append((topic, epoch, seq))
        changes = [KeyChange(k, first, last, epoch) for k, (first, last, epoch) in merged.items()]
        return changes, coverage

    def collect(
        self,
        merged: Versions,
        reached: dict[str, Version],
        waiting: dict[str, Version],
        covered: dict[str, Version] | None,
    ) -> None:
        """Take this object's durable changes into ``merged``, without those
        ``covered`` names; note the newest taken and the oldest left, per topic."""
        # Per topic instance, tag -> [first, last]: one dict step per record, each key's
        # string built once per interval, not once per append.
        by_instance: dict[tuple[str, int], dict[str | None, list[int]]] = {}
        noted = zip(self._commits, self._topics, self._epochs, self._firsts, self._tags,
                    strict=True)  # fmt: skip
        self._commits, self._topics, self._epochs, self._firsts, self._tags = [], [], [], [], []
        for commit, topic, epoch, first_seq, tags_of in noted:
            if commit is not None and not commit.durable:
                self._note(commit, topic, epoch, first_seq, tags_of)
                if (epoch, first_seq) < waiting.get(topic, (epoch, first_seq + 1)):
                    waiting[topic] = (epoch, first_seq)
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
        none = (-1, -1)

        def add(topic: str, key: str, first: int, last: int, epoch: int) -> None:
            if covered is not None:
                cover = covered.get(topic, none)
                if (epoch, last) <= cover:
                    return  # named by a checkpoint before the restart
                if (epoch, first) <= cover:
                    first = cover[1] + 1
            _merge(merged, key, first, last, epoch)
            if reached.get(topic, none) < (epoch, last):
                reached[topic] = (epoch, last)

        for (topic, epoch), tags in by_instance.items():
            if covered is not None:
                for tag, (first, last) in tags.items():
                    add(topic, record_key(topic, tag), first, last, epoch)
                continue
            # The live path, inlined: a step per key, the newest seq once per instance.
            newest = 0
            for tag, (first, last) in tags.items():
                _merge(merged, record_key(topic, tag), first, last, epoch)
                if last > newest:
                    newest = last
            if reached.get(topic, none) < (epoch, newest):
                reached[topic] = (epoch, newest)
        removals, self._removals = self._removals, []
        for removal in removals:
            commit, keys, version, epoch = removal
            topic = key_topic(keys[0])
            if commit is not None and not commit.durable:
                self._removals.append(removal)
                if (epoch, version) < waiting.get(topic, (epoch, version + 1)):
                    waiting[topic] = (epoch, version)
                continue
            for key in keys:
                add(topic, key, version, version, epoch)
        restored, self._restored = self._restored, []
        for change in restored:  # all durable: a seal wrote them with its segments
            add(key_topic(change.key), change.key, change.first, change.last, change.epoch)

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
        prefix = match.prefix
        candidates = filter(
            match.matches, takewhile(lambda t: t.startswith(prefix), tags.irange(minimum=prefix))
        )
    for tag in candidates:
        seqs = tags[tag]
        if seqs and seqs[0] < bound:
            keys.append(f"{topic.name}/{tag}")
    return keys


def dropped_keys(topic: Topic) -> list[str]:
    """Every key of a dropped topic."""
    return [topic.name, *(f"{topic.name}/{tag}" for tag in topic.tag_index)]
