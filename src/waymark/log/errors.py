"""The one exception of the topic log, carrying the contract's error code
(docs/semantics/topics.md §11).

The engine raises :class:`TopicError`, the log's kind of
:class:`~waymark.protocol.errors.Refusal`; the HTTP layer renders
:meth:`TopicError.body` with :attr:`TopicError.status` (codes and statuses:
:mod:`waymark.protocol.errors`; the exception tree: docs/errors.md).
"""

from __future__ import annotations

from typing import Any

from ..protocol import ErrorCode
from ..protocol.errors import Refusal


class TopicError(Refusal):
    """A request the log refuses; nothing stored was changed. Its status is always its
    code's (``ErrorCode.status``)."""

    code: ErrorCode

    def __init__(self, code: ErrorCode, message: str, detail: dict[str, Any] | None = None):
        super().__init__(code, message, detail, code.status)

    def __repr__(self) -> str:
        return f"TopicError({self.code!s}, {self.message!r}, {self.detail!r})"
