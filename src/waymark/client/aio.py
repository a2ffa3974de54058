"""The asyncio client: the calls of :class:`~.api.Api`, awaitable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TYPE_CHECKING, TypeVar

from ..protocol import Checkpoint, TopicState
from . import calls
from .api import Api
from .changes import CheckpointWatch
from .errors import ApiError, TransportError
from .events import E, Subscription, Watch, WatchEvent
from .patience import Outage, Patience, next_wait
from .tables import TableRead
from .transport import AsyncTransport, Origin

if TYPE_CHECKING:
    import httpx

    from ..protocol.arrow import Table
    from .httpx_transport import AsyncHttpxTransport

T = TypeVar("T")


class AsyncClient(Api):
    """A typed asyncio client for the /v0 API: every call of
    :class:`~waymark.client.Client`, awaited (``await client.append(...)``), with the
    same parameters (``token``, ``ca_file``, ``client_cert``, ``http`` an
    ``httpx.AsyncClient``, ``patience``, whose waits are ``asyncio.sleep``). Refusals
    raise :class:`~waymark.client.ApiError`. For one event loop.
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
        http: httpx.AsyncClient | None = None,
        patience: Patience | None = None,
    ) -> None:
        self.timeout = timeout
        self.patience = patience
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        origin = Origin.of(base_url, token, ca_file, client_cert)
        if http is None:
            self._transport: AsyncTransport | AsyncHttpxTransport = AsyncTransport(
                origin, self.connect_timeout
            )
        else:
            from .httpx_transport import AsyncHttpxTransport

            self._transport = AsyncHttpxTransport(http, origin, self.connect_timeout)

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _run(self, call: calls.Call[T]) -> Awaitable[T]:  # type: ignore[override]
        return self._send(call)

    async def _send(self, call: calls.Call[T]) -> T:
        outage: Outage | None = None
        while True:
            try:
                response = await self._transport.request(
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
                await asyncio.sleep(wait)

    async def read_table(
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
            read.take(await self._send(call))
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
    ) -> AsyncIterator[WatchEvent]:
        """Follow a topic over SSE; see :meth:`waymark.client.Client.watch`."""
        watch = Watch(
            topic,
            from_seq=from_seq,
            node=node,
            epoch=epoch,
            cursor=cursor,
            max_retries=max_retries,
        )
        return self._follow(watch, read_timeout)

    async def list_topics(self) -> list[TopicState]:
        """See :meth:`waymark.client.Client.list_topics`."""
        topics: list[TopicState] = []
        after: str | None = None
        while True:
            page = await self.list_topics_page(after=after)
            topics += page.topics
            if page.next_after is None:
                return topics
            after = page.next_after

    # --- change checkpoints (docs/semantics/recovery.md §1) --------------------------
    async def checkpoints(
        self, earliest_ms: int = 0, *, topics: Sequence[str] | None = None, limit: int = 1000
    ) -> AsyncIterator[Checkpoint]:
        """See :meth:`waymark.client.Client.checkpoints`."""
        before: int | None = None
        while True:
            page = await self.list_checkpoints(
                earliest_ms=earliest_ms, before=before, limit=limit, topics=topics
            )
            for checkpoint in page.checkpoints:
                yield checkpoint
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
    ) -> AsyncIterator[Checkpoint]:
        """See :meth:`waymark.client.Client.watch_checkpoints`."""
        return self._follow(CheckpointWatch(after, topics, max_retries), read_timeout)

    async def _follow(self, watch: Subscription[E], read_timeout: float) -> AsyncIterator[E]:
        while True:
            try:
                async with self._transport.stream(
                    "GET", watch.target, watch.headers, read_timeout
                ) as stream:
                    if stream.response.status_code != 200:
                        await stream.read()
                    watch.connected(stream.response)
                    async for chunk in stream:
                        for event in watch.receive(chunk):
                            yield event
                error: Exception = TransportError("the server ended the stream")
            except TransportError as exc:
                error = exc
            await asyncio.sleep(watch.backoff(error))
