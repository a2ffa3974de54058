"""Every call of the /v0 API, written once for both clients (docs/client.md).

:class:`Api` builds each request with :mod:`.calls` (and the queue, router and writer
modules) and hands it to ``_run``: :class:`~waymark.client.Client`'s runs it and
returns the value, :class:`~waymark.client.AsyncClient`'s returns an awaitable of it.
The signatures below are the two clients' public API.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec

from ..protocol import (
    AckResponse,
    AppendResponse,
    CheckpointPage,
    ConfigPatch,
    DeleteResponse,
    DiffResponse,
    ExtendResponse,
    FoldReport,
    FoldStatus,
    Health,
    Job,
    NackResponse,
    OpenWriterResponse,
    PipelineReport,
    PipelineStatus,
    PublishResponse,
    RecordIn,
    RecoveryClient,
    RecoveryClientList,
    RecoveryReport,
    RedriveResponse,
    RouterDeleted,
    RouterFilter,
    RouterOut,
    RouterPut,
    StagedPart,
    StageResponse,
    TagRule,
    TopicHistory,
    TopicList,
    TopicState,
    TopicType,
    WhoAmI,
    WriterState,
)
from . import calls, changes, queues, reports, routers, writers

if TYPE_CHECKING:
    from ..protocol.arrow import ArrowPage

T = TypeVar("T")


class Api:
    """The calls; a client subclass supplies ``_run``, which sends one :class:`~.calls.Call`."""

    @abstractmethod
    def _run(self, call: calls.Call[T]) -> T: ...

    def health(self) -> Health:
        return self._run(calls.health())

    def whoami(self) -> WhoAmI:
        """The calling token's name and scopes (with auth off: every scope)."""
        return self._run(calls.whoami())

    def list_topics_page(self, *, after: str | None = None, limit: int | None = None) -> TopicList:
        """One page of topics by name, those after ``after``; ``next_after`` names the
        next page (None on the last). :meth:`list_topics` reads them all."""
        return self._run(calls.list_topics_page(after, limit))

    def put_topic(
        self,
        topic: str,
        config: ConfigPatch | None = None,
        *,
        type: TopicType | None = None,  # noqa: A002 -- the wire field's name
    ) -> tuple[TopicState, bool]:
        """Create or update; returns the state and whether it was created."""
        return self._run(calls.put_topic(topic, config, type))

    def get_topic(self, topic: str, *, touch: bool = True) -> TopicState:
        return self._run(calls.get_topic(topic, touch))

    def topic_history(self, topic: str) -> TopicHistory:
        """The topic's head seq and bytes as the server sampled them over the last
        minutes (docs/console.md, "Rate history")."""
        return self._run(calls.topic_history(topic))

    def delete_topic(self, topic: str) -> None:
        return self._run(calls.delete_topic(topic))

    def append(
        self,
        topic: str,
        records: Sequence[RecordIn] | bytes,
        *,
        create: bool | None = None,
        config: ConfigPatch | None = None,
    ) -> AppendResponse:
        """Append ``records`` atomically. They may come already encoded: RecordIn JSON
        objects joined by commas into one byte string, sent byte for byte."""
        return self._run(calls.append(topic, records, create, config))

    def diff(
        self,
        topic: str,
        from_seq: int,
        *,
        limit: int = 1000,
        node: str | Sequence[str] | None = None,
        epoch: int | None = None,
        wait_ms: int = 0,
    ) -> DiffResponse:
        return self._run(calls.diff(topic, from_seq, limit, node, epoch, wait_ms))

    def diff_raw(
        self,
        topic: str,
        from_seq: int,
        *,
        limit: int = 1000,
        node: str | Sequence[str] | None = None,
        epoch: int | None = None,
        wait_ms: int = 0,
    ) -> DiffResponse[msgspec.Raw]:
        """:meth:`diff`, with each record's ``data`` left as the producer's JSON bytes."""
        return self._run(calls.diff(topic, from_seq, limit, node, epoch, wait_ms, raw=True))

    def diff_as(
        self,
        topic: str,
        from_seq: int,
        page: type[T],
        *,
        limit: int = 1000,
        node: str | Sequence[str] | None = None,
        epoch: int | None = None,
        wait_ms: int = 0,
    ) -> T:
        """:meth:`diff`, its JSON page decoded into ``page``: a msgspec Struct with the
        answer's fields the caller needs (and its records' as a Struct of their own),
        in one call with no dict per record. Decoded leniently: a meta value (always a
        string) holding a number's text decodes into an int field; a value that does
        not fit raises ``msgspec.ValidationError``. A pipeline edge's consumer reads
        with :class:`~waymark.protocol.EdgePage`."""
        return self._run(calls.diff_as(topic, from_seq, limit, node, epoch, wait_ms, page))

    def diff_arrow(
        self,
        topic: str,
        from_seq: int,
        *,
        limit: int = 1000,
        node: str | Sequence[str] | None = None,
        epoch: int | None = None,
        wait_ms: int = 0,
    ) -> ArrowPage:
        """:meth:`diff` as an Arrow page: ``.table`` holds the records (columns seq, ts,
        node, tag, meta, data as JSON text), the other fields are the JSON answer's.
        Up to ``MAX_ARROW_DIFF_LIMIT`` records a page; needs pyarrow (``[arrow]``)."""
        return self._run(calls.diff_arrow(topic, from_seq, limit, node, epoch, wait_ms))

    def delete(
        self, topic: str, *, before_seq: int | None = None, match: str | TagRule | None = None
    ) -> DeleteResponse:
        return self._run(calls.delete(topic, before_seq, match))

    # --- exactly-once writers -------------------------------------------------------
    def list_writers(self) -> list[WriterState]:
        """Every writer's epoch and, per topic, its last published batch."""
        return self._run(writers.list_writers())

    def open_writer(self, writer: str) -> OpenWriterResponse:
        """Start a new run of ``writer``: its new epoch fences every earlier run."""
        return self._run(writers.open_writer(writer))

    def stage(
        self,
        topic: str,
        records: Sequence[RecordIn] | bytes,
        *,
        writer: str,
        epoch: int,
        batch_id: int,
        partition: int,
        attempt: int,
        chunk: int = 0,
    ) -> StageResponse:
        """Stage one chunk of one task attempt's records, invisible until published.
        ``records`` may come already encoded: RecordIn JSON objects joined by commas into
        one byte string, sent byte for byte."""
        return self._run(writers.stage(
            topic, writer, epoch, batch_id, partition, attempt, records, chunk))  # fmt: skip

    def stage_data(
        self,
        topic: str,
        data: bytes | memoryview,
        lengths: Sequence[int] | bytes,
        *,
        writer: str,
        epoch: int,
        batch_id: int,
        partition: int,
        attempt: int,
        chunk: int = 0,
    ) -> StageResponse:
        """Stage one chunk of records that carry data alone, given as their data values:
        JSON texts joined by commas into one buffer, sent byte for byte, and each
        one's length in bytes (ints, or packed as little-endian uint32s). The server
        refuses the chunk (400 ``invalid_request``) unless ``data`` splits into values of
        exactly these lengths, so each value became one record."""
        return self._run(writers.stage_data(
            topic, writer, epoch, batch_id, partition, attempt, data, lengths, chunk))  # fmt: skip

    def publish(
        self, topic: str, *, writer: str, epoch: int, batch_id: int,
        parts: Sequence[StagedPart],
    ) -> PublishResponse:  # fmt: skip
        """Publish the staged parts of a batch as one atomic append (idempotent per
        ``(writer, batch_id)``: a replay returns the original seqs)."""
        return self._run(writers.publish(topic, writer, epoch, batch_id, parts))

    # --- routers (docs/semantics/topics.md §8) ---------------------------------------
    def put_router(
        self,
        name: str,
        source: str,
        dest: str,
        *,
        preserve_node: bool = True,
        preserve_tag: bool = True,
        allow_cycle: bool = False,
        guarantee: Literal["at_least_once", "exactly_once"] = "at_least_once",
        create_dest: bool = True,
        filter: RouterFilter | None = None,  # noqa: A002 -- the wire field's name
    ) -> RouterOut:
        """Forward every record committed to ``source`` (that passes ``filter``) into
        ``dest``; ``exactly_once`` copies carry an idempotency key
        (docs/semantics/topics.md §8.2)."""
        body = RouterPut(source, dest, preserve_node, preserve_tag, allow_cycle, guarantee,
                         create_dest, filter)  # fmt: skip
        return self._run(routers.put_router(name, body))

    def get_router(self, name: str) -> RouterOut:
        return self._run(routers.get_router(name))

    def list_routers(self) -> list[RouterOut]:
        return self._run(routers.list_routers())

    def delete_router(self, name: str) -> RouterDeleted:
        return self._run(routers.delete_router(name))

    # --- queues (docs/semantics/topics.md §10) ----------------------------------------------------
    def claim(
        self,
        topic: str,
        node: str,
        max: int = 1,  # noqa: A002 -- the wire field's name
        *,
        lease_ms: int | None = None,
    ) -> list[Job]:
        """Lease up to ``max`` jobs; each carries ``lease_id``, ``deadline``, ``delivery``."""
        return self._run(queues.claim(topic, node, max, lease_ms))

    def ack(
        self, topic: str, node: str, seqs: Sequence[int], *, lease_ids: Sequence[str] | None = None
    ) -> AckResponse:
        return self._run(queues.ack(topic, node, seqs, lease_ids))

    def nack(
        self,
        topic: str,
        node: str,
        seqs: Sequence[int],
        *,
        lease_ids: Sequence[str] | None = None,
        delay_ms: int = 0,
    ) -> NackResponse:
        return self._run(queues.nack(topic, node, seqs, lease_ids, delay_ms))

    def extend(
        self,
        topic: str,
        node: str,
        seqs: Sequence[int],
        *,
        lease_ids: Sequence[str] | None = None,
        lease_ms: int | None = None,
    ) -> ExtendResponse:
        return self._run(queues.extend(topic, node, seqs, lease_ids, lease_ms))

    def redrive(
        self,
        topic: str,
        max: int = 1000,  # noqa: A002 -- the wire field's name
    ) -> RedriveResponse:
        return self._run(queues.redrive(topic, max))

    def openapi(self) -> dict[str, Any]:
        return self._run(calls.openapi())

    def metrics(self) -> str:
        return self._run(calls.metrics())

    # --- change checkpoints (docs/semantics/recovery.md §1) --------------------------
    def list_checkpoints(
        self,
        *,
        earliest_ms: int = 0,
        before: int | None = None,
        limit: int = 500,
        topics: Sequence[str] | None = None,
    ) -> CheckpointPage:
        """One page of change checkpoints, newest first, ids below ``before``."""
        return self._run(changes.list_checkpoints(earliest_ms, before, limit, topics))

    # --- status reports of folds and recovery clients (docs/reports.md) ------------
    def report_fold(self, report: FoldReport) -> FoldStatus:
        """Send a fold node's status; the answer is what the server now serves for it."""
        return self._run(reports.report_fold(report))

    def list_folds(self) -> list[FoldStatus]:
        """Every fold node's newest report, by fold then node."""
        return self._run(reports.list_folds())

    def get_fold(self, fold: str) -> list[FoldStatus]:
        """The newest report of each node of ``fold`` (404 ``not_found`` if none)."""
        return self._run(reports.get_fold(fold))

    def forget_fold(self, fold: str, nodes: Sequence[str] | None = None) -> list[FoldStatus]:
        """Forget ``fold``'s nodes (all, or ``nodes``) taken out of service; answers their
        last reports (404 ``not_found`` if none). A node that reports again is back."""
        return self._run(reports.forget_fold(fold, list(nodes) if nodes else None))

    def report_pipeline(self, report: PipelineReport) -> PipelineStatus:
        """Send a pipeline's status (docs/pipeline.md); the answer is what the server
        now serves for that pipeline run."""
        return self._run(reports.report_pipeline(report))

    def list_pipelines(self) -> list[PipelineStatus]:
        """Every pipeline run's newest status, by pipeline then run."""
        return self._run(reports.list_pipelines())

    def forget_pipeline(
        self, pipeline: str, runs: Sequence[str] | None = None
    ) -> list[PipelineStatus]:
        """Forget ``pipeline``'s runs (all, or ``runs``); answers their last status (404
        ``not_found`` if none). A run that reports again is back."""
        return self._run(reports.forget_pipeline(pipeline, list(runs) if runs else None))

    def report_recovery(self, report: RecoveryReport) -> RecoveryClient:
        """Send a recovery client's receipt status."""
        return self._run(reports.report_recovery(report))

    def list_recovery_clients(self) -> RecoveryClientList:
        """Every recovery client's newest report, and the newest change checkpoint."""
        return self._run(reports.list_recovery_clients())

    def forget_recovery_client(self, client: str) -> RecoveryClient:
        """Forget a recovery client taken out of service; answers its last report."""
        return self._run(reports.forget_recovery_client(client))
