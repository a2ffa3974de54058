"""What the server answers a web browser (docs/security.md, "Browsers").

A server on loopback without tokens trusts whoever can connect, and a browser can be
made to connect by any page it opens. Two checks keep such pages out:

- **Host**: a page that rebinds its own DNS name to 127.0.0.1 reaches the server as
  the same origin, but its requests still carry that name in ``Host``. A server bound
  to loopback answers only ``localhost``, the loopback addresses and the names given
  with ``--allowed-host``; a server bound elsewhere, only those names when any are given.
- **Origin**: a request a browser sends from another page carries that page's
  ``Origin``. It is refused unless it is the server's own (the console) or one given
  with ``--cors-origin``, which then gets the CORS headers and preflight answers it
  needs. (Writes need ``Content-Type: application/json`` as well: see
  :mod:`waymark.server.http`.)
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..log import ErrorCode, TopicError
from .http import Response, Scope

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_PREFLIGHT_HEADERS = (
    (b"access-control-allow-methods", b"GET, POST, PUT, DELETE"),
    (b"access-control-allow-headers", b"authorization, content-type, accept, last-event-id"),
    (b"access-control-max-age", b"600"),
)


@dataclass(frozen=True)
class BrowserPolicy:
    """The Host names a server answers (None: any) and the other origins it serves."""

    allowed_hosts: frozenset[str] | None
    cors_origins: frozenset[str] = frozenset()

    @classmethod
    def for_bind(
        cls, host: str, allowed_hosts: list[str], cors_origins: list[str]
    ) -> BrowserPolicy:
        """The policy of a server listening on ``host`` (``waymark serve --host``)."""
        named = frozenset(h.lower().strip("[]") for h in allowed_hosts)
        if _is_loopback(host):
            return cls(LOOPBACK_NAMES | {host.lower().strip("[]")} | named,
                       frozenset(cors_origins))  # fmt: skip
        return cls(named or None, frozenset(cors_origins))

    def check(self, scope: Scope) -> tuple[TopicError | None, bytes | None]:
        """The refusal of a request by its Host or Origin, and the origin to allow in
        the answer's CORS headers (one of ``--cors-origin``)."""
        host = origin = None
        for key, value in scope["headers"]:
            if key == b"host":
                host = value
            elif key == b"origin":
                origin = value
        if self.allowed_hosts is not None and _hostname(host) not in self.allowed_hosts:
            shown = "none" if host is None else host.decode("latin-1")
            return TopicError(
                ErrorCode.FORBIDDEN,
                f"Host {shown!r} is not a name of this server; a name that resolves here "
                "is served with --allowed-host NAME",
                {"host": shown},
            ), None
        if origin is None or (host is not None and _same_origin(origin, host, scope)):
            return None, None
        shown = origin.decode("latin-1")
        if shown in self.cors_origins:
            return None, origin
        return TopicError(
            ErrorCode.FORBIDDEN,
            f"a request from the page at {shown} is refused; serve that origin with --cors-origin",
            {"origin": shown},
        ), None

    def preflight(self, origin: bytes) -> Response:
        """The answer to a CORS preflight (``OPTIONS``) from an allowed origin."""
        response = Response(b"", 204)
        response.headers = ((b"access-control-allow-origin", origin), (b"vary", b"origin"),
                            *_PREFLIGHT_HEADERS)  # fmt: skip
        return response


def allow_origin(response: Response, origin: bytes) -> None:
    """Let the page at ``origin`` (an allowed one) read ``response``."""
    response.headers = (*response.headers, (b"access-control-allow-origin", origin),
                        (b"vary", b"origin"))  # fmt: skip


def _hostname(host: bytes | None) -> str | None:
    if host is None:
        return None
    text = host.decode("latin-1").lower()
    if text.startswith("["):  # [::1]:8080
        return text[1 : text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def _same_origin(origin: bytes, host: bytes, scope: Scope) -> bool:
    scheme = scope.get("scheme", "http").encode()
    return origin.lower() == scheme + b"://" + host.lower()


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
