"""Request building and response parsing, shared by the sync and async clients.

Each function returns a :class:`Call`: everything needed to send one request
and to turn its response into a typed value. The clients only move bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from ..log import ConfigPatch, RecordIn, TopicType
from ..server.schemas import (
    AppendRequest,
    AppendResponse,
    DeleteRequest,
    DeleteResponse,
    DiffRequest,
    DiffResponse,
    Health,
    TagRule,
    TopicList,
    TopicPut,
    TopicState,
)
from .errors import ApiError

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    content: bytes | None = None
    params: dict[str, Any] | None = None
    # Extra seconds the read may take beyond the client's timeout (long-polls).
    extra_wait_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


def topic_path(topic: str, suffix: str = "") -> str:
    return f"/v0/topics/{quote(topic, safe='')}{suffix}"


def check(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        raise ApiError.from_response(response)
    return response


def _typed(type_: type[T]) -> Callable[[httpx.Response], T]:
    decoder = msgspec.json.Decoder(type_)
    return lambda response: decoder.decode(check(response).content)


_health = _typed(Health)
_state = _typed(TopicState)
_topics = _typed(TopicList)
_append = _typed(AppendResponse)
_diff = _typed(DiffResponse)
_delete = _typed(DeleteResponse)


def health() -> Call[Health]:
    return Call("GET", "/v0/health", _health)


def list_topics() -> Call[list[TopicState]]:
    return Call("GET", "/v0/topics", lambda r: _topics(r).topics)


def put_topic(
    topic: str, config: ConfigPatch | None, type: TopicType | None
) -> Call[tuple[TopicState, bool]]:
    fields = msgspec.structs.asdict(config) if config is not None else {}
    body = TopicPut(**fields, type=type)
    return Call(
        "PUT", topic_path(topic), lambda r: (_state(r), r.status_code == 201), _encode(body)
    )


def get_topic(topic: str, touch: bool) -> Call[TopicState]:
    return Call("GET", topic_path(topic), _state, params=None if touch else {"touch": "false"})


def _nothing(response: httpx.Response) -> None:
    check(response)


def delete_topic(topic: str) -> Call[None]:
    return Call("DELETE", topic_path(topic), _nothing)


def append(
    topic: str, records: Sequence[RecordIn], create: bool | None, config: ConfigPatch | None
) -> Call[AppendResponse]:
    body = AppendRequest(list(records), create, config)
    return Call("POST", topic_path(topic, "/records"), _append, _encode(body))


def diff(
    topic: str,
    from_seq: int,
    limit: int,
    node: str | Sequence[str] | None,
    epoch: int | None,
    wait_ms: int,
) -> Call[DiffResponse]:
    nodes = node if node is None or isinstance(node, str) else list(node)
    body = DiffRequest(from_seq, limit, nodes, epoch, wait_ms)
    return Call(
        "POST", topic_path(topic, "/diff"), _diff, _encode(body), extra_wait_s=wait_ms / 1000
    )


def delete(topic: str, before_seq: int | None, match: str | TagRule | None) -> Call[DeleteResponse]:
    body = DeleteRequest(before_seq, match)
    return Call("POST", topic_path(topic, "/delete"), _delete, _encode(body))


def openapi() -> Call[dict[str, Any]]:
    return Call("GET", "/v0/openapi.json", lambda r: msgspec.json.decode(check(r).content))


def metrics() -> Call[str]:
    return Call("GET", "/metrics", lambda r: check(r).text)
