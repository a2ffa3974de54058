"""The one exception of the topic log, carrying the contract's error code
(docs/semantics/topics.md §11).

The engine raises :class:`TopicError`; the HTTP layer renders :meth:`TopicError.body`
with :attr:`TopicError.status` (codes and statuses: :mod:`waymark.protocol.errors`).
"""

from __future__ import annotations

from typing import Any

from ..protocol import Error, ErrorBody, ErrorCode


class TopicError(Exception):
    """A request the log refuses; nothing stored was changed."""

    def __init__(self, code: ErrorCode, message: str, detail: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail or {}

    @property
    def status(self) -> int:
        return self.code.status

    def body(self) -> Error:
        return Error(ErrorBody(str(self.code), self.message, self.detail))

    def __repr__(self) -> str:
        return f"TopicError({self.code!s}, {self.message!r}, {self.detail!r})"
