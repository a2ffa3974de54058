"""Request building for the router routes (docs/semantics/topics.md §8), shared by the sync and
async clients."""

from __future__ import annotations

import msgspec

from ..protocol import RouterDeleted, RouterList, RouterOut, RouterPut
from .calls import Call, call, typed

_encode = msgspec.json.Encoder().encode
_router = typed(RouterOut)
_list = typed(RouterList)
_deleted = typed(RouterDeleted)


def put_router(name: str, body: RouterPut) -> Call[RouterOut]:
    return call("putRouter", _router, _encode(body), router=name)


def get_router(name: str) -> Call[RouterOut]:
    return call("getRouter", _router, router=name)


def list_routers() -> Call[list[RouterOut]]:
    return call("listRouters", lambda r: _list(r).routers)


def delete_router(name: str) -> Call[RouterDeleted]:
    return call("deleteRouter", _deleted, router=name)
