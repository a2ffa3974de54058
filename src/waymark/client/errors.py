"""The exceptions the client raises: a refusal by the server (:class:`ApiError`), or no
answer at all (:class:`TransportError` and its kinds)."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from ..protocol import Error, ErrorCode
from ..protocol.errors import Refusal, WaymarkError

_error = msgspec.json.Decoder(Error)
_CODES = {code.value: code for code in ErrorCode}


class Answer(Protocol):
    """What an HTTP answer must offer to be read as an error (both transports' do)."""

    status_code: int

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...


class ApiError(Refusal):
    """The server refused a request: its HTTP status and the contract's error code
    (docs/semantics/topics.md §11); the client's kind of
    :class:`~waymark.protocol.errors.Refusal` (docs/errors.md).

    ``code`` is an :class:`~waymark.protocol.ErrorCode` when it is one this client
    knows, else the string as sent (``"http_error"`` for an answer that is not a
    waymark error body at all, say from a proxy).
    """

    def __init__(
        self, status: int, code: ErrorCode | str, message: str, detail: dict[str, Any]
    ) -> None:
        super().__init__(_CODES.get(code, code), message, detail, status)
        self.args = (f"{status} {code}: {message}",)

    @classmethod
    def from_body(cls, status: int, body: bytes | str) -> ApiError:
        """The error an :class:`~waymark.protocol.Error` body (of an HTTP answer or an
        SSE ``event: error``) describes."""
        error = _error.decode(body).error
        return cls(status, error.code, error.message, error.detail)

    @classmethod
    def from_response(cls, response: Answer) -> ApiError:
        try:
            return cls.from_body(response.status_code, response.content)
        except msgspec.DecodeError:
            # Not one of ours (a proxy, a crash page): keep what there is.
            return cls(response.status_code, "http_error", response.text[:500], {})


class TransportError(WaymarkError, OSError):
    """No answer: the connection could not be made, broke, or timed out
    (docs/client.md, "Errors"). Whether the server acted on the request is unknown."""


class ConnectError(TransportError):
    """The connection (TCP, then TLS) could not be made: nothing was sent."""


class TransportTimeout(TransportError, TimeoutError):
    """The connection or the answer took longer than the client's timeout."""


class ProtocolError(TransportError):
    """The peer's bytes are not an HTTP/1.1 answer, or it closed the connection early."""
