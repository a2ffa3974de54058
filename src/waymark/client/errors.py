"""The one exception the client raises for a refusal by the server."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from ..protocol import Error, ErrorCode

_error = msgspec.json.Decoder(Error)
_CODES = {code.value: code for code in ErrorCode}


class ApiError(Exception):
    """The server refused a request: its HTTP status and the contract's error code
    (docs/semantics/topics.md §11).

    ``code`` is an :class:`~waymark.protocol.ErrorCode` when it is one this client
    knows, else the string as sent (``"http_error"`` for an answer that is not a
    waymark error body at all, say from a proxy).
    """

    def __init__(
        self, status: int, code: ErrorCode | str, message: str, detail: dict[str, Any]
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = _CODES.get(code, code)
        self.message = message
        self.detail = detail

    @classmethod
    def from_body(cls, status: int, body: bytes | str) -> ApiError:
        """The error an :class:`~waymark.protocol.Error` body (of an HTTP answer or an
        SSE ``event: error``) describes."""
        error = _error.decode(body).error
        return cls(status, error.code, error.message, error.detail)

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        try:
            return cls.from_body(response.status_code, response.content)
        except msgspec.DecodeError:
            # Not one of ours (a proxy, a crash page): keep what there is.
            return cls(response.status_code, "http_error", response.text[:500], {})
