"""The two transports: kept-alive HTTP/1.1 connections over blocking sockets and over
asyncio, both moving the bytes :mod:`.http11` makes and parses (docs/client.md,
"Transport").

A transport sends a request and returns its :class:`~.http11.ParsedResponse`, or opens a
stream (SSE) whose body it hands out as it comes. Idle connections wait in a pool; a
pooled connection the server has closed meanwhile is dropped before use, and an
idempotent request that meets a closed one anyway is sent once more on a new one.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .errors import ConnectError, ProtocolError, TransportError, TransportTimeout
from .http11 import ParsedResponse, ResponseReader, header_lines, request_head

_RECV = 64 * 1024  # under malloc's mmap threshold: a recv buffer comes from the heap
_JOIN_BELOW = 256 * 1024  # bodies smaller than this go out in one write with the head
_MAX_IDLE = 100  # idle connections kept per client; more are closed when returned
_MAX_REQUESTS = 100  # an AsyncClient's requests under way at once (httpx's default too)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where requests go and what each carries: host, port, TLS, the base path and the
    headers every request sends (``Host``, ``Authorization``)."""

    host: str
    port: int
    tls: ssl.SSLContext | None
    base_path: str
    headers: dict[str, str]
    lines: str  # ``headers`` as the request head carries them

    @classmethod
    def of(
        cls,
        url: str,
        token: str | None,
        ca_file: str | None,
        client_cert: tuple[str, str] | None = None,
    ) -> Origin:
        """``token`` None: the ``WAYMARK_TOKEN`` environment variable, if set and not
        empty. ``https://`` verifies the server against ``ca_file``, else the system's
        certificate store; ``client_cert`` (a certificate chain file and its key file)
        is presented to a server that asks for one (``serve --tls-client-ca``)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
        https = parts.scheme == "https"
        if ca_file is not None and not https:
            raise ValueError(f"ca_file is for https:// URLs, not {url!r}")
        if client_cert is not None and not https:
            raise ValueError(f"client_cert is for https:// URLs, not {url!r}")
        tls = ssl.create_default_context(cafile=ca_file) if https else None
        if tls is not None and client_cert is not None:
            tls.load_cert_chain(*client_cert)
        headers = {"host": parts.netloc.rpartition("@")[2], "user-agent": "waymark-client"}
        if token is None:
            token = os.environ.get("WAYMARK_TOKEN") or None
        if token:
            headers["authorization"] = f"Bearer {token}"
        port = parts.port or (443 if https else 80)
        base_path = parts.path.rstrip("/")
        return cls(parts.hostname, port, tls, base_path, headers, header_lines(headers))

    def request(
        self, method: str, target: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[bytes, bytes | None]:
        """The bytes of one request: a small body joined to the head (one write), a
        large one apart (second), to spare copying it."""
        lines = self.lines + header_lines(headers) if headers else self.lines
        length = None if body is None else len(body)
        head = request_head(method, self.base_path + target, lines, length)
        if body is None or len(body) >= _JOIN_BELOW:
            return head, body
        return head + body, None


def _timed_out(error: BaseException) -> bool:
    """A timeout: Python's, or a kernel timeout on a blocking socket (EAGAIN)."""
    return isinstance(error, TimeoutError | BlockingIOError)


def _failed(error: BaseException, what: str) -> TransportError:
    """Our kind of ``error`` (an OSError, an ssl.SSLError or a TimeoutError)."""
    if isinstance(error, TransportError):
        return error
    if _timed_out(error):
        return TransportTimeout(f"{what}: timed out")
    return TransportError(f"{what}: {type(error).__name__}: {error}")


def _connect_failed(error: BaseException, origin: Origin) -> TransportError:
    where = f"cannot connect to {origin.host}:{origin.port}"
    if isinstance(error, TimeoutError):
        return TransportTimeout(f"{where}: timed out")
    return ConnectError(f"{where}: {type(error).__name__}: {error}")


def _poller(sock: Any) -> select.poll:
    """A poll of ``sock`` for :func:`_readable` (poll, not select: a process may hold
    more than 1024 files), made once per connection."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return poller


def _readable(poller: select.poll) -> bool:
    """Whether an idle connection has something to read: the server closed it (or
    broke the protocol), so it must not carry another request."""
    return bool(poller.poll(0))


# --- blocking sockets ------------------------------------------------------------------


class _Socket:
    """A pooled blocking socket and the timeout last set on it.

    A plain TCP socket stays in blocking mode with kernel timeouts (``SO_RCVTIMEO``,
    ``SO_SNDTIMEO``): a wait is one ``recv``, where Python's own timeouts cost a failed
    ``recv``, a ``poll`` and another ``recv``. A TLS socket uses Python's timeouts.
    """

    __slots__ = ("poller", "sock", "timeout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.timeout: float | None = None
        self.poller = _poller(sock)

    def set_timeout(self, timeout: float) -> None:
        if timeout == self.timeout:
            return
        self.timeout = timeout
        if isinstance(self.sock, ssl.SSLSocket):
            self.sock.settimeout(timeout)
            return
        self.sock.settimeout(None)
        seconds = max(timeout, 1e-6)  # 0 would mean "never" to the kernel
        value = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


class SyncTransport:
    """Blocking sockets, a pool of idle ones; safe to share between threads (each request
    holds its own connection)."""

    def __init__(self, origin: Origin, connect_timeout: float) -> None:
        self.origin = origin
        self.connect_timeout = connect_timeout
        self._idle: list[_Socket] = []

    def close(self) -> None:
        while self._idle:
            self._idle.pop().sock.close()

    def _connect(self) -> socket.socket:
        origin = self.origin
        try:
            sock = socket.create_connection((origin.host, origin.port), self.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if origin.tls is not None:
                try:
                    sock = origin.tls.wrap_socket(sock, server_hostname=origin.host)
                except BaseException:
                    sock.close()
                    raise
        except OSError as e:  # ssl.SSLError and TimeoutError are OSErrors
            raise _connect_failed(e, origin) from e
        return sock

    def _checkout(self) -> tuple[_Socket, bool]:
        """An idle connection the server has not closed, else a new one; and which."""
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return _Socket(self._connect()), False
            if _readable(conn.poller):
                conn.sock.close()
                continue
            return conn, True

    def _checkin(self, conn: _Socket, reader: ResponseReader) -> None:
        if reader.keep_alive and len(self._idle) < _MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.sock.close()

    def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float,
        idempotent: bool,
    ) -> ParsedResponse:
        data, rest = self.origin.request(method, target, headers, body)
        while True:
            conn, reused = self._checkout()
            sock = conn.sock
            reader = ResponseReader()
            try:
                conn.set_timeout(timeout)
                sock.sendall(data)
                if rest is not None:
                    sock.sendall(rest)
                while not reader.complete:
                    if chunk := sock.recv(_RECV):
                        reader.feed(chunk)
                    else:
                        reader.eof()
            except (OSError, ProtocolError) as e:
                sock.close()
                if reused and idempotent and not reader.started and not _timed_out(e):
                    continue  # a kept-alive connection the server had closed: once more
                raise _failed(e, f"{method} {target}") from e
            except BaseException:
                sock.close()
                raise
            self._checkin(conn, reader)
            return reader.response()

    @contextmanager
    def stream(
        self, method: str, target: str, headers: dict[str, str], read_timeout: float
    ) -> Iterator[SyncStream]:
        """A request on its own new connection, held until the ``with`` ends."""
        sock = self._connect()
        try:
            reader = ResponseReader()
            try:
                sock.settimeout(read_timeout)
                sock.sendall(self.origin.request(method, target, headers, None)[0])
                while reader.head is None:
                    if chunk := sock.recv(_RECV):
                        reader.feed(chunk)
                    else:
                        reader.eof()
            except (OSError, ProtocolError) as e:
                raise _failed(e, f"{method} {target}") from e
            yield SyncStream(sock, reader, f"{method} {target}")
        finally:
            sock.close()


class SyncStream:
    """A streamed answer: ``response`` (head only), its body by iteration."""

    def __init__(self, sock: socket.socket, reader: ResponseReader, what: str) -> None:
        assert reader.head is not None
        self.response = reader.head
        self._sock, self._reader, self._what = sock, reader, what

    def __iter__(self) -> Iterator[bytes]:
        reader = self._reader
        while True:
            if data := reader.take():
                yield data
            if reader.complete:
                return
            try:
                if chunk := self._sock.recv(_RECV):
                    reader.feed(chunk)
                else:
                    reader.eof()
            except (OSError, ProtocolError) as e:
                raise _failed(e, self._what) from e

    def read(self) -> ParsedResponse:
        """The whole answer (for an error's body)."""
        self.response.content = b"".join(self)
        return self.response


# --- asyncio ---------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One asyncio connection: buffers what arrives until :meth:`recv` takes it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._error: Exception | None = None
        self._paused = False
        self._poller: select.poll | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > _RECV * 4 and not self._paused:
            assert self.transport is not None
            self.transport.pause_reading()  # a stream the reader is slow to take
            self._paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    @property
    def usable(self) -> bool:
        """Idle and still open: nothing unread, no close from the server, including one
        the event loop has not handled yet (the socket is readable then)."""
        assert self.transport is not None
        if self._eof or self._chunks or self.transport.is_closing():
            return False
        if self._poller is None:
            self._poller = _poller(self.transport.get_extra_info("socket"))
        return not _readable(self._poller)

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        if self._eof:
            raise ConnectionResetError("the connection is closed")
        self.transport.write(data)

    async def recv(self) -> bytes:
        """What arrived since the last call (waiting for some); b"" at the end."""
        while not self._chunks:
            if self._eof:
                if self._error is not None:
                    raise self._error
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        if self._paused:
            assert self.transport is not None
            self.transport.resume_reading()
            self._paused = False
        return data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class AsyncTransport:
    """asyncio connections, a pool of idle ones; for one event loop. At most
    ``_MAX_REQUESTS`` requests are under way at once (each holds a connection); more
    wait for one to finish."""

    def __init__(self, origin: Origin, connect_timeout: float) -> None:
        self.origin = origin
        self.connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(_MAX_REQUESTS)

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def _connect(self) -> _Connection:
        origin = self.origin
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    _Connection, origin.host, origin.port, ssl=origin.tls,
                    server_hostname=origin.host if origin.tls is not None else None,
                )  # fmt: skip
        except OSError as e:  # ssl.SSLError and TimeoutError are OSErrors
            raise _connect_failed(e, origin) from e
        return connection

    async def _checkout(self) -> tuple[_Connection, bool]:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable:
                return connection, True
            connection.close()
        return await self._connect(), False

    async def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float,
        idempotent: bool,
    ) -> ParsedResponse:
        data, rest = self.origin.request(method, target, headers, body)
        async with self._slots:
            return await self._request(method, target, data, rest, timeout, idempotent)

    async def _request(self, method: str, target: str, data: bytes, rest: bytes | None,
                       timeout: float, idempotent: bool) -> ParsedResponse:  # fmt: skip
        while True:
            connection, reused = await self._checkout()
            reader = ResponseReader()
            try:
                async with asyncio.timeout(timeout):
                    connection.send(data)
                    if rest is not None:
                        connection.send(rest)
                    while not reader.complete:
                        if chunk := await connection.recv():
                            reader.feed(chunk)
                        else:
                            reader.eof()
            except (OSError, ProtocolError) as e:
                connection.close()
                if reused and idempotent and not reader.started and not _timed_out(e):
                    continue  # a kept-alive connection the server had closed: once more
                raise _failed(e, f"{method} {target}") from e
            except BaseException:  # cancelled mid-answer: the connection is unusable
                connection.close()
                raise
            if reader.keep_alive and len(self._idle) < _MAX_IDLE:
                self._idle.append(connection)
            else:
                connection.close()
            return reader.response()

    @asynccontextmanager
    async def stream(
        self, method: str, target: str, headers: dict[str, str], read_timeout: float
    ) -> AsyncIterator[AsyncStream]:
        """A request on its own new connection, held until the ``async with`` ends."""
        connection = await self._connect()
        try:
            reader = ResponseReader()
            try:
                async with asyncio.timeout(read_timeout):
                    connection.send(self.origin.request(method, target, headers, None)[0])
                    while reader.head is None:
                        if chunk := await connection.recv():
                            reader.feed(chunk)
                        else:
                            reader.eof()
            except (OSError, ProtocolError) as e:
                raise _failed(e, f"{method} {target}") from e
            yield AsyncStream(connection, reader, read_timeout, f"{method} {target}")
        finally:
            connection.close()


class AsyncStream:
    """A streamed answer: ``response`` (head only), its body by async iteration; each
    read may take ``read_timeout`` seconds."""

    def __init__(
        self, connection: _Connection, reader: ResponseReader, read_timeout: float, what: str
    ) -> None:
        assert reader.head is not None
        self.response = reader.head
        self._connection, self._reader = connection, reader
        self._read_timeout, self._what = read_timeout, what

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reader = self._reader
        while True:
            if data := reader.take():
                yield data
            if reader.complete:
                return
            try:
                async with asyncio.timeout(self._read_timeout):
                    chunk = await self._connection.recv()
                if chunk:
                    reader.feed(chunk)
                else:
                    reader.eof()
            except (OSError, ProtocolError) as e:
                raise _failed(e, self._what) from e

    async def read(self) -> ParsedResponse:
        """The whole answer (for an error's body)."""
        self.response.content = b"".join([chunk async for chunk in self])
        return self.response
