"""The one exception the client raises for a refusal by the server."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from ..server.schemas import Error


class ApiError(Exception):
    """The server refused a request: its HTTP status and error code
    (docs/semantics/topics.md §11)."""

    def __init__(self, status: int, code: str, message: str, detail: dict[str, Any]) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        try:
            error = msgspec.json.decode(response.content, type=Error).error
        except msgspec.DecodeError:
            # Not one of ours (a proxy, a crash page): keep what there is.
            return cls(response.status_code, "http_error", response.text[:500], {})
        return cls(response.status_code, error.code, error.message, error.detail)
