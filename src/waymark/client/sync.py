"""The blocking client: the calls of :class:`~.api.Api` on blocking sockets."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from ..protocol import Checkpoint, TopicState
from . import calls
from .api import Api
from .changes import CheckpointWatch
from .errors import ApiError, TransportError
from .events import E, Subscription, Watch, WatchEvent
from .patience import Outage, Patience, next_wait
from .tables import TableRead
from .transport import Origin, SyncTransport

if TYPE_CHECKING:
    import httpx

    from ..protocol.arrow import Table
    from .httpx_transport import HttpxTransport

T = TypeVar("T")


class Client(Api):
    """A typed client for the /v0 API. Refusals raise :class:`~waymark.client.ApiError`,
    a request that got no answer :class:`~waymark.client.TransportError`.

    ``token`` (default: the ``WAYMARK_TOKEN`` environment variable) is sent as
    ``Authorization: Bearer <token>``; an ``https://`` server is verified against
    ``ca_file`` or the system's certificate store, and shown ``client_cert`` (a
    certificate file and its key file) if it asks for one. ``http``: send through this httpx
    client instead of the built-in transport (its own base URL and TLS settings apply).
    ``patience``: wait out a server outage instead of raising at once (docs/client.md,
    "Outages"). Safe to share between threads.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
        http: httpx.Client | None = None,
        patience: Patience | None = None,
    ) -> None:
        self.timeout = timeout
        self.patience = patience
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        origin = Origin.of(base_url, token, ca_file, client_cert)
        if http is None:
            self._transport: SyncTransport | HttpxTransport = SyncTransport(
                origin, self.connect_timeout
            )
        else:
            from .httpx_transport import HttpxTransport

            self._transport = HttpxTransport(http, origin, self.connect_timeout)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: calls.Call[T]) -> T:
        outage: Outage | None = None
        while True:
            try:
                response = self._transport.request(
                    call.method, call.target, call.headers, call.content,
                    self.timeout + call.extra_wait_s, call.idempotent,
                )  # fmt: skip
                return call.parse(response)
            except (TransportError, ApiError) as error:
                what = f"{call.method} {call.path}"
                retry = next_wait(self.patience, outage, error, what, call.idempotent)
                if retry is None:
                    raise
                outage, wait = retry
                outage.patience.sleep(wait)

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
        return self._follow(watch, read_timeout)

    def list_topics(self) -> list[TopicState]:
        """Every topic's state (the token's readable ones), sorted by name: the server's
        pages read one after another."""
        topics: list[TopicState] = []
        after: str | None = None
        while True:
            page = self.list_topics_page(after=after)
            topics += page.topics
            if page.next_after is None:
                return topics
            after = page.next_after

    # --- change checkpoints (docs/semantics/recovery.md §1) --------------------------
    def checkpoints(
        self, earliest_ms: int = 0, *, topics: Sequence[str] | None = None, limit: int = 1000
    ) -> Iterator[Checkpoint]:
        """Every change checkpoint back to ``earliest_ms``, newest first, a page at a time."""
        before: int | None = None
        while True:
            page = self.list_checkpoints(
                earliest_ms=earliest_ms, before=before, limit=limit, topics=topics
            )
            yield from page.checkpoints
            if page.next_before is None:
                return
            before = page.next_before

    def watch_checkpoints(
        self,
        *,
        after: int | None = None,
        topics: Sequence[str] | None = None,
        read_timeout: float = 60.0,
        max_retries: int | None = None,
    ) -> Iterator[Checkpoint]:
        """Follow new change checkpoints over SSE (after id ``after``; None: from now),
        reconnecting from the last one."""
        return self._follow(CheckpointWatch(after, topics, max_retries), read_timeout)

    def _follow(self, watch: Subscription[E], read_timeout: float) -> Iterator[E]:
        while True:
            try:
                with self._transport.stream(
                    "GET", watch.target, watch.headers, read_timeout
                ) as stream:
                    if stream.response.status_code != 200:
                        stream.read()
                    watch.connected(stream.response)
                    for chunk in stream:
                        yield from watch.receive(chunk)
                error: Exception = TransportError("the server ended the stream")
            except TransportError as exc:
                error = exc
            time.sleep(watch.backoff(error))
