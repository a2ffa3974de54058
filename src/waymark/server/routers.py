"""The /v0 router routes (§8; bodies: :mod:`waymark.protocol.routers`) and the task
that drives forwarding.

Forwarding never runs inside a request: every commit schedules one coalesced pass on
the event loop (:class:`Forwarder`), so a source append acks without waiting on it.
"""

from __future__ import annotations

import asyncio

import msgspec

from ..log import Engine, Limits
from ..protocol import RouterDeleted, RouterList, RouterPut
from .http import Request, Response

# A dest refusing copies (discard: reject) is retried after this, doubling up to the cap.
BACKOFF_S = 0.05
BACKOFF_MAX_S = 2.0
PASS_RECORDS = 1000  # per router per pass: one pass never holds the loop for long


_put = msgspec.json.Decoder(RouterPut)
_encode = msgspec.json.encode


class Forwarder:
    """Runs :meth:`Engine.forward` on the loop after commits, coalescing bursts."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def poke(self, topic: str) -> None:
        """An engine listener: something committed; forward soon (never now)."""
        if not self.engine.routers.has_routers():
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # an engine used outside the server: its owner calls forward()
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        backoff = BACKOFF_S
        while True:
            await asyncio.sleep(0)  # after the committing request has been answered
            self._again = False
            result = self.engine.forward(PASS_RECORDS)
            if result.blocked:
                await asyncio.sleep(backoff)  # dest backpressure: the cursor held
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            else:
                backoff = BACKOFF_S
            if not (result.pending or self._again):
                return


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
            filter=None if body.filter is None else msgspec.to_builtins(body.filter),
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
