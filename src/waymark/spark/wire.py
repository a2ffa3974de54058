"""The few /v0 calls the Spark sources and sinks make, over httpx.

Kept here rather than in :mod:`waymark.client` because executors need raw bytes
in and out (a diff page becomes Arrow columns; a stage body is assembled from
Arrow columns) and a typed client would build a Python object per record.
"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import orjson

TIMEOUT = httpx.Timeout(60.0, connect=10.0)


class WaymarkHttpError(RuntimeError):
    """A refusal from the server, with its HTTP status and error code
    (docs/semantics/topics.md §11)."""

    def __init__(self, status: int, code: str, message: str, detail: dict[str, Any]) -> None:
        super().__init__(f"{status} {code}: {message} {detail or ''}".rstrip())
        self.status = status
        self.code = code
        self.detail = detail


class Row(msgspec.Struct, gc=False):
    """A record as a diff page carries it; ``data`` stays raw JSON bytes."""

    seq: int = msgspec.field(name="$seq")
    ts: int = msgspec.field(name="$ts")
    data: msgspec.Raw
    node: str | None = msgspec.field(default=None, name="$node")
    tag: str | None = msgspec.field(default=None, name="$tag")
    meta: dict[str, str] | None = None


class Tombstone(msgspec.Struct):
    seq: int = msgspec.field(name="$seq")
    gap_from: int
    gap_to: int
    reason: str
    missed_estimate: int


class Page(msgspec.Struct, gc=False):
    records: list[Row]
    tombstone: Tombstone | None
    next_from_seq: int
    head_seq: int
    epoch: int


_page = msgspec.json.Decoder(Page)


def client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=TIMEOUT)


def check(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            error = {"code": "http_error", "message": response.text[:500], "detail": {}}
        raise WaymarkHttpError(
            response.status_code, error["code"], error["message"], error.get("detail") or {}
        )
    return response


def topic_state(http: httpx.Client, topic: str) -> dict[str, Any] | None:
    """The topic's state without counting as consumption; None if it does not exist."""
    response = http.get(f"/v0/topics/{topic}", params={"touch": "false"})
    if response.status_code == 404:
        return None
    return check(response).json()


def diff(
    http: httpx.Client, topic: str, from_seq: int, limit: int, epoch: int, node: str | None
) -> Page:
    body: dict[str, Any] = {"from_seq": from_seq, "limit": limit, "epoch": epoch}
    if node is not None:
        body["node"] = node
    response = http.post(f"/v0/topics/{topic}/diff", content=orjson.dumps(body))
    return _page.decode(check(response).content)


def append(http: httpx.Client, topic: str, records: list[dict[str, Any]]) -> list[int]:
    response = http.post(f"/v0/topics/{topic}/records", content=orjson.dumps({"records": records}))
    return check(response).json()["seqs"]


def open_writer(http: httpx.Client, writer: str) -> int:
    response = http.post("/v0/writers", content=orjson.dumps({"writer": writer}))
    return check(response).json()["epoch"]


def stage(http: httpx.Client, topic: str, head: dict[str, Any], records: list[bytes]) -> bool:
    """Stage one chunk; ``records`` are encoded RecordIn objects. False: already published."""
    body = orjson.dumps(head)[:-1] + b',"records":[' + b",".join(records) + b"]}"
    return check(http.post(f"/v0/topics/{topic}/stage", content=body)).json()["accepted"]


def publish(http: httpx.Client, topic: str, body: dict[str, Any]) -> dict[str, Any]:
    return check(http.post(f"/v0/topics/{topic}/publish", content=orjson.dumps(body))).json()
