"""Fixtures for the router suite: raw HTTP against the shared server, fresh names."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest


class RouterHttp:
    """Raw /v0 calls: the router rules are checked on the JSON as sent."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def put_router(self, name: str, **body: Any) -> httpx.Response:
        return self.http.put(f"/v0/routers/{name}", json=body)

    def produce(self, topic: str, *data: Any, **fields: Any) -> list[int]:
        records = [{"data": d, **fields} for d in data]
        response = self.http.post(f"/v0/topics/{topic}/records", json={"records": records})
        return ok(response)["seqs"]

    def records(self, topic: str) -> list[dict[str, Any]]:
        """Every record of ``topic``, across pages and crash holes."""
        out: list[dict[str, Any]] = []
        cursor = 0
        while True:
            page = ok(self.http.post(f"/v0/topics/{topic}/diff", json={"from_seq": cursor}))
            out += page["records"]
            if page["next_from_seq"] >= page["head_seq"]:
                return out
            cursor = page["next_from_seq"]

    def data(self, topic: str) -> list[Any]:
        return [r["data"] for r in self.records(topic)]


def ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return response.json()


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["code"] == code and body["message"]
    return body


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Forwarding is asynchronous: wait (bounded) for ``check`` to hold."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "forwarding did not catch up in time"
        time.sleep(0.02)


@pytest.fixture(scope="session")
def rhttp(waymark_server: Any) -> Iterator[RouterHttp]:
    with httpx.Client(base_url=waymark_server.url, timeout=10) as client:
        yield RouterHttp(client)


@pytest.fixture
def n(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Names no other test uses: n("a") is this test's topic or router "a"."""
    prefix = re.sub(r"[^A-Za-z0-9._:-]", ".", request.node.name[:40]) + uuid.uuid4().hex[:6]
    return lambda name: f"{prefix}-{name}"
