"""Request building for the router routes (docs/semantics/topics.md §8), shared by the sync and
async clients."""

from __future__ import annotations

from urllib.parse import quote

import msgspec

from ..server.routers import RouterDeleted, RouterList, RouterOut, RouterPut
from .calls import Call, _typed

_encode = msgspec.json.Encoder().encode
_router = _typed(RouterOut)
_list = _typed(RouterList)
_deleted = _typed(RouterDeleted)


def _path(name: str) -> str:
    return f"/v0/routers/{quote(name, safe='')}"


def put_router(name: str, body: RouterPut) -> Call[RouterOut]:
    return Call("PUT", _path(name), _router, _encode(body))


def get_router(name: str) -> Call[RouterOut]:
    return Call("GET", _path(name), _router)


def list_routers() -> Call[list[RouterOut]]:
    return Call("GET", "/v0/routers", lambda r: _list(r).routers)


def delete_router(name: str) -> Call[RouterDeleted]:
    return Call("DELETE", _path(name), _deleted)
