"""Two-phase commit for exactly-once sinks: a staging area and a publish ledger per topic.

A sink writer (say one Spark streaming query) is named by a *writer id* that is
stable across its restarts, and carries an *epoch* that every restart bumps
(:meth:`Writers.open_writer`, one epoch per writer across all its topics), which
fences its older runs (docs/semantics/topics.md §12). Its tasks *stage*
records under ``(writer, batch, partition, attempt)``; staged records are
invisible to readers. Its coordinator then *publishes* the parts of the attempts
that succeeded: they are appended as one atomic write (contiguous seqs, through
:meth:`Engine.append_encoded` and thus :meth:`Kernel.commit`), and the ledger
remembers ``(writer, batch) -> seqs``, so publishing the same batch again returns
the original seqs and appends nothing.

Fencing: a stage or publish carrying an epoch other than the writer's current one
is a zombie of an earlier run and is refused with 409 ``fenced``. Stages that are
never published (failed attempts, crashed runs) expire after ``stage_ttl_ms`` of
the injected clock. Publish ledgers belong to a topic instance: a deleted and
recreated topic starts with an empty ledger, like it starts with new seqs.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from ..protocol import Durability, PublishResponse, RecordIn, WriterState, WriterTopic
from .errors import ErrorCode, TopicError
from .journal import BodyRun, StageKey, WriterFrame, stage_frame_parts
from .origin import Published, StagedChunks
from .records import EncodedRecord, PlainRecords, check_topic_name, encode_batch

if TYPE_CHECKING:
    from .prebuilt import Layout, Prebuilt
    from .topiclog import TopicLog

DEFAULT_STAGE_TTL_MS = 15 * 60_000
# Spark replays at most the last few batches; a bounded ledger per writer is plenty,
# and a batch older than the retained window is refused rather than re-appended.
DEFAULT_LEDGER_BATCHES = 4096


@dataclass(frozen=True, slots=True)
class PartKey:
    """One task attempt's staged output: partition and attempt within a batch."""

    partition: int
    attempt: int


@dataclass(slots=True)
class _Part:
    created_ms: int
    # chunk -> its records: columnar when they carry data alone (the Spark sink's rows),
    # so that the publish and the seal take them with no step per record (docs/spark.md,
    # "Sink speed")
    chunks: dict[int, list[EncodedRecord] | PlainRecords] = field(default_factory=dict)
    # chunk -> a list chunk's bodies joined: the publish frames and lays these out with
    # no step per record as well
    runs: dict[int, BodyRun] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)  # chunk -> its bodies' bytes
    # chunk -> the WAL file its stage frame went to, for a plain chunk journaled as it
    # was staged: its publish may then name it rather than write its records again
    # (docs/durability.md, "Staged chunks")
    files: dict[int, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.sizes.values())


@dataclass(slots=True)
class _Writer:
    # batch id -> (first_seq, count), oldest first, bounded
    ledger: OrderedDict[int, tuple[int, int]] = field(default_factory=OrderedDict)
    forgotten_upto: int = -1  # batches <= this left the ledger
    stages: dict[tuple[int, PartKey], _Part] = field(default_factory=dict)
    # The plain chunks a publish's lay_out joined (batch id, chunks, join): its publish
    # takes the same join (one copy of the batch, and the layout adopted by identity).
    # Dropped with the batch's stages (published or expired), so it never outlives them.
    gathered: tuple[int, list[PlainRecords], PlainRecords] | None = None


class LedgerEntry(msgspec.Struct, array_like=True):
    """One (topic, writer)'s publish ledger in the catalog, on disk
    ``[topic, writer, [[batch_id, first_seq, count], ...], forgotten_upto]``."""

    topic: str
    writer: str
    ledger: list[tuple[int, int, int]]  # oldest batch first
    forgotten_upto: int  # batches <= this left the ledger


class WritersSnapshot(msgspec.Struct):
    """What a seal keeps of the writers (the catalog's ``staging`` key)."""

    epochs: dict[str, int]
    ledgers: list[LedgerEntry]


class Writers:
    """Per-topic staging areas and publish ledgers over one engine."""

    def __init__(
        self,
        engine: TopicLog,
        *,
        stage_ttl_ms: int = DEFAULT_STAGE_TTL_MS,
        ledger_batches: int = DEFAULT_LEDGER_BATCHES,
    ) -> None:
        self._engine = engine
        self.stage_ttl_ms = stage_ttl_ms
        self.ledger_batches = ledger_batches
        # Epochs are per writer, not per topic, so a writer whose rows name their
        # topics learns one epoch up front; ledgers and stages are per (topic, writer).
        self._epochs: dict[str, int] = {}
        self._writers: dict[tuple[str, str], _Writer] = {}
        self._instance: dict[str, int] = {}

    def open_writer(self, writer: str) -> int:
        """Start a new run of ``writer``: bump and return its epoch, fencing older runs.

        The epoch is journaled (a control frame) before it is handed out, so a server
        restart never issues the same epoch twice.
        """
        _check_writer(writer)
        epoch = self._epochs.get(writer, 0) + 1
        self._engine.kernel.write(writer, WriterFrame(writer, epoch).encode())
        self._epochs[writer] = epoch
        return epoch

    def stage(
        self,
        topic: str,
        writer: str,
        epoch: int,
        batch_id: int,
        part: PartKey,
        records: Sequence[RecordIn] | PlainRecords,
        *,
        chunk: int = 0,
    ) -> bool:
        """Stage ``records`` as chunk ``chunk`` of one task attempt's output.

        Re-sending a chunk replaces it (an HTTP retry stores it once). Records are
        validated against the limits now, so a publish cannot fail on a bad record
        (:class:`PlainRecords` come validated: :func:`~waymark.log.records.plain_records`).
        Returns False, storing nothing, when the batch is already published: a
        replayed batch need not ship its rows again.
        """
        _check_ids(batch_id, part, chunk)
        state = self._fenced(topic, writer, epoch)
        if batch_id in state.ledger or batch_id <= state.forgotten_upto:
            return False
        if isinstance(records, PlainRecords):
            encoded: list[EncodedRecord] | PlainRecords = records
            run = None
            size = len(records.joined())
        else:
            encoded = encode_batch(records, self._engine.limits)
            run = BodyRun.of(encoded)
            size = len(run.bodies)
        now = self._engine.clock.now_ms()
        self._expire(state, now)
        existing = state.stages.get((batch_id, part))
        replaced = existing.sizes.get(chunk, 0) if existing is not None else 0  # a retry
        self._check_room(writer, size - replaced, now)
        file = None
        if isinstance(encoded, PlainRecords):
            file = self._journal_stage((topic, writer, batch_id, part.partition, part.attempt,
                                        chunk), encoded)  # fmt: skip
        staged = state.stages.setdefault((batch_id, part), _Part(now))
        staged.chunks[chunk] = encoded
        staged.sizes[chunk] = size
        if file is None:
            staged.files.pop(chunk, None)
        else:
            staged.files[chunk] = file
        if run is None:
            staged.runs.pop(chunk, None)
        else:
            staged.runs[chunk] = run
        return True

    def _journal_stage(self, key: StageKey, records: PlainRecords) -> int | None:
        """Write a plain chunk's stage frame to its topic's WAL shard now, while the
        tasks still run, so that its publish writes and syncs a small frame naming it
        rather than the batch's records (docs/durability.md, "Staged chunks"). Returns
        the WAL file it went to; None when it was not journaled: no journal, a topic
        whose records never reach the WAL, or a shard that refuses writes now (the
        publish then writes the records itself, and meets the refusal if it lasts). Not
        waited for: the publish's own sync, later in the same shard, covers it."""
        kernel = self._engine.kernel
        journal = kernel.journal
        if journal is None:
            return None
        topic = kernel.get(key[0])
        config = topic.config if topic is not None else self._engine.defaults
        if config.durability is Durability.EPHEMERAL:
            return None
        try:
            with journal.admit(key[0]):
                journal.write(key[0], stage_frame_parts(key, records))
        except TopicError as refused:
            if refused.code is not ErrorCode.STORAGE_UNAVAILABLE:
                raise
            return None
        return journal.file(key[0])

    def staged_bytes(self, writer: str | None = None) -> int:
        """Bytes staged and unpublished, by ``writer`` or by every writer."""
        return sum(part.bytes for (_, w), state in self._writers.items()
                   if writer is None or w == writer
                   for part in state.stages.values())  # fmt: skip

    def _check_room(self, writer: str, more: int, now: int) -> None:
        """Refuse a stage past the staged-bytes limits (docs/security.md, Limits): the
        stages of a writer that never publishes would otherwise hold memory until they
        expire, and any number of writers could."""
        limits = self._engine.limits
        for state in self._writers.values():
            self._expire(state, now)
        mine, total = self.staged_bytes(writer), self.staged_bytes()
        for held, limit, whose in ((mine, limits.max_staged_bytes_per_writer, "this writer"),
                                   (total, limits.max_staged_bytes, "all writers")):  # fmt: skip
            if held + more > limit:
                raise TopicError(
                    ErrorCode.STAGING_FULL,
                    f"{whose} would hold {held + more} staged, unpublished bytes; at most "
                    f"{limit} are allowed: publish or let stages expire first",
                    {"writer": writer, "staged_bytes": held, "bytes": more,
                     "max_bytes": limit},
                )  # fmt: skip

    def publish(
        self,
        topic: str,
        writer: str,
        epoch: int,
        batch_id: int,
        parts: Sequence[tuple[PartKey, int]],
        prebuilt: Prebuilt | None = None,
    ) -> PublishResponse:
        """Append the staged ``parts`` (each with its chunk count) as one atomic write.

        Idempotent per ``(writer, batch_id)``: a batch already published returns its
        original seqs. The staged parts of the batch (including those of failed
        attempts, which are not named) are dropped once published. ``prebuilt``: the
        append's bytes built from :meth:`lay_out` (see :meth:`Engine.append_encoded`).
        """
        state = self._fenced(topic, writer, epoch)
        head = (
            self._engine.kernel.existing(topic, replay=False).readable_head()
            if topic in self._instance
            else 0
        )
        if batch_id in state.ledger:
            first, count = state.ledger[batch_id]
            return PublishResponse(first, count, head, replayed=True)
        if batch_id <= state.forgotten_upto:
            raise TopicError(
                ErrorCode.INVALID_REQUEST,
                f"batch {batch_id} of writer {writer!r} is older than the publish ledger keeps",
                {"writer": writer, "batch_id": batch_id, "forgotten_upto": state.forgotten_upto},
            )
        self._expire(state, self._engine.clock.now_ms())
        try:
            records = self._gather(state, writer, batch_id, parts)
        finally:
            state.gathered = None
        if records:
            # The ledger entry travels in the append's own journal frame: one WAL frame.
            result = self._engine.append_encoded(
                topic, records, origin=Published(writer, batch_id), prebuilt=prebuilt,
                staged=_staged_chunks(state, batch_id, parts),
            )  # fmt: skip
            first, count = result.seqs[0], len(result.seqs)
            head = result.head_seq
            self._instance[topic] = self._engine.kernel.existing(topic, replay=False).epoch
        else:
            first, count = 0, 0
        state.ledger[batch_id] = (first, count)
        self._bound_ledger(state)
        for key in [k for k in state.stages if k[0] == batch_id]:
            del state.stages[key]
        return PublishResponse(first, count, head, replayed=False)

    def lay_out(
        self,
        topic: str,
        writer: str,
        epoch: int,
        batch_id: int,
        parts: Sequence[tuple[PartKey, int]],
    ) -> Layout | None:
        """Where :meth:`publish` would append ``parts`` now (:meth:`Engine.lay_out`), or
        None if it would append nothing (a replay, an empty batch); refuses what the
        publish would refuse."""
        state = self._fenced(topic, writer, epoch)
        if batch_id in state.ledger or batch_id <= state.forgotten_upto:
            return None
        self._expire(state, self._engine.clock.now_ms())
        runs: list[BodyRun] = []
        records = self._gather(state, writer, batch_id, parts, runs)
        if not records:
            return None
        return self._engine.lay_out(topic, records, publish=Published(writer, batch_id),
                                    runs=runs or None,
                                    staged=_staged_chunks(state, batch_id, parts))  # fmt: skip

    def _gather(
        self,
        state: _Writer,
        writer: str,
        batch_id: int,
        parts: Sequence[tuple[PartKey, int]],
        runs: list[BodyRun] | None = None,
    ) -> list[EncodedRecord] | PlainRecords:
        """The staged records of ``parts``, in order, refused if one is not fully
        staged: as one :class:`PlainRecords` when every chunk is, else as a list (and
        then their bodies' runs into ``runs``)."""
        gathered: list[tuple[list[EncodedRecord] | PlainRecords, BodyRun | None]] = []
        for part, chunks in parts:
            _check_ids(batch_id, part, 0)
            staged = state.stages.get((batch_id, part))
            missing = [c for c in range(chunks) if staged is None or c not in staged.chunks]
            if missing:
                raise TopicError(
                    ErrorCode.NOT_FOUND,
                    f"batch {batch_id} partition {part.partition} attempt {part.attempt} is not "
                    "fully staged (never staged, or expired)",
                    {"writer": writer, "batch_id": batch_id, "partition": part.partition,
                     "attempt": part.attempt, "missing_chunks": missing[:16]},
                )  # fmt: skip
            assert staged is not None
            gathered.extend((staged.chunks[c], staged.runs.get(c)) for c in range(chunks))
        plain = [chunk for chunk, _ in gathered if isinstance(chunk, PlainRecords)]
        if plain and len(plain) == len(gathered):
            joined = state.gathered
            if (
                joined is None
                or len(joined[1]) != len(plain)
                or not all(map(operator.is_, joined[1], plain))
            ):
                joined = state.gathered = (batch_id, plain, PlainRecords.concat(plain))
            return joined[2]
        records: list[EncodedRecord] = []
        for chunk, run in gathered:  # (plain chunks among others: a rare batch)
            records.extend(chunk)
            if runs is not None:
                runs.append(run if run is not None else BodyRun.of(chunk))
        return records

    def staged_parts(self, topic: str, writer: str) -> int:
        """How many task attempts' outputs are staged and unpublished (for metrics, tests)."""
        state = self._writers.get((topic, writer))
        if state is None:
            return 0
        self._expire(state, self._engine.clock.now_ms())
        return len(state.stages)

    def topics_of(self, writer: str) -> list[str]:
        """The topics ``writer`` has staged or published to (the current instances')."""
        return sorted(topic for topic, w in self._writers if w == writer)

    def states(self) -> list[WriterState]:
        """Every writer by id: its epoch and, per topic, its last published batch."""
        now = self._engine.clock.now_ms()
        topics: dict[str, list[WriterTopic]] = {}
        for (topic, writer), state in sorted(self._writers.items()):
            self._expire(state, now)
            last = next(reversed(state.ledger), None) if state.ledger else None
            first, count = state.ledger[last] if last is not None else (0, 0)
            topics.setdefault(writer, []).append(
                WriterTopic(topic, last, first, count, len(state.stages))
            )
        return [WriterState(w, e, topics.get(w, [])) for w, e in sorted(self._epochs.items())]

    # --- internals ----------------------------------------------------------------
    # --- durability: replay and seals ------------------------------------------
    def restore_writer(self, writer: str, epoch: int) -> None:
        self._epochs[writer] = max(self._epochs.get(writer, 0), epoch)

    def restore_published(self, topic: str, mark: Published, first_seq: int, count: int) -> None:
        state = self._writer(topic, mark.writer)
        state.ledger[mark.batch_id] = (first_seq, count)
        self._bound_ledger(state)

    def snapshot(self) -> WritersSnapshot:
        """The durable part: epochs and publish ledgers (stages are not: a restarted
        server makes a sink re-stage, never publish twice)."""
        return WritersSnapshot(
            dict(self._epochs),
            [
                LedgerEntry(topic, writer, [(b, f, c) for b, (f, c) in state.ledger.items()],
                            state.forgotten_upto)
                for (topic, writer), state in self._writers.items()
            ],
        )  # fmt: skip

    def restore(self, snapshot: WritersSnapshot) -> None:
        for writer, epoch in snapshot.epochs.items():
            self.restore_writer(writer, epoch)
        for entry in snapshot.ledgers:
            state = self._writer(entry.topic, entry.writer)
            for batch_id, first_seq, count in entry.ledger:
                state.ledger[batch_id] = (first_seq, count)
            state.forgotten_upto = max(state.forgotten_upto, entry.forgotten_upto)

    def _bound_ledger(self, state: _Writer) -> None:
        while len(state.ledger) > self.ledger_batches:
            old, _ = state.ledger.popitem(last=False)
            state.forgotten_upto = max(state.forgotten_upto, old)

    def _writer(self, topic: str, writer: str) -> _Writer:
        check_topic_name(topic)
        # A recreated topic is a new instance: its ledger and stages start empty.
        try:
            instance = self._engine.kernel.existing(topic, replay=False).epoch
        except TopicError:
            instance = 0
        known = self._instance.get(topic)
        if known is not None and known != instance:
            for key in [k for k in self._writers if k[0] == topic]:
                del self._writers[key]
        if instance:
            self._instance[topic] = instance
        else:
            self._instance.pop(topic, None)
        state = self._writers.get((topic, writer))
        if state is None:
            state = self._writers[(topic, writer)] = _Writer()
        return state

    def _fenced(self, topic: str, writer: str, epoch: int) -> _Writer:
        _check_writer(writer)
        # A recovering topic's publish ledger is whole only once its frames are applied.
        self._engine.kernel.finish_replay(topic)
        current = self._epochs.get(writer, 0)
        if epoch != current or not current:
            raise TopicError(
                ErrorCode.FENCED,
                f"writer {writer!r} is at epoch {current}; epoch {epoch} is "
                f"{'stale' if epoch < current else 'not issued'}",
                {"topic": topic, "writer": writer, "epoch": epoch, "current_epoch": current},
            )
        return self._writer(topic, writer)

    def _expire(self, state: _Writer, now: int) -> None:
        cutoff = now - self.stage_ttl_ms
        for key in [k for k, p in state.stages.items() if p.created_ms < cutoff]:
            del state.stages[key]
        joined = state.gathered
        if joined is not None and not any(k[0] == joined[0] for k in state.stages):
            state.gathered = None


def _staged_chunks(
    state: _Writer, batch_id: int, parts: Sequence[tuple[PartKey, int]]
) -> StagedChunks | None:
    """The stage frames of a gathered batch's chunks, when every one was journaled as
    it was staged and all went to one WAL file; else None."""
    chunks, files = [], set()
    for part, count in parts:
        staged = state.stages[(batch_id, part)]  # (gathered: every chunk is there)
        for chunk in range(count):
            file = staged.files.get(chunk)
            if file is None:
                return None
            files.add(file)
            chunks.append((part.partition, part.attempt, chunk))
    return StagedChunks(chunks, files.pop()) if len(files) == 1 else None


def _check_writer(writer: str) -> None:
    if not writer:
        raise TopicError(ErrorCode.INVALID_REQUEST, "a writer id is a non-empty string")


def _check_ids(batch_id: int, part: PartKey, chunk: int) -> None:
    if batch_id < 0 or part.partition < 0 or part.attempt < 0 or chunk < 0:
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            "batch_id, partition, attempt and chunk are non-negative integers",
            {"batch_id": batch_id, "partition": part.partition, "attempt": part.attempt},
        )
