"""HTTP/1.1 without I/O: request bytes out, response bytes in (docs/client.md, "Transport").

Both transports (:mod:`.transport`, blocking sockets and asyncio) only move the bytes
this module makes and parses, so the wire handling exists once. It speaks the part of
HTTP/1.1 a waymark server uses: keep-alive connections, ``Content-Length`` and chunked
bodies, a body read to the close when neither is given, and streamed bodies for SSE.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ProtocolError

_MAX_HEAD = 64 * 1024  # a status line and headers longer than this are not a server's


@dataclass(slots=True)
class Response:
    """One answer: what the clients' parsers read (the attributes httpx's has too)."""

    status_code: int
    headers: dict[str, str]
    content: bytes = b""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def request_head(method: str, target: str, headers: dict[str, str], length: int | None) -> bytes:
    """The request line and headers; ``length`` None: a request without a body."""
    lines = [f"{method} {target} HTTP/1.1"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if length is not None:
        lines.append(f"content-length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass(slots=True)
class ResponseReader:
    """Parses one response from the bytes :meth:`feed` gets, in any split.

    After the head, the body is collected (:meth:`response` once :attr:`complete`) or
    handed out as it comes (:meth:`take`, for a stream).
    """

    head: Response | None = None
    complete: bool = False
    keep_alive: bool = True
    _buffer: bytearray = field(default_factory=bytearray)
    _body: list[bytes] = field(default_factory=list)
    _remaining: int = -1  # Content-Length bytes still to come; -1: chunked or to the close
    _chunked: bool = False
    _chunk_left: int = 0  # bytes of the current chunk still to come (its CRLF included)
    _trailers: bool = False

    def feed(self, data: bytes) -> None:
        if self.complete:
            if data:
                self.keep_alive = False  # bytes after the answer: nothing to reuse it for
            return
        if self.head is None:
            self._buffer += data
            if not self._read_head():
                return
            data = bytes(self._buffer)  # what came after the head
            self._buffer.clear()
            if self.complete:
                self.keep_alive = self.keep_alive and not data
                return
        if self._chunked:
            self._buffer += data
            self._read_chunks()
        elif self._remaining >= 0:
            if len(data) > self._remaining:
                self.keep_alive = False
                data = data[: self._remaining]
            if data:
                self._body.append(data)
                self._remaining -= len(data)
            if self._remaining == 0:
                self._done()
        elif data:
            self._body.append(data)

    def eof(self) -> None:
        """The connection closed: the end of a to-the-close body, or an incomplete answer."""
        if self.complete:
            return
        if self.head is not None and not self._chunked and self._remaining < 0:
            self.keep_alive = False
            self._done()
            return
        state = "before the answer" if self.head is None else "in the middle of the answer"
        raise ProtocolError(f"the server closed the connection {state}")

    @property
    def started(self) -> bool:
        """Whether any byte of the answer arrived (a retry is then no longer safe)."""
        return self.head is not None or bool(self._buffer)

    def take(self) -> bytes:
        """The body bytes received since the last call (stream mode)."""
        out = b"".join(self._body)
        self._body.clear()
        return out

    def response(self) -> Response:
        assert self.head is not None and self.complete
        self.head.content = b"".join(self._body)
        return self.head

    # --- parsing ----------------------------------------------------------------------

    def _read_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > _MAX_HEAD:
                raise ProtocolError("the answer's head is too long")
            return False
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        del self._buffer[: end + 4]
        version, _, rest = lines[0].partition(" ")
        status = rest[:3]
        if not version.startswith("HTTP/1.") or not status.isdigit():
            raise ProtocolError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
        code = int(status)
        if 100 <= code < 200:  # an interim answer (none is asked for): skip it
            return bool(self._buffer) and self._read_head()
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise ProtocolError(f"a malformed header line: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        self.head = Response(code, headers)
        connection = headers.get("connection", "").lower()
        self.keep_alive = version == "HTTP/1.1" and connection != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = True
        elif code in (204, 304):
            self._remaining = 0
        elif (length := headers.get("content-length")) is not None:
            if not length.isdigit():
                raise ProtocolError(f"a malformed content-length: {length[:40]!r}")
            self._remaining = int(length)
        if self._remaining == 0:
            self._done()
        return True

    def _read_chunks(self) -> None:
        buffer = self._buffer
        while not self.complete:
            if self._chunk_left:
                n = min(self._chunk_left, len(buffer))
                if n == 0:
                    return
                data_n = max(0, min(n, self._chunk_left - 2))  # the chunk's CRLF is no data
                if data_n:
                    self._body.append(bytes(buffer[:data_n]))
                del buffer[:n]
                self._chunk_left -= n
                continue
            end = buffer.find(b"\r\n")
            if end < 0:
                return
            line = bytes(buffer[:end])
            del buffer[: end + 2]
            if self._trailers:
                if not line:
                    self._done()
                continue
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolError(f"a malformed chunk size: {size_text[:20]!r}") from None
            if size == 0:
                self._trailers = True
            else:
                self._chunk_left = size + 2

    def _done(self) -> None:
        self.complete = True
        if self._buffer:
            self.keep_alive = False
            self._buffer.clear()


class LineSplitter:
    """Cuts a streamed body into lines without their ending (``\\n`` or ``\\r\\n``), as
    SSE reads them (docs/client.md, "Watch")."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, data: bytes) -> list[str]:
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        return [line.removesuffix(b"\r").decode("utf-8", "replace") for line in complete]
