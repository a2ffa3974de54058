"""Fixtures for the HTTP conformance suite: a real server process, raw HTTP, a topic;
and an in-memory app on a manual clock with an asyncio client over ASGI."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from waymark.client import AsyncClient
from waymark.clock import ManualClock
from waymark.server import App


class Api:
    """Raw HTTP against the server: wire-level checks need the JSON as sent."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def put(self, topic: str, status: int | None = None, **config: Any) -> dict[str, Any]:
        return self._ok(self.http.put(f"/v0/topics/{topic}", json=config), status)

    def state(self, topic: str, **params: Any) -> dict[str, Any]:
        return self._ok(self.http.get(f"/v0/topics/{topic}", params=params))

    def append(self, topic: str, *records: dict[str, Any], **body: Any) -> dict[str, Any]:
        return self._ok(self.post(topic, "records", records=list(records), **body))

    def write(self, topic: str, *data: Any) -> list[int]:
        """Append one record per value; their seqs."""
        return self.append(topic, *({"data": d} for d in data))["seqs"]

    def diff(self, topic: str, from_seq: int, **body: Any) -> dict[str, Any]:
        return self._ok(self.post(topic, "diff", from_seq=from_seq, **body))

    def delete(self, topic: str, **body: Any) -> dict[str, Any]:
        return self._ok(self.post(topic, "delete", **body))

    def post(self, topic: str, action: str, **body: Any) -> httpx.Response:
        return self.http.post(f"/v0/topics/{topic}/{action}", json=body)

    @staticmethod
    def _ok(response: httpx.Response, status: int | None = None) -> dict[str, Any]:
        assert response.status_code == (status or 200), response.text
        return response.json()

    @staticmethod
    def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
        """Assert ``response`` is an error with this status and code
        (docs/semantics/topics.md §11)."""
        assert response.status_code == status, response.text
        body = response.json()
        assert set(body) == {"error"}
        assert set(body["error"]) == {"code", "message", "detail"}
        assert body["error"]["code"] == code
        assert body["error"]["message"]
        return body["error"]


@pytest.fixture(scope="session")
def http(waymark_server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=waymark_server.url, timeout=10) as client:
        yield client


@pytest.fixture(scope="session")
def api(http: httpx.Client) -> Api:
    return Api(http)


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    return re.sub(r"[^A-Za-z0-9._:-]", ".", request.node.name[:60]) + "-" + uuid.uuid4().hex[:8]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def app(clock: ManualClock) -> App:
    return App(clock=clock)


@pytest.fixture
async def client(app: App) -> AsyncIterator[AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://waymark")
    async with http, AsyncClient("http://waymark", http=http) as client:
        yield client
