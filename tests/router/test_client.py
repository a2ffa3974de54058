"""The Python client's router calls, sync and async, against the real server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from waymark.client import ApiError, AsyncClient, Client, RecordIn

from .conftest import eventually


def test_sync_client_manages_routers(waymark_server: Any, n: Callable[[str], str]) -> None:
    with Client(waymark_server.url) as client:
        made = client.put_router(n("r"), n("a"), n("b"), preserve_tag=False)
        assert (made.source, made.dest, made.preserve_tag) == (n("a"), n("b"), False)
        client.append(n("a"), [RecordIn.of(1, tag="t")])
        eventually(lambda: client.get_router(n("r")).cursor == 1)
        assert n("r") in [r.name for r in client.list_routers()]
        with pytest.raises(ApiError) as refused:
            client.put_router(n("back"), n("b"), n("a"))
        assert (refused.value.status, refused.value.code) == (409, "router_cycle")
        assert client.delete_router(n("r")).deleted
        with pytest.raises(ApiError) as missing:
            client.get_router(n("r"))
        assert (missing.value.status, missing.value.code) == (404, "router_not_found")


async def test_async_client_manages_routers(waymark_server: Any, n: Callable[[str], str]) -> None:
    async with AsyncClient(waymark_server.url) as client:
        made = await client.put_router(n("r"), n("a"), n("b"))
        assert made.guarantee == "at_least_once"
        assert (await client.get_router(n("r"))).name == n("r")
        assert n("r") in [r.name for r in await client.list_routers()]
        assert (await client.delete_router(n("r"))).router == n("r")
