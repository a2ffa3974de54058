"""Every refusal: ``{"error": {"code", "message", "detail"}}`` with the code's HTTP status.

:class:`ErrorCode` lists every code a waymark server sends; each has one status.
Clients decode :class:`Error` with ``code`` as a plain string, so a code added to a
newer server still decodes (the client maps known ones onto :class:`ErrorCode`).

The root of waymark's exceptions is here too: :class:`WaymarkError`, and under it
:class:`Refusal`, the one concept of a refused request that the engine's ``TopicError``
and the client's ``ApiError`` both are (the tree: docs/errors.md).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from msgspec import Struct


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request"
    INVALID_TOPIC_NAME = "invalid_topic_name"
    INVALID_RECORD = "invalid_record"  # data a reader could not decode (index named)
    RECORD_TOO_LARGE = "record_too_large"
    TAG_TOO_LONG = "tag_too_long"
    NODE_TOO_LONG = "node_too_long"
    META_TOO_LARGE = "meta_too_large"
    TOO_MANY_RECORDS = "too_many_records"
    BODY_TOO_LARGE = "body_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # a body not sent as application/json
    TOPIC_NOT_FOUND = "topic_not_found"
    TOPIC_FULL = "topic_full"
    TOPIC_EXISTS_INCOMPATIBLE = "topic_exists_incompatible"
    NOT_A_QUEUE = "not_a_queue"
    ROUTER_CYCLE = "router_cycle"
    ROUTER_NOT_FOUND = "router_not_found"
    FENCED = "fenced"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    UNAUTHORIZED = "unauthorized"  # no token, or one the server does not know
    FORBIDDEN = "forbidden"  # a valid token without the endpoint's scope
    TOKEN_EXPIRED = "token_expired"  # a known token past its expiry time
    RATE_LIMITED = "rate_limited"  # a token past its request rate (Retry-After says when)
    REQUEST_TIMEOUT = "request_timeout"  # headers not complete within the read timeout
    HEADERS_TOO_LARGE = "headers_too_large"  # request line and headers past the limit
    TOO_MANY_STREAMS = "too_many_streams"  # the server's SSE stream limit
    TOO_MANY_TOPICS = "too_many_topics"  # the server's topic limit
    STAGING_FULL = "staging_full"  # unpublished staged bytes, per writer or in all
    SERVER_BUSY = "server_busy"  # the server's connection limit
    INTERNAL = "internal"  # a server fault, never a refusal of the request's content

    @property
    def status(self) -> int:
        """The HTTP status every response with this code has."""
        return STATUS[self]


STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_TOPIC_NAME: 400,
    ErrorCode.INVALID_RECORD: 400,
    ErrorCode.RECORD_TOO_LARGE: 400,
    ErrorCode.TAG_TOO_LONG: 400,
    ErrorCode.NODE_TOO_LONG: 400,
    ErrorCode.META_TOO_LARGE: 400,
    ErrorCode.TOO_MANY_RECORDS: 400,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.TOPIC_NOT_FOUND: 404,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.ROUTER_NOT_FOUND: 404,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.TOKEN_EXPIRED: 401,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.TOPIC_EXISTS_INCOMPATIBLE: 409,
    ErrorCode.NOT_A_QUEUE: 409,
    ErrorCode.ROUTER_CYCLE: 409,
    ErrorCode.FENCED: 409,
    ErrorCode.TOPIC_FULL: 422,
    ErrorCode.TOO_MANY_STREAMS: 429,
    ErrorCode.HEADERS_TOO_LARGE: 431,
    ErrorCode.TOO_MANY_TOPICS: 429,
    ErrorCode.STAGING_FULL: 429,
    ErrorCode.INTERNAL: 500,
    ErrorCode.STORAGE_UNAVAILABLE: 503,
    ErrorCode.SERVER_BUSY: 503,
}


class ErrorBody(Struct):
    code: str  # an ErrorCode value; str so that codes a newer server adds still decode
    message: str
    detail: dict[str, Any]


class Error(Struct):
    """The body of every 4xx/5xx answer, and of an SSE ``event: error``."""

    error: ErrorBody


class WaymarkError(Exception):
    """The root of every exception waymark raises: ``except WaymarkError`` catches any
    of them and nothing else (docs/errors.md)."""


class Refusal(WaymarkError):
    """A request refused under the contract: an error code, a message, a detail object
    and the HTTP status the answer has (docs/semantics/topics.md §11).

    The engine and the server raise it as ``TopicError``; the client raises it as
    ``ApiError``, decoded from the answer. ``code`` is an :class:`ErrorCode` when it is
    one this version knows, else the string a newer server sent. :meth:`body` is the
    wire shape, :class:`Error`.
    """

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        detail: dict[str, Any] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail or {}
        # A code this version knows has one status; a foreign one must bring its own.
        self.status = status if status is not None else ErrorCode(code).status

    def body(self) -> Error:
        """The answer's body (and an SSE ``event: error``'s data)."""
        return Error(ErrorBody(str(self.code), self.message, self.detail))
