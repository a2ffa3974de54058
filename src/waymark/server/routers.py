"""The /v0 router routes (docs/semantics/topics.md §8; bodies:
:mod:`waymark.protocol.routers`) and the task that drives forwarding.

Forwarding never runs inside a request: a commit to a router source adds a forwarding
step of that source to the delivery rounds (:class:`Forwarder`), which run it after the
request, ordered by the source's priority; a source append acks without waiting on it.
"""

from __future__ import annotations

import asyncio

import msgspec

from ..log import Engine, Limits
from ..protocol import RouterDeleted, RouterList, RouterPut
from .delivery import Deliveries
from .http import BodyDecoder, Request, Response

# A dest refusing copies (discard: reject) is retried after this, doubling up to the cap.
BACKOFF_S = 0.05
BACKOFF_MAX_S = 2.0
PASS_RECORDS = 1000  # per router per pass: one pass never holds the loop for long


_put = BodyDecoder(RouterPut)
_encode = msgspec.json.encode


class Forwarder:
    """Forwards a source's routers in delivery rounds after its commits; the steps of
    one source coalesce until one runs."""

    def __init__(self, engine: Engine, deliveries: Deliveries) -> None:
        self.engine = engine
        self.deliveries = deliveries
        self._backoff: dict[str, float] = {}  # source -> next retry delay after a refusal
        self._held: set[str] = set()  # sources waiting out that delay

    def poke(self, topic: str) -> None:
        """An engine listener: something committed; forward ``topic`` soon (never now)
        if a router reads it."""
        engine = self.engine
        if not engine.has_routers() or topic in self._held or topic not in engine.router_sources():
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # an engine used outside the server: its owner calls forward()
        self.deliveries.add(self._step, topic)

    def resume(self) -> None:
        """Recovered routers resume from their cursors without waiting for a write."""
        for source in self.engine.router_sources():
            self.poke(source)

    def _step(self, source: str) -> None:
        result = self.engine.forward(PASS_RECORDS, source)
        if result.blocked:
            # dest backpressure: the cursor held; retry after a doubling delay.
            delay = self._backoff.get(source, BACKOFF_S)
            self._backoff[source] = min(delay * 2, BACKOFF_MAX_S)
            self._held.add(source)
            asyncio.get_running_loop().call_later(delay, self._retry, source)
            return
        self._backoff.pop(source, None)
        if result.pending:
            self.deliveries.add(self._step, source)

    def _retry(self, source: str) -> None:
        self._held.discard(source)
        if source not in self.engine.router_sources():
            self._backoff.pop(source, None)  # its routers are gone
        self.poke(source)


class RouterApi:
    def __init__(self, engine: Engine, limits: Limits) -> None:
        self.engine = engine
        self.max_body = limits.max_body_bytes

    async def put_router(self, request: Request) -> Response:
        name = request.params["router"]
        body = _put.decode(await request.body(self.max_body))
        router, created = self.engine.put_router(
            name, body.source, body.dest, preserve_node=body.preserve_node,
            preserve_tag=body.preserve_tag, allow_cycle=body.allow_cycle,
            guarantee=body.guarantee, create_dest=body.create_dest,
            record_filter=None if body.filter is None else msgspec.to_builtins(body.filter),
        )  # fmt: skip
        await self._durable(router.source)
        return Response(_encode(router.out()), 201 if created else 200)

    async def get_router(self, request: Request) -> Response:
        return Response(_encode(self.engine.get_router(request.params["router"]).out()))

    async def list_routers(self, request: Request) -> Response:
        routers = [r.out() for r in self.engine.list_routers()]
        return Response(_encode(RouterList(routers)))

    async def delete_router(self, request: Request) -> Response:
        name = request.params["router"]
        source = self.engine.get_router(name).source
        self.engine.delete_router(name)
        await self._durable(source)
        return Response(_encode(RouterDeleted(name, True)))

    async def _durable(self, source: str) -> None:
        # Router definitions are control frames (in the source's shard): acked once durable.
        commit = self.engine.commit_point(source)
        if commit is not None:
            await commit.wait()
