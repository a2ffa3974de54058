"""Fixtures for the queue suite: raw HTTP against the shared server, a fresh queue name."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest


class QueueHttp:
    """Raw /v0 calls: the queue rules are checked on the JSON as sent."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def put(self, topic: str, status: int = 201, **config: Any) -> dict[str, Any]:
        return ok(self.http.put(f"/v0/topics/{topic}", json=config), status)

    def queue(self, topic: str, **config: Any) -> dict[str, Any]:
        return self.put(topic, type="queue", **config)

    def state(self, topic: str) -> dict[str, Any]:
        return ok(self.http.get(f"/v0/topics/{topic}", params={"touch": "false"}))

    def produce(self, topic: str, *data: Any) -> list[int]:
        records = [{"data": d} for d in data]
        return ok(self.post(topic, "records", records=records))["seqs"]

    def claim(self, topic: str, node: str, max_jobs: int = 1, **body: Any) -> list[dict[str, Any]]:
        return ok(self.post(topic, "claim", node=node, max=max_jobs, **body))["jobs"]

    def settle(self, topic: str, action: str, node: str, seqs: list[int], **body: Any
               ) -> dict[str, Any]:  # fmt: skip
        return ok(self.post(topic, action, node=node, seqs=seqs, **body))

    def diff(self, topic: str, from_seq: int = 0) -> dict[str, Any]:
        return ok(self.post(topic, "diff", from_seq=from_seq))

    def post(self, topic: str, action: str, **body: Any) -> httpx.Response:
        return self.http.post(f"/v0/topics/{topic}/{action}", json=body)


def ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return response.json()


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert body["code"] == code and body["message"]
    return body


@pytest.fixture(scope="session")
def qhttp(waymark_server: Any) -> Iterator[QueueHttp]:
    with httpx.Client(base_url=waymark_server.url, timeout=10) as client:
        yield QueueHttp(client)


@pytest.fixture
def q(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    return re.sub(r"[^A-Za-z0-9._:-]", ".", request.node.name[:50]) + "-" + uuid.uuid4().hex[:8]
