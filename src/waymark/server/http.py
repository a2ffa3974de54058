"""Minimal ASGI request and response types.

A deliberately small subset of what Starlette offers: the append hot path pays
for one object and one body read, not for a middleware stack, so the server
stays close to the speed of a bare ASGI callable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qs

import msgspec

from ..log import ErrorCode, TopicError
from ..protocol import RecordIn

T = TypeVar("T")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"
# A body larger than this is joined and decoded on a worker thread (off_loop).
OFF_LOOP_BYTES = 1 << 20


class Request:
    """One HTTP request: its scope, its path parameters and a way to read its body."""

    __slots__ = ("_query", "params", "receive", "scope")

    def __init__(self, scope: Scope, receive: Receive, params: dict[str, str]) -> None:
        self.scope = scope
        self.receive = receive
        self.params = params
        self._query: dict[str, list[str]] | None = None

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower-case bytes), if present."""
        for key, value in self.scope["headers"]:
            if key == name:
                return value
        return None

    @property
    def query(self) -> dict[str, list[str]]:
        if self._query is None:
            self._query = parse_qs(self.scope["query_string"].decode("latin-1"), True)
        return self._query

    async def body(self, max_bytes: int) -> bytes:
        """The whole body (see :meth:`body_parts`)."""
        parts = await self.body_parts(max_bytes)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def body_parts(self, max_bytes: int) -> list[bytes]:
        """The whole body as received, in parts (joining a large one is left to
        :func:`off_loop`), refused with 413 body_too_large as soon as it exceeds
        ``max_bytes``.

        A body that arrived whole is only measured (the append hot path). Otherwise
        the declared Content-Length is checked before reading on, and the running size
        while reading, so an oversized body is never buffered in full.
        """
        json_body = _is_json(self.header(b"content-type"))
        message = await self.receive()
        chunk = message.get("body", b"")
        if not message.get("more_body", False):
            if len(chunk) > max_bytes:
                raise _too_large(max_bytes)
            if chunk and not json_body:
                raise _not_json(self.header(b"content-type"))
            return [chunk]
        if not json_body:  # more body follows, so there is one
            raise _not_json(self.header(b"content-type"))
        declared = self.header(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            raise _too_large(max_bytes)
        chunks, size = [chunk], len(chunk)
        while message.get("more_body", False):
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise TopicError(ErrorCode.INVALID_REQUEST, "client disconnected mid-body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(max_bytes)
            chunks.append(chunk)
        return chunks


async def off_loop(parts: list[bytes], work: Callable[[bytes], T]) -> T:
    """``work(body)`` for a body received in ``parts``: inline for a small body, on a
    worker thread for one larger than ``OFF_LOOP_BYTES``. Joining, decoding and
    validating a 50 MB append held the event loop for most of a second, and every
    other client's requests with it (docs/security.md, Limits)."""
    if len(parts) == 1 and len(parts[0]) <= OFF_LOOP_BYTES:  # the hot path
        return work(parts[0])
    if not is_large(parts):
        return work(b"".join(parts))
    return await asyncio.to_thread(lambda: work(b"".join(parts)))


def is_large(parts: list[bytes]) -> bool:
    """Whether a body received in ``parts`` is one :func:`off_loop` works on a thread."""
    return (len(parts) > 1 or len(parts[0]) > OFF_LOOP_BYTES) and (
        sum(map(len, parts)) > OFF_LOOP_BYTES
    )


def _is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    return content_type == JSON or content_type.split(b";", 1)[0].strip().lower() == JSON


def _not_json(content_type: bytes | None) -> TopicError:
    # Every body is JSON. Requiring the type says so, and is what keeps a page on another
    # origin from writing: a browser sends a form, or a no-cors fetch, only as text/plain,
    # a form type or no type at all, and asks the server first before any other
    # (docs/security.md, "Browsers").
    got = "none" if content_type is None else content_type.decode("latin-1")
    return TopicError(
        ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        f"a request body must be sent as Content-Type: application/json (got {got}; "
        "with curl: --json '...', or -H 'content-type: application/json')",
        {"content_type": got},
    )


def _too_large(max_bytes: int) -> TopicError:
    return TopicError(
        ErrorCode.BODY_TOO_LARGE,
        f"request body is larger than {max_bytes} bytes",
        {"max_bytes": max_bytes},
    )


class BodyDecoder(Generic[T]):
    """A request body decoder whose every refusal is a 400 ``invalid_request``.

    msgspec raises ``UnicodeDecodeError`` for invalid UTF-8 inside a string (a tag, a
    meta value) and ``RecursionError`` for deeply nested JSON, neither a
    ``DecodeError``: they were answered 500 as if the server had failed.
    """

    def __init__(
        self,
        type: type[T],  # noqa: A002 -- msgspec's own name
        check: Callable[[T], object] | None = None,
    ) -> None:
        """``check``: called with each decoded body, raising what it refuses."""
        self._decoder = msgspec.json.Decoder(type)
        self._check = check

    def decode(self, body: bytes) -> T:
        try:
            decoded = self._decoder.decode(body)
        except UnicodeDecodeError as exc:
            raise TopicError(
                ErrorCode.INVALID_REQUEST, f"request body is not valid UTF-8: {exc.reason}"
            ) from None
        except RecursionError:
            raise TopicError(
                ErrorCode.INVALID_REQUEST, "request body is nested too deeply"
            ) from None
        if self._check is not None:
            self._check(decoded)
        return decoded


def refuse_server_meta(records: Sequence[RecordIn]) -> None:
    """Refuse (400 ``invalid_request``) a record whose meta has a key starting with
    ``$``: those are the server's own (docs/semantics/topics.md §1.1). One scan of all
    the keys joined; a hit is confirmed key by key (a key may itself hold the
    separator)."""
    metas = [meta for meta in map(_meta_of, records) if meta]
    if not metas:
        return
    keys = "\x00".join(chain.from_iterable(metas))
    if not keys.startswith("$") and "\x00$" not in keys:
        return
    for index, meta in enumerate(map(_meta_of, records)):
        for key in meta or ():
            if key.startswith("$"):
                raise TopicError(
                    ErrorCode.INVALID_REQUEST,
                    f"invalid request body: record {index}: meta key {key!r} starts with '$', "
                    "which only the server's own keys do",
                    {"index": index, "key": key},
                )


_meta_of = attrgetter("meta")


class Response:
    """A complete response whose body is already encoded."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        body: bytes | bytearray,  # bytearray: an Arrow page written in place
        status: int = 200,
        content_type: bytes = JSON,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        self.body = body
        self.status = status
        self.content_type = content_type
        self.headers = headers

    def start(self) -> Message:
        """The ``http.response.start`` message."""
        return {
            "type": "http.response.start",
            "status": self.status,
            "headers": [
                (b"content-type", self.content_type),
                (b"content-length", b"%d" % len(self.body)),
                *self.headers,
            ],
        }

    async def __call__(self, send: Send, receive: Receive) -> None:
        await send(self.start())
        await send({"type": "http.response.body", "body": self.body})


Handler = Callable[[Request], Awaitable[Response]]
