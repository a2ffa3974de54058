"""Every refusal as ``{"error": {"code", "message", "detail"}}`` with the code's status
(docs/semantics/topics.md §11; the body and the codes: :mod:`waymark.protocol.errors`)."""

from __future__ import annotations

import logging

import msgspec

from ..log import ErrorCode, TopicError
from .http import Response

log = logging.getLogger("waymark.server")
_encode = msgspec.json.encode


def error_response(error: TopicError) -> Response:
    return Response(_encode(error.body()), error.status)


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
    return error_response(TopicError(ErrorCode.INTERNAL, "internal server error"))


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
