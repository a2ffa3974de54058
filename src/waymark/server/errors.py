"""Every refusal as ``{"error": {"code", "message", "detail"}}`` with its status
(docs/semantics/topics.md §11)."""

from __future__ import annotations

import logging

import msgspec
import orjson

from ..log import ErrorCode, TopicError
from .http import Response

log = logging.getLogger("waymark.server")


def error_response(error: TopicError) -> Response:
    return Response(orjson.dumps(error.to_wire()), error.status)


def as_topic_error(exc: Exception) -> TopicError | None:
    """The client-facing error for ``exc``, or None when it is a server fault."""
    if isinstance(exc, TopicError):
        return exc
    # ValidationError subclasses DecodeError: test it first so its message (which
    # names the offending field) is kept apart from plain syntax errors.
    if isinstance(exc, msgspec.ValidationError):
        return TopicError(ErrorCode.INVALID_REQUEST, f"invalid request body: {exc}")
    if isinstance(exc, msgspec.DecodeError):
        return TopicError(ErrorCode.INVALID_REQUEST, f"request body is not valid JSON: {exc}")
    return None


def internal_error(exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    body = {"error": {"code": "internal", "message": "internal server error", "detail": {}}}
    return Response(orjson.dumps(body), 500)


def not_found(path: str) -> Response:
    return error_response(TopicError(ErrorCode.NOT_FOUND, "no such route", {"path": path}))


def method_not_allowed(method: str, allowed: tuple[str, ...]) -> Response:
    error = TopicError(
        ErrorCode.METHOD_NOT_ALLOWED,
        f"{method} is not allowed here",
        {"method": method, "allowed": list(allowed)},
    )
    response = error_response(error)
    response.headers = ((b"allow", ", ".join(allowed).encode()),)
    return response
