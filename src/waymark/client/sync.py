"""The blocking client."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import httpx
import msgspec

from ..protocol import (
    AckResponse,
    AppendResponse,
    ConfigPatch,
    DeleteResponse,
    DiffResponse,
    ExtendResponse,
    Health,
    Job,
    NackResponse,
    OpenWriterResponse,
    PublishResponse,
    RecordIn,
    RedriveResponse,
    RouterDeleted,
    RouterFilter,
    RouterOut,
    RouterPut,
    StagedPart,
    StageResponse,
    TagRule,
    TopicState,
    TopicType,
)
from . import calls, queues, routers, writers
from .events import Watch, WatchEvent
from .tables import TableRead

if TYPE_CHECKING:
    from ..protocol.arrow import ArrowPage, Table

T = TypeVar("T")


class Client:
    """A typed client for the /v0 API. Refusals raise :class:`~waymark.client.ApiError`."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self.timeout = timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        self._http = http or httpx.Client(
            base_url=base_url, timeout=httpx.Timeout(timeout, connect=self.connect_timeout)
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: calls.Call[T]) -> T:
        response = self._http.request(
            call.method,
            call.path,
            content=call.content,
            params=call.params,
            headers=call.headers,
            timeout=httpx.Timeout(self.timeout + call.extra_wait_s, connect=self.connect_timeout),
        )
        return call.parse(response)

    def health(self) -> Health:
        return self._run(calls.health())

    def list_topics(self) -> list[TopicState]:
        return self._run(calls.list_topics())

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

    def delete_topic(self, topic: str) -> None:
        self._run(calls.delete_topic(topic))

    def append(
        self,
        topic: str,
        records: Sequence[RecordIn],
        *,
        create: bool | None = None,
        config: ConfigPatch | None = None,
    ) -> AppendResponse:
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

    def read_table(
        self,
        topic: str,
        from_seq: int = 0,
        *,
        node: str | Sequence[str] | None = None,
        skip_gaps: bool = False,
    ) -> Table:
        """Every record after ``from_seq`` up to the head when the read begins, as one
        Arrow table: ``polars.from_arrow(t)``, ``duckdb.sql("from t")``, ``t.to_pandas()``.
        A gap (a tombstone) raises :class:`~waymark.client.TopicGap` unless ``skip_gaps``."""
        read = TableRead(topic, from_seq, node, skip_gaps)
        while (call := read.next_call()) is not None:
            read.take(self._run(call))
        return read.table()

    def delete(
        self, topic: str, *, before_seq: int | None = None, match: str | TagRule | None = None
    ) -> DeleteResponse:
        return self._run(calls.delete(topic, before_seq, match))

    # --- exactly-once writers -------------------------------------------------------
    def open_writer(self, writer: str) -> OpenWriterResponse:
        """Start a new run of ``writer``: its new epoch fences every earlier run."""
        return self._run(writers.open_writer(writer))

    def stage(
        self,
        topic: str,
        records: Sequence[RecordIn],
        *,
        writer: str,
        epoch: int,
        batch_id: int,
        partition: int,
        attempt: int,
        chunk: int = 0,
    ) -> StageResponse:
        """Stage one chunk of one task attempt's records, invisible until published."""
        return self._run(writers.stage(
            topic, writer, epoch, batch_id, partition, attempt, records, chunk))  # fmt: skip

    def stage_encoded(
        self,
        topic: str,
        records: Sequence[bytes],
        *,
        writer: str,
        epoch: int,
        batch_id: int,
        partition: int,
        attempt: int,
        chunk: int = 0,
    ) -> StageResponse:
        """:meth:`stage` with each record already encoded as a RecordIn JSON object."""
        return self._run(writers.stage_encoded(
            topic, writer, epoch, batch_id, partition, attempt, records, chunk))  # fmt: skip

    def stage_joined(
        self,
        topic: str,
        records: bytes,
        *,
        writer: str,
        epoch: int,
        batch_id: int,
        partition: int,
        attempt: int,
        chunk: int = 0,
    ) -> StageResponse:
        """:meth:`stage` with the records already encoded as RecordIn JSON objects joined
        by commas into one byte string."""
        return self._run(writers.stage_joined(
            topic, writer, epoch, batch_id, partition, attempt, records, chunk))  # fmt: skip

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
        self, topic: str, max: int = 1000  # noqa: A002 -- the wire field's name
    ) -> RedriveResponse:
        return self._run(queues.redrive(topic, max))

    def openapi(self) -> dict[str, Any]:
        return self._run(calls.openapi())

    def metrics(self) -> str:
        return self._run(calls.metrics())

    def watch(
        self,
        topic: str,
        *,
        from_seq: int = 0,
        node: str | Sequence[str] | None = None,
        epoch: int | None = None,
        cursor: str | None = None,
        read_timeout: float = 60.0,
        max_retries: int | None = None,
    ) -> Iterator[WatchEvent]:
        """Follow a topic over SSE, reconnecting from the last event's cursor.

        ``cursor`` (an event's ``.cursor``) resumes an earlier watch. A connection
        silent for ``read_timeout`` seconds (no heartbeat either) is re-opened;
        ``max_retries`` consecutive failed reconnects raise (None: retry forever).
        """
        watch = Watch(
            topic,
            from_seq=from_seq,
            node=node,
            epoch=epoch,
            cursor=cursor,
            max_retries=max_retries,
        )
        timeout = httpx.Timeout(self.timeout, read=read_timeout)
        while True:
            try:
                with self._http.stream(
                    "GET", watch.path, params=watch.params, headers=watch.headers, timeout=timeout
                ) as response:
                    if response.status_code != 200:
                        response.read()
                    watch.connected(response)
                    for line in response.iter_lines():
                        if (event := watch.feed(line)) is not None:
                            yield event
                error: Exception = ConnectionResetError("the server ended the stream")
            except httpx.TransportError as exc:
                error = exc
            time.sleep(watch.backoff(error))
