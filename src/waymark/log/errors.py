"""Errors of the topic log, each with its code and HTTP status (docs/semantics/topics.md §11).

The engine raises :class:`TopicError`; the HTTP layer renders it as
``{"error": {"code", "message", "detail"}}`` with :attr:`TopicError.status`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request"
    INVALID_TOPIC_NAME = "invalid_topic_name"
    RECORD_TOO_LARGE = "record_too_large"
    TAG_TOO_LONG = "tag_too_long"
    NODE_TOO_LONG = "node_too_long"
    META_TOO_LARGE = "meta_too_large"
    TOO_MANY_RECORDS = "too_many_records"
    BODY_TOO_LARGE = "body_too_large"
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


STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_TOPIC_NAME: 400,
    ErrorCode.RECORD_TOO_LARGE: 400,
    ErrorCode.TAG_TOO_LONG: 400,
    ErrorCode.NODE_TOO_LONG: 400,
    ErrorCode.META_TOO_LARGE: 400,
    ErrorCode.TOO_MANY_RECORDS: 400,
    ErrorCode.BODY_TOO_LARGE: 400,
    ErrorCode.TOPIC_NOT_FOUND: 404,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.ROUTER_NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.TOPIC_EXISTS_INCOMPATIBLE: 409,
    ErrorCode.NOT_A_QUEUE: 409,
    ErrorCode.ROUTER_CYCLE: 409,
    ErrorCode.FENCED: 409,
    ErrorCode.TOPIC_FULL: 422,
    ErrorCode.STORAGE_UNAVAILABLE: 503,
}


class TopicError(Exception):
    """A request the log refuses; nothing stored was changed."""

    def __init__(self, code: ErrorCode, message: str, detail: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail or {}

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def to_wire(self) -> dict[str, Any]:
        return {"error": {"code": str(self.code), "message": self.message, "detail": self.detail}}

    def __repr__(self) -> str:
        return f"TopicError({self.code!s}, {self.message!r}, {self.detail!r})"
