"""The /v0 router routes (docs/semantics/topics.md §8) and the task that drives forwarding.

* ``PUT /v0/routers/{router}`` ``{source, dest, preserve_node?, preserve_tag?, allow_cycle?,
  guarantee?, create_dest?}`` -> the router (201 when created).
* ``GET /v0/routers/{router}``, ``DELETE /v0/routers/{router}``, ``GET /v0/routers``.

Forwarding never runs inside a request: a commit to a router source adds a forwarding
step of that source to the delivery rounds (:class:`Forwarder`), which run it after the
request, ordered by the source's priority; a source append acks without waiting on it.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import msgspec
import orjson
from msgspec import Meta, Struct

from ..log import Engine, Limits
from .delivery import Deliveries
from .http import Request, Response
from .openapi import Operation
from .schemas import TagRule

TopicName = Annotated[str, Meta(min_length=1, max_length=255)]
# A dest refusing copies (discard: reject) is retried after this, doubling up to the cap.
BACKOFF_S = 0.05
BACKOFF_MAX_S = 2.0
PASS_RECORDS = 1000  # per router per pass: one pass never holds the loop for long


class RouterFilter(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Forward only records passing every key given: a tag match (as in deletes), a
    $node among ``node``, a $node not among ``not_node``."""

    tag: str | TagRule | None = None
    node: Annotated[list[str], Meta(min_length=1)] | None = None
    not_node: Annotated[list[str], Meta(min_length=1)] | None = None


class RouterPut(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``PUT /v0/routers/{router}``: forward every record committed to source into dest."""

    source: TopicName
    dest: TopicName
    preserve_node: bool = True
    preserve_tag: bool = True
    allow_cycle: bool = False
    guarantee: Literal["at_least_once", "exactly_once"] = "at_least_once"
    create_dest: bool = True
    filter: RouterFilter | None = None


class RouterOut(Struct):
    name: str
    source: str
    dest: str
    preserve_node: bool
    preserve_tag: bool
    filter: RouterFilter | None
    allow_cycle: bool
    guarantee: str
    created_ts: int
    cursor: int  # the last source seq forwarded
    source_trimmed: int  # source records evicted before forwarding (since start-up)


class RouterList(Struct):
    routers: list[RouterOut]


class RouterDeleted(Struct):
    router: str
    deleted: bool


_put = msgspec.json.Decoder(RouterPut)


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
        routers = self.engine.routers
        if not routers.has_routers() or topic in self._held or topic not in routers.sources():
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # an engine used outside the server: its owner calls forward()
        self.deliveries.add(self._step, topic)

    def resume(self) -> None:
        """Recovered routers resume from their cursors without waiting for a write."""
        for source in self.engine.routers.sources():
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
        if source not in self.engine.routers.sources():
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
            filter=None if body.filter is None else msgspec.to_builtins(body.filter),
        )  # fmt: skip
        await self._durable(router.source)
        return Response(orjson.dumps(router.to_wire()), 201 if created else 200)

    async def get_router(self, request: Request) -> Response:
        return Response(orjson.dumps(self.engine.get_router(request.params["router"]).to_wire()))

    async def list_routers(self, request: Request) -> Response:
        routers = [r.to_wire() for r in self.engine.list_routers()]
        return Response(orjson.dumps({"routers": routers}))

    async def delete_router(self, request: Request) -> Response:
        name = request.params["router"]
        source = self.engine.get_router(name).source
        self.engine.delete_router(name)
        await self._durable(source)
        return Response(orjson.dumps({"router": name, "deleted": True}))

    async def _durable(self, source: str) -> None:
        # Router definitions are control frames (in the source's shard): acked once durable.
        commit = self.engine.commit_point(source)
        if commit is not None:
            await commit.wait()


_R = "/v0/routers/{router}"
_ROUTER_PARAM = {
    "name": "router",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$"},
}

OPERATIONS = (
    Operation("put", _R, "putRouter",
              "Create a router source -> dest (409 router_cycle, 409 router_dest_fan_in)",
              ok_type=RouterOut, body=RouterPut, errors=(400, 404, 409),
              query=(_ROUTER_PARAM,)),
    Operation("get", _R, "getRouter", "A router and its forward cursor", ok_type=RouterOut,
              query=(_ROUTER_PARAM,)),
    Operation("delete", _R, "deleteRouter",
              "Stop forwarding; copies already in dest remain", ok_type=RouterDeleted,
              query=(_ROUTER_PARAM,)),
    Operation("get", "/v0/routers", "listRouters", "Every router, by name",
              ok_type=RouterList, errors=()),
)  # fmt: skip
