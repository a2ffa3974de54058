"""The exactly-once topic sink: ``df.writeStream.format("waymark")``.

A two-phase commit over the log (:mod:`waymark.log.writers`):

1. When the driver plans a micro-batch (Spark builds the sink's writer and ships it
   to the tasks), the writer is opened: the server bumps the writer's epoch, which
   fences every stage and publish of earlier runs (409 ``fenced``) — a zombie of a
   crashed run cannot add to the topic.
2. Each task stages its rows under (writer, batch id, partition, attempt) and that
   epoch; staged rows are invisible to readers. A failed attempt's rows are never
   published and expire on the server.
3. The driver's ``commit(messages, batchId)`` publishes exactly the parts the
   successful attempts reported, under the epoch they staged under, as one atomic
   append per topic (contiguous seqs). Spark builds another writer for the commit; it
   opens no epoch of its own, which would let a zombie's commit through and fence the
   live run instead (docs/spark.md, "Exactly-once topic sink"). Publishing a batch that
   was already published — Spark replays the last batch after a crash between the sink
   commit and ``commits/N``, with the same id and possibly another partitioning —
   returns the original seqs and appends nothing.

Options, as for Spark's Kafka sink: ``url`` (required), ``topic`` (unless a
``topic`` column names one per row) and the query's ``checkpointLocation``. The
writer id that keys the two-phase commit is derived from the checkpoint location
(:func:`checkpoint_writer_id`): the same across restarts of one query, distinct
between queries. ``writerId`` overrides it. A server with tokens or TLS takes
``token`` (default: $WAYMARK_TOKEN; it needs ``write`` on the topics) and ``caFile``
(docs/security.md).

The same protocol serves ``foreachBatch``: ``df.write.format("waymark")`` with
options ``writerId`` and ``batchId`` (the id ``foreachBatch`` passes) publishes the
batch exactly once per (writer, batch id) — Delta's ``txnAppId``/``txnVersion``
idea. This is how a per-batch aggregate reaches a topic: Spark's Python streaming
sinks accept the append output mode only.
Columns: ``data`` (required; a string is JSON text stored as the value it
encodes, so source -> sink round-trips; struct/map/array/scalars are stored as
the matching JSON; invalid JSON fails the batch), optional ``tag``, ``node``,
``meta`` (map<string,string>), ``topic``.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import posixpath
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StringType, StructType

from ..client import ApiError, Client, PublishResponse, StagedPart
from ..protocol import ErrorCode
from .connection import SERVER_BUDGET_MS, connect, server_budget_s, token_option
from .encoding import (
    check_values,
    encode_batch,
    encode_values,
    joined_values,
    joined_view,
    value_bytes,
    value_ends,
    value_lengths,
    values_only,
)

log = logging.getLogger("waymark.spark.sink")

# A stage request holds up to this many records and bytes: fewer, larger requests cost
# the server and the task less (5,000 records a request cost the server ~8% more CPU),
# and a body under the server's bulk-check limit (4 MiB) is checked in bulk
# (docs/spark.md, "Exactly-once topic sink").
CHUNK_RECORDS = 16_384
CHUNK_BYTES = 2 << 20


@dataclass
class StagedParts(WriterCommitMessage):
    """What one successful task attempt staged: ``(topic, chunks, rows)`` per topic, and
    the writer epoch it staged under (the commit publishes under it)."""

    partition: int
    attempt: int
    topics: list[tuple[str, int, int]] = field(default_factory=list)
    epoch: int = 0


def writer_id(options: Mapping[str, str], *, streaming: bool = False) -> str:
    """The writer id: option ``writerId`` if given, else (a streaming query) derived
    from the ``checkpointLocation`` Spark passes to the sink beside the user's options."""
    explicit = options.get("writerId")
    if explicit:
        return explicit
    checkpoint = options.get("checkpointLocation") if streaming else None
    if checkpoint:
        return checkpoint_writer_id(checkpoint)
    if streaming:
        # Spark also accepts a spark.sql.streaming.checkpointLocation root, but then passes
        # the sink only the query name, which is not unique across applications.
        raise ValueError(
            "option 'checkpointLocation' must be specified on the query for the waymark sink "
            "(it names the sink's writer); or name the writer with option 'writerId'"
        )
    raise ValueError(
        "option 'writerId' must be specified for a waymark batch write: a name that stays the "
        "same when the same batches are written again and differs between jobs"
    )


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")


def normalise_checkpoint(location: str) -> str:
    """The absolute form of a checkpoint location, so that one directory has one name.

    A local path (plain or ``file:``) is made absolute against the working directory,
    as Spark resolves it; another scheme keeps its authority and gets a normalised path.
    """
    match = _SCHEME.match(location)
    scheme = match.group(1).lower() if match else None
    if scheme is None:
        return os.path.abspath(location)
    parts = urlsplit(location)
    if scheme == "file":
        return os.path.abspath(unquote(parts.path))
    return f"{scheme}://{parts.netloc}{posixpath.normpath(parts.path or '/')}"


def checkpoint_writer_id(location: str) -> str:
    """A writer id for the query checkpointed at ``location``: its last two path
    components (readable) and a digest of the whole normalised location (distinct)."""
    normal = normalise_checkpoint(location)
    digest = hashlib.sha256(normal.encode()).hexdigest()[:16]
    tail = "/".join(part for part in normal.rsplit("/", 2)[-2:] if part)
    return f"checkpoint:{tail[-64:]}:{digest}"


class _TwoPhaseWriter:
    """What the streaming and the batch writer share: options, epoch, stage, publish."""

    streaming = False  # a streaming query's writer id can come from its checkpoint

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        url = options.get("url")
        if not url:
            raise ValueError(
                "option 'url' must be specified for the waymark sink (the server's base URL)"
            )
        names = {f.name for f in schema.fields}
        if "data" not in names:
            raise ValueError(f"the waymark sink needs a 'data' column; the columns are {names}")
        self.topic = options.get("topic")
        if self.topic is None and "topic" not in names:
            raise ValueError(
                "option 'topic' must be specified for the waymark sink when no 'topic' column "
                "names each row's topic"
            )
        if "topic" in names and not isinstance(schema["topic"].dataType, StringType):
            raise ValueError("the 'topic' column is a string")
        self.url = url.rstrip("/")
        self.token, self.ca_file = token_option(options), options.get("caFile")
        self.budget_s = server_budget_s(options)
        self.writer = writer_id(options, streaming=self.streaming)
        self._epoch: int | None = None  # opened when first needed: see epoch

    @property
    def epoch(self) -> int:
        """This writer's epoch, opened on first use: when the driver ships the writer to
        its tasks (pickling it, :meth:`__getstate__`). A writer Spark builds only to
        commit never opens one: it publishes under the epoch its tasks staged under."""
        if self._epoch is None:
            with connect(self.url, self.token, self.ca_file, self.budget_s) as http:
                self._epoch = http.open_writer(self.writer).epoch
            log.info("waymark sink writer %s opened at epoch %d", self.writer, self._epoch)
        return self._epoch

    def __getstate__(self) -> dict[str, Any]:
        self.epoch  # noqa: B018 (the tasks stage under the epoch opened here, on the driver)
        return self.__dict__.copy()

    # --- executors --------------------------------------------------------------------
    def _stage(self, iterator: Iterator[pa.RecordBatch], batch_id: int) -> StagedParts:
        context = TaskContext.get()
        assert context is not None, "write() runs in a Spark task"
        message = StagedParts(context.partitionId(), context.attemptNumber(), epoch=self.epoch)
        with connect(self.url, self.token, self.ca_file, self.budget_s) as http:
            stager = _Stager(http, self, batch_id, message)
            for batch in iterator:
                stager.add_batch(batch, self.topic)
            stager.flush_all()
        return message

    # --- driver -------------------------------------------------------------------------
    def _publish(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        parts: dict[str, list[StagedPart]] = {}
        staged = [m for m in messages if isinstance(m, StagedParts)]
        epoch = self._staged_epoch(staged, batch_id)
        for message in staged:
            for topic, chunks, _ in message.topics:
                parts.setdefault(topic, []).append(
                    StagedPart(message.partition, message.attempt, chunks)
                )
        with connect(self.url, self.token, self.ca_file, self.budget_s) as http:
            for topic in sorted(parts):
                ordered = sorted(parts[topic], key=lambda p: p.partition)
                result = http.publish(topic, writer=self.writer, epoch=epoch,
                                      batch_id=batch_id, parts=ordered)  # fmt: skip
                log.info(
                    "waymark sink batch %d -> %s: seqs %d..%d%s",
                    batch_id, topic, result.first_seq,
                    result.first_seq + result.count - 1,
                    " (already published: replay)" if result.replayed else "",
                )  # fmt: skip

    def _staged_epoch(self, staged: list[StagedParts], batch_id: int) -> int:
        """The epoch a commit publishes under: the one its tasks staged under, never one
        opened now, so that a zombie driver's commit is fenced like its tasks
        (docs/spark.md, "Exactly-once topic sink"); 0 when nothing was staged."""
        epochs = {m.epoch for m in staged}
        if len(epochs) > 1:  # one planned batch: one writer shipped to all its tasks
            raise ValueError(f"batch {batch_id}'s tasks staged under epochs {sorted(epochs)}")
        return next(iter(epochs), 0)


class WaymarkStreamWriter(_TwoPhaseWriter, DataSourceStreamArrowWriter):
    """``writeStream.format("waymark")``: the batch id comes from Spark's task properties."""

    streaming = True

    # An Arrow writer: pyspark's stubs still type write() with the Row writer's Iterator[Row].
    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedParts:  # type: ignore[override]
        context = TaskContext.get()
        assert context is not None, "write() runs in a Spark task"
        # Spark sets the property on every streaming write task (the stubs allow None).
        batch_id = int(cast(str, context.getLocalProperty("streaming.sql.batchId")))
        return self._stage(iterator, batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._publish(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Nothing to undo: unpublished stages are invisible and expire on the server.
        log.warning("waymark sink batch %d aborted; its staged rows will expire", batchId)


class WaymarkBatchWriter(_TwoPhaseWriter, DataSourceArrowWriter):
    """``df.write.format("waymark")``: a batch query's write, like the Kafka sink's.

    Its rows are staged by the tasks and published by the driver once every task has
    succeeded, as one atomic append per topic: a retried task adds no copy, a failed
    job adds nothing. Without options, each write is a new writer (``batch:<uuid>``),
    so running the job again appends its rows again (Kafka's batch write is
    at-least-once the same way). With ``writerId`` and ``batchId`` — inside
    ``foreachBatch``, the id it passes — each write opens a new epoch of ``writerId``
    (fencing any earlier writer of that id) and publishes under ``batchId``: writing the
    same batch id again — Spark replays the batch after a crash — returns the original
    seqs and appends nothing.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        batch, named = options.get("batchId"), options.get("writerId")
        if batch is None and named is None:
            options = {**options, "writerId": f"batch:{uuid.uuid4().hex}"}
            batch = "0"
        elif batch is None or named is None or not batch.isdigit():
            raise ValueError(
                "the waymark batch writer takes options 'writerId' and 'batchId' together (a "
                "name that stays the same when the same batches are written again, and a "
                "non-negative integer: the batch id foreachBatch passes) so that a replayed "
                "batch is published once; or neither, for a write that is new each time"
            )
        super().__init__(options, schema)
        self.batch_id = int(batch)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedParts:  # type: ignore[override]
        return self._stage(iterator, self.batch_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._publish(messages, self.batch_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("waymark batch write %d aborted; its staged rows will expire", self.batch_id)


def chunk_cuts(records: pa.Array) -> list[int]:
    """Where ``records`` (a binary array) is cut into whole chunks of ``CHUNK_RECORDS``
    records and ``CHUNK_BYTES`` bytes at the most (a record larger than that alone): the
    bounds ``[0, ..]`` of each full chunk, the last bound where the rest, too small to
    fill one, begins."""
    ends = value_ends(records)
    cuts, at, n = [0], 0, len(records)
    while at < n:
        fits = int(np.searchsorted(ends, ends[at] + CHUNK_BYTES, "right")) - 1
        end = min(at + CHUNK_RECORDS, max(fits, at + 1))
        if end == n and n - at < CHUNK_RECORDS and ends[n] - ends[at] < CHUNK_BYTES:
            break  # not full: it waits for more rows, or the task's end
        cuts.append(end)
        at = end
    return cuts


class _Stager:
    """Buffers one task attempt's encoded rows per topic and form (Arrow arrays, each
    value a data value or a RecordIn JSON object, and a comma: :mod:`.encoding`) and
    stages them in chunks of ``CHUNK_RECORDS`` records and ``CHUNK_BYTES`` bytes at the
    most, numbered per topic."""

    def __init__(
        self,
        http: Client,
        writer: _TwoPhaseWriter | TopicBatchSink,
        batch_id: int,
        message: StagedParts,
    ) -> None:
        self.http = http
        self.head: dict[str, Any] = {
            "writer": writer.writer, "epoch": writer.epoch, "batch_id": batch_id,
            "partition": message.partition, "attempt": message.attempt,
        }  # fmt: skip
        self.message = message
        self.buffers: dict[tuple[str, bool], list[pa.Array]] = {}  # (topic, as values)
        self.buffered: dict[tuple[str, bool], int] = {}  # records
        self.buffered_bytes: dict[tuple[str, bool], int] = {}
        self.chunks: dict[str, int] = {}
        self.rows: dict[str, int] = {}
        self.published: set[str] = set()  # the batch is a replay: nothing to ship

    def add_batch(self, batch: pa.RecordBatch, default_topic: str | None) -> None:
        as_values = values_only(batch)
        encode = encode_values if as_values else encode_batch
        for topic, records in encode(batch, default_topic).items():
            self.add(topic, records, as_values)

    def add(self, topic: str, records: pa.Array, as_values: bool = False) -> None:
        key, other = (topic, as_values), (topic, not as_values)
        if self.buffered.get(other):  # the rows keep their order across the two forms
            self._flush(other, pa.concat_arrays(self.buffers.pop(other)))
            self.buffered[other] = self.buffered_bytes[other] = 0
        self.buffers.setdefault(key, []).append(records)
        self.buffered[key] = self.buffered.get(key, 0) + len(records)
        self.buffered_bytes[key] = self.buffered_bytes.get(key, 0) + value_bytes(records)
        if self.buffered[key] >= CHUNK_RECORDS or self.buffered_bytes[key] >= CHUNK_BYTES:
            pending = pa.concat_arrays(self.buffers[key])
            cuts = chunk_cuts(pending)
            for lo, hi in itertools.pairwise(cuts):
                self._flush(key, pending.slice(lo, hi - lo))
            rest = pending.slice(cuts[-1])
            self.buffers[key] = [rest]
            self.buffered[key], self.buffered_bytes[key] = len(rest), value_bytes(rest)

    def flush_all(self) -> None:
        for key, buffer in self.buffers.items():
            if self.buffered[key] or key[0] not in self.chunks:
                self._flush(key, pa.concat_arrays(buffer))
        self.message.topics = [
            (topic, self.chunks[topic], self.rows[topic]) for topic in sorted(self.chunks)
        ]

    def _flush(self, key: tuple[str, bool], records: pa.Array) -> None:
        topic, as_values = key
        chunk = self.chunks.get(topic, 0)
        first_row = self.rows.get(topic, 0)
        if topic not in self.published:
            if as_values:  # (the last value's comma trimmed)
                view = joined_view(records, trim=1)
                accepted = self._stage_values(topic, view, records, chunk, first_row)
            else:
                joined = joined_values(records, trim=1)
                accepted = self.http.stage(topic, joined, chunk=chunk, **self.head).accepted
            if not accepted:
                self.published.add(topic)
        self.chunks[topic] = chunk + 1
        self.rows[topic] = first_row + len(records)

    def _stage_values(
        self, topic: str, joined: memoryview, values: pa.Array, chunk: int, first_row: int
    ) -> bool:
        try:
            return self.http.stage_data(topic, joined, value_lengths(values), chunk=chunk,
                                        **self.head).accepted  # fmt: skip
        except ApiError as error:
            if error.code == ErrorCode.INVALID_REQUEST:  # the values do not split so
                check_values(values, first_row)  # names the row at fault, if one is
            raise


class TopicBatchSink:
    """A ``foreachBatch`` function publishing each micro-batch to a topic exactly once.

    For outputs that fit the driver — per-batch aggregates — this skips Spark's
    write path: the batch is collected as Arrow and staged and published from the
    driver under the batch id, through the same two-phase commit as the streaming
    sink. The writer's epoch is opened once per instance, i.e. per driver run, so a
    zombie of an earlier run is fenced; publishing a batch id that was already
    published (Spark's replay after a crash) appends nothing. Larger outputs use
    ``df.write.format("waymark").option("batchId", id)`` (tasks stage in parallel).
    """

    def __init__(
        self,
        url: str,
        writer: str,
        topic: str | None = None,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        server_budget_s: float = SERVER_BUDGET_MS / 1000,
    ) -> None:
        self.url = url.rstrip("/")
        self.token, self.ca_file = token, ca_file  # docs/security.md
        self.budget_s = server_budget_s  # docs/spark.md, "Server outages"
        self.topic = topic  # None: every row names its topic in a 'topic' column
        self.writer = writer_id({"writerId": writer})
        with connect(self.url, self.token, self.ca_file, self.budget_s) as http:
            self.epoch = http.open_writer(self.writer).epoch

    def __call__(self, df: Any, batch_id: int) -> dict[str, PublishResponse]:
        return self.publish(df.toArrow(), batch_id)

    def publish(self, table: pa.Table, batch_id: int) -> dict[str, PublishResponse]:
        """Stage ``table`` (the sink's columns: ``data``, optional ``tag``, ``node``,
        ``meta``, ``topic``) as one part and publish it as batch ``batch_id``.

        Returns the server's answer per topic (``first_seq``, ``count``, ``replayed``).
        """
        message = StagedParts(0, 0)
        results: dict[str, PublishResponse] = {}
        with connect(self.url, self.token, self.ca_file, self.budget_s) as http:
            stager = _Stager(http, self, batch_id, message)
            for batch in table.to_batches():
                stager.add_batch(batch, self.topic)
            stager.flush_all()
            for topic, chunks, _ in message.topics:
                results[topic] = http.publish(
                    topic, writer=self.writer, epoch=self.epoch, batch_id=batch_id,
                    parts=[StagedPart(0, 0, chunks)],
                )  # fmt: skip
        return results
