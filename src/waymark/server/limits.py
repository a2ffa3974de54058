"""Connection limits: what keeps slow or hostile clients from starving the server
(docs/security.md, Limits).

:class:`GuardedProtocol` is uvicorn's httptools protocol with three guards uvicorn
lacks or answers outside the API's error format:

- a **body read timeout**: a body not complete within ``body_timeout_s`` (plus a second
  per ``MIN_BODY_RATE`` bytes received) gets 408 and the connection is closed;
- a **header size limit**: past ``max_header_bytes`` without the end of the headers,
  431 ``headers_too_large`` and the connection is closed;
- a **header read timeout**: a request whose headers are not complete within
  ``header_timeout_s`` of the connection opening (or of the request's first byte on a
  kept-alive connection) gets 408 ``request_timeout`` and the connection is closed, so
  a slowloris client holds a connection for seconds, not forever;
- a **connection limit**: past ``max_connections`` open connections, or
  ``max_connections_per_address`` from one client address, a new one is answered 503
  ``server_busy`` as soon as its headers arrive, and closed;
- the **idle keep-alive timeout** (uvicorn's own, ``keep_alive_s``), counted;
- **no connection upgrades**: a request with ``Upgrade`` gets 400 ``invalid_request``
  and the connection is closed (an upgraded connection left the limit's count).

The SSE stream limit and the body and topic limits are refusals of the app
(:class:`~waymark.server.App`), in the same error format.
"""

from __future__ import annotations

import asyncio

import msgspec
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ..log import ErrorCode, TopicError
from .audit import AuditLog
from .config import HttpConfig
from .metrics import Metrics

# A body is given body_timeout_s plus one more second per this many bytes received: a
# large body on a slow link still arrives, one dripped a byte at a time does not.
MIN_BODY_RATE = 64 << 10
LINGER_S = 1.0  # how long a refused connection stays half-closed, reading nothing


def refusal_bytes(error: TopicError) -> bytes:
    """A whole HTTP/1.1 response carrying ``error`` that closes the connection."""
    body = msgspec.json.encode(error.body())
    return b"".join((
        STATUS_LINE[error.status], b"content-type: application/json\r\n",
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body), body,
    ))  # fmt: skip


class GuardedProtocol(HttpToolsProtocol):
    """One HTTP/1.1 connection, guarded. A subclass per server sets ``limits`` and
    ``metrics`` (:func:`guarded`)."""

    limits: HttpConfig
    metrics: Metrics
    audit: AuditLog | None
    addresses: dict[str, int]  # open connections by client address

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self._address: str | None = peer[0] if isinstance(peer, tuple) else None
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._in_body = False
        self._refused = False
        self._head_bytes = 0  # received while this request's headers are incomplete
        self._body_started = 0.0
        self._body_bytes = 0
        self._over: TopicError | None = None
        held = self.addresses.get(self._address, 0) if self._address is not None else 0
        if self.metrics.connections >= self.limits.max_connections:
            self._over = TopicError(
                ErrorCode.SERVER_BUSY, "the server holds its limit of open connections",
                {"max_connections": self.limits.max_connections},
            )  # fmt: skip
        elif held >= self.limits.max_connections_per_address:
            # One client (or one NAT) cannot take every slot of the server's limit.
            self._over = TopicError(
                ErrorCode.SERVER_BUSY,
                f"this client address holds its limit of "
                f"{self.limits.max_connections_per_address} open connections",
                {"max_connections_per_address": self.limits.max_connections_per_address},
            )  # fmt: skip
        else:
            self.metrics.connections += 1
            if self._address is not None:
                self.addresses[self._address] = held + 1
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_body()
        if self._over is None:
            self.metrics.connections -= 1
            if self._address is not None:
                left = self.addresses[self._address] - 1
                if left:
                    self.addresses[self._address] = left
                else:
                    del self.addresses[self._address]
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:  # the next request on a kept-alive connection
            self._head_bytes = 0
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        if self.parser.should_upgrade():
            # uvicorn would hand the connection to its WebSocket protocol, which never
            # calls our connection_lost: each upgrade leaked a slot of max_connections.
            # No route speaks WebSocket or h2c, so an upgrade is refused outright.
            self._refuse(TopicError(
                ErrorCode.INVALID_REQUEST,
                "this server does not upgrade connections (no WebSocket, no h2c); "
                "send the request without an Upgrade header",
            ))  # fmt: skip
            return
        if self._over is not None:
            self._refuse(self._over)
            return
        super().on_headers_complete()
        # Until on_message_complete: a body that never ends holds its connection and
        # its request, which headers that arrived in time did not bound. The timer is
        # armed in data_received, only for a body still incomplete after a read (most
        # requests arrive whole: no timer to make and cancel on the hot path).
        self._in_body, self._body_started, self._body_bytes = True, self.loop.time(), 0

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return  # no request cycle was started for it
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm_body()
        if self._refused:
            # Refused in on_headers_complete, so uvicorn never began its cycle: its own
            # callback failed on it, and every refused upgrade or busy answer logged a
            # parse warning and a "Fatal error on transport" traceback (a log flood).
            return
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # a refused connection only lingers until it closes
        # Bytes of a request whose headers are not complete yet: the parser buffers
        # them (one header of a gigabyte was buffered whole), so past max_header_bytes
        # the request is refused 431 and the connection closed.
        heading = self._header_timer is not None
        if heading:
            self._head_bytes += len(data)
        super().data_received(data)
        unfinished = heading and self._header_timer is not None  # no end of headers yet
        if unfinished and self._head_bytes > self.limits.max_header_bytes:
            self._disarm()
            self._refuse(TopicError(
                ErrorCode.HEADERS_TOO_LARGE,
                f"request headers are larger than {self.limits.max_header_bytes} bytes",
                {"max_header_bytes": self.limits.max_header_bytes},
            ))  # fmt: skip
            return
        if self._in_body and self._body_timer is None and not self.transport.is_closing():
            left = self._body_started + self.limits.body_timeout_s - self.loop.time()
            self._body_timer = self.loop.call_later(max(left, 0.0), self._body_late)

    def _should_upgrade(self) -> bool:
        return False  # refused in on_headers_complete, whatever libraries are installed

    def _unsupported_upgrade_warning(self) -> None:
        pass  # answered 400 already; a log line per hostile request is a log flood

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.metrics.idle_closed += 1
        super().timeout_keep_alive_handler()

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _disarm_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_late(self) -> None:
        allowed = self.limits.body_timeout_s + self._body_bytes / MIN_BODY_RATE
        left = self._body_started + allowed - self.loop.time()
        if left > 0:  # bytes came meanwhile: the deadline moved on
            self._body_timer = self.loop.call_later(left, self._body_late)
            return
        self._body_timer = None
        self._refuse(TopicError(
            ErrorCode.REQUEST_TIMEOUT,
            f"the request body did not arrive within {allowed:.1f} s "
            f"({self.limits.body_timeout_s} s and 1 s per {MIN_BODY_RATE} bytes received)",
            {"body_timeout_s": self.limits.body_timeout_s, "received_bytes": self._body_bytes},
        ))  # fmt: skip

    def _headers_late(self) -> None:
        self._header_timer = None
        self._refuse(TopicError(
            ErrorCode.REQUEST_TIMEOUT,
            f"request headers were not complete within {self.limits.header_timeout_s} s",
            {"header_timeout_s": self.limits.header_timeout_s},
        ))  # fmt: skip

    def _refuse(self, error: TopicError) -> None:
        if self.transport.is_closing() or self._refused:
            return
        self._refused = True
        self.metrics.refused(error.code)
        if self.audit is not None:
            self.audit.refused(error.code, error.status, self._address, detail=error.detail)
        self.transport.write(refusal_bytes(error))
        if self.transport.can_write_eof():
            # A close with unread request bytes in the kernel's buffer resets the
            # connection, and the client may never read the answer: end our side after
            # it, discard what still comes, and close a moment later (a lingering close).
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def guarded(
    limits: HttpConfig, metrics: Metrics, audit: AuditLog | None = None
) -> type[GuardedProtocol]:
    """The protocol class of one server."""
    return type(
        "GuardedProtocol",
        (GuardedProtocol,),
        {"limits": limits, "metrics": metrics, "audit": audit, "addresses": {}},
    )
