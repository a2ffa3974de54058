"""Request building and response parsing, shared by the sync and async clients.

Each function returns a :class:`Call`: everything needed to send one request
and to turn its response into a typed value. The transports only move bytes. Methods
and paths come from the protocol's endpoint table, bodies are protocol structs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import urlencode

import msgspec

from ..protocol import (
    ARROW_STREAM,
    ENDPOINT,
    AppendRequest,
    AppendResponse,
    ConfigPatch,
    DeleteRequest,
    DeleteResponse,
    DiffRequest,
    DiffResponse,
    Health,
    RecordIn,
    TagRule,
    TopicHistory,
    TopicList,
    TopicPut,
    TopicState,
    TopicType,
    WhoAmI,
)
from .errors import Answer, ApiError

if TYPE_CHECKING:
    from ..protocol.arrow import ArrowPage

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)  # not frozen: a frozen dataclass is slower to make, per request
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[Answer], T]
    content: bytes | None = None
    params: dict[str, Any] | None = None
    # Extra seconds the read may take beyond the client's timeout (long-polls).
    extra_wait_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    # Safe to send again when a kept-alive connection turns out closed before any byte
    # of the answer came back (docs/client.md, "Retries").
    idempotent: bool = False

    @property
    def target(self) -> str:
        """The path with its query string."""
        return f"{self.path}?{urlencode(self.params, doseq=True)}" if self.params else self.path


def call(
    operation: str,
    parse: Callable[[Answer], T],
    content: bytes | None = None,
    *,
    params: dict[str, Any] | None = None,
    extra_wait_s: float = 0.0,
    headers: dict[str, str] | None = None,
    **path: str,
) -> Call[T]:
    """The call of endpoint ``operation``; ``path`` fills its path parameters."""
    method, url, idempotent = _route(operation, tuple(path.items()))
    return Call(method, url, parse, content, params, extra_wait_s, headers or {},
                idempotent=idempotent)  # fmt: skip


@lru_cache(maxsize=1024)
def _route(operation: str, path: tuple[tuple[str, str], ...]) -> tuple[str, str, bool]:
    """An endpoint's method, filled-in path and idempotence; kept for the next call to
    the same topic (the hot loop's appends)."""
    endpoint = ENDPOINT[operation]
    idempotent = endpoint.method != "POST" or operation in _READS
    return endpoint.method, endpoint.url(**dict(path)), idempotent


# POST routes that only read: sending one twice answers the same.
_READS = frozenset({"diff"})


def check(response: Answer) -> Answer:
    if response.status_code >= 400:
        raise ApiError.from_response(response)
    return response


def typed(type_: Any) -> Callable[[Answer], Any]:
    """A parser decoding a successful response's body into ``type_``."""
    decoder = msgspec.json.Decoder(type_)
    return lambda response: decoder.decode(check(response).content)


_health = typed(Health)
_whoami = typed(WhoAmI)
_state = typed(TopicState)
_topics = typed(TopicList)
_append = typed(AppendResponse)
_diff = typed(DiffResponse)
_diff_raw = typed(DiffResponse[msgspec.Raw])
_delete = typed(DeleteResponse)
_ACCEPT_ARROW = {"accept": ARROW_STREAM}


def health() -> Call[Health]:
    return call("health", _health)


def whoami() -> Call[WhoAmI]:
    return call("whoami", _whoami)


def list_topics_page(after: str | None, limit: int | None) -> Call[TopicList]:
    params: dict[str, Any] = {}
    if after is not None:
        params["after"] = after
    if limit is not None:
        params["limit"] = limit
    return call("listTopics", _topics, params=params)


def put_topic(
    topic: str, config: ConfigPatch | None, topic_type: TopicType | None
) -> Call[tuple[TopicState, bool]]:
    fields = msgspec.structs.asdict(config) if config is not None else {}
    body = TopicPut(**fields, type=topic_type)

    def parse(response: Answer) -> tuple[TopicState, bool]:
        return _state(response), response.status_code == 201

    return call("putTopic", parse, _encode(body), topic=topic)


def get_topic(topic: str, touch: bool) -> Call[TopicState]:
    return call("getTopic", _state, params=None if touch else {"touch": "false"}, topic=topic)


def topic_history(topic: str) -> Call[TopicHistory]:
    return call("getTopicHistory", typed(TopicHistory), topic=topic)


def _nothing(response: Answer) -> None:
    check(response)


def delete_topic(topic: str) -> Call[None]:
    return call("deleteTopic", _nothing, topic=topic)


class _EncodedAppend(msgspec.Struct, omit_defaults=True):
    """An AppendRequest whose records come already encoded (the same bytes on the wire)."""

    records: msgspec.Raw
    create: bool | None = None
    config: ConfigPatch | None = None


def append(
    topic: str,
    records: Sequence[RecordIn] | bytes,
    create: bool | None,
    config: ConfigPatch | None,
) -> Call[AppendResponse]:
    """``records``: RecordIn values, or RecordIn JSON objects already encoded and joined by
    commas into one byte string, sent byte for byte (a pipeline edge joins them from its
    in-flight buffers)."""
    if isinstance(records, bytes):
        encoded = _EncodedAppend(msgspec.Raw(b"[" + records + b"]"), create, config)
        return call("append", _append, _encode(encoded), topic=topic)
    body = AppendRequest(list(records), create, config)
    return call("append", _append, _encode(body), topic=topic)


def diff(
    topic: str,
    from_seq: int,
    limit: int,
    node: str | Sequence[str] | None,
    epoch: int | None,
    wait_ms: int,
    *,
    raw: bool = False,
) -> Call[DiffResponse[Any]]:
    """``raw``: records keep ``data`` as the producer's JSON bytes (``msgspec.Raw``)."""
    return _diff_call(topic, from_seq, limit, node, epoch, wait_ms, _diff_raw if raw else _diff)


def diff_as(
    topic: str,
    from_seq: int,
    limit: int,
    node: str | Sequence[str] | None,
    epoch: int | None,
    wait_ms: int,
    page: type[T],
) -> Call[T]:
    """A JSON diff page decoded into ``page``, leniently (see :func:`_lenient`)."""
    parse = _LENIENT.get(page)
    if parse is None:
        parse = _LENIENT[page] = _lenient(page)
    return _diff_call(topic, from_seq, limit, node, epoch, wait_ms, parse)


def _diff_call(
    topic: str,
    from_seq: int,
    limit: int,
    node: str | Sequence[str] | None,
    epoch: int | None,
    wait_ms: int,
    parse: Callable[[Answer], T],
) -> Call[T]:
    nodes = node if node is None or isinstance(node, str) else list(node)
    body = DiffRequest(from_seq, limit, nodes, epoch, wait_ms)
    return call("diff", parse, _encode(body), extra_wait_s=wait_ms / 1000, topic=topic)


# One parser per page type: a decoder is costly to build, and an edge reads page after page.
_LENIENT: dict[Any, Callable[[Answer], Any]] = {}


def _lenient(type_: Any) -> Callable[[Answer], Any]:
    """A parser decoding into ``type_`` with msgspec's ``strict=False``: a string that
    holds a number's text decodes into an int field (a meta value is always a string)."""
    decoder = msgspec.json.Decoder(type_, strict=False)
    return lambda response: decoder.decode(check(response).content)


def _arrow_page(response: Answer) -> ArrowPage:
    # pyarrow loads here, on the first Arrow read: `import waymark.client` stays light.
    from ..protocol.arrow import decode_page

    return decode_page(check(response).content)


def diff_arrow(
    topic: str,
    from_seq: int,
    limit: int,
    node: str | Sequence[str] | None,
    epoch: int | None,
    wait_ms: int,
) -> Call[ArrowPage]:
    """A diff page as Arrow (docs/http-api.md, "Arrow pages"): up to
    ``MAX_ARROW_DIFF_LIMIT`` records."""
    nodes = node if node is None or isinstance(node, str) else list(node)
    body = DiffRequest(from_seq, limit, nodes, epoch, wait_ms)
    return call("diff", _arrow_page, _encode(body), extra_wait_s=wait_ms / 1000,
                headers=_ACCEPT_ARROW, topic=topic)  # fmt: skip


def delete(topic: str, before_seq: int | None, match: str | TagRule | None) -> Call[DeleteResponse]:
    body = DeleteRequest(before_seq, match)
    return call("deleteRecords", _delete, _encode(body), topic=topic)


def openapi() -> Call[dict[str, Any]]:
    return call("openapi", lambda r: msgspec.json.decode(check(r).content))


def metrics() -> Call[str]:
    return call("metrics", lambda r: check(r).text)
