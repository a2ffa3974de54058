"""HTTP/1.1 without I/O: request bytes out, response bytes in (docs/client.md, "Transport").

Both transports (:mod:`.transport`, blocking sockets and asyncio) only move the bytes
this module makes and parses, so the wire handling exists once. It speaks the part of
HTTP/1.1 a waymark server uses: keep-alive connections, ``Content-Length`` and chunked
bodies, a body read to the close when neither is given, and streamed bodies for SSE.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ProtocolError

_MAX_HEAD = 64 * 1024  # a status line and headers longer than this are not a server's
_HEX = frozenset(b"0123456789abcdefABCDEF")


@dataclass(slots=True)
class ParsedResponse:
    """One answer: what the clients' parsers read (the attributes httpx's has too)."""

    status_code: int
    head: bytes  # the header lines, as sent
    content: bytes = b""

    @property
    def headers(self) -> dict[str, str]:
        """The headers by lower-case name (the last of repeated ones)."""
        return dict(_header(line) for line in self.head.split(b"\r\n")[1:])

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def header_lines(headers: dict[str, str]) -> str:
    """Headers as the request head carries them."""
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


def request_head(method: str, target: str, headers: str, length: int | None) -> bytes:
    """The request line and ``headers`` (from :func:`header_lines`); ``length`` None: a
    request without a body, else one with a JSON body of that many bytes."""
    body = (
        "" if length is None else f"content-type: application/json\r\ncontent-length: {length}\r\n"
    )
    return f"{method} {target} HTTP/1.1\r\n{headers}{body}\r\n".encode("latin-1")


class ResponseReader:
    """Parses one response from the bytes :meth:`feed` gets, in any split.

    After the head, the body is collected (:meth:`response` once :attr:`complete`) or
    handed out as it comes (:meth:`take`, for a stream).
    """

    __slots__ = ("_body", "_buffer", "_chunk_left", "_chunked", "_pending", "_remaining",
                 "_trailers", "complete", "head", "keep_alive")  # fmt: skip

    def __init__(self) -> None:
        self.head: ParsedResponse | None = None
        self.complete = False
        self.keep_alive = True
        self._pending = b""  # the head so far
        self._buffer = bytearray()  # chunked framing so far
        self._body: list[bytes] = []
        self._remaining = -1  # Content-Length bytes still to come; -1: chunked or to the close
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk still to come (its CRLF included)
        self._trailers = False

    def feed(self, data: bytes) -> None:
        if self.complete:
            if data:
                self.keep_alive = False  # bytes after the answer: nothing to reuse it for
            return
        if self.head is None:
            if self._pending:
                data, self._pending = self._pending + data, b""
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > _MAX_HEAD:
                    raise ProtocolError("the answer's head is too long")
                self._pending = data
                return
            self._read_head(data[:end])
            data = data[end + 4 :]
            if self.head is None:  # an interim (1xx) answer: the real one follows
                if data:
                    self.feed(data)
                return
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
        return self.head is not None or bool(self._pending)

    def take(self) -> bytes:
        """The body bytes received since the last call (stream mode)."""
        out = b"".join(self._body)
        self._body.clear()
        return out

    def response(self) -> ParsedResponse:
        assert self.head is not None and self.complete
        self.head.content = b"".join(self._body)
        return self.head

    # --- parsing ----------------------------------------------------------------------

    def _read_head(self, head: bytes) -> None:
        status = head[:12]
        if not status.startswith(b"HTTP/1.") or not status[9:12].isdigit():
            raise ProtocolError(f"not an HTTP/1.1 answer: {head[:80]!r}")
        code = int(status[9:12])
        if 100 <= code < 200:
            return
        self.head = ParsedResponse(code, head)
        # Only three headers decide the framing: find them without parsing the rest.
        lower = head.lower()
        self.keep_alive = status[7] == 0x31 and _value(lower, b"connection") != b"close"
        if b"chunked" in _value(lower, b"transfer-encoding"):
            self._chunked = True
        elif code in (204, 304):
            self._remaining = 0
        elif length := _value(lower, b"content-length"):
            if not length.isdigit() or _repeated(lower, b"content-length") not in (b"", length):
                # Two lengths that differ: where the body ends is a guess (docs/client.md).
                raise ProtocolError(f"a malformed content-length: {length[:40]!r}")
            self._remaining = int(length)
        if self._remaining == 0:
            self._done()

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
                # What follows the data must be its CRLF: else the size was not the data's.
                crlf_from = 2 - min(2, self._chunk_left)
                tail = bytes(buffer[data_n:n])
                if tail != b"\r\n"[crlf_from : crlf_from + len(tail)]:
                    raise ProtocolError("a chunk's data is not followed by CRLF")
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
            # Hex digits only: int() would also take "-1", "+1", "0x1" and "1_0".
            if not size_text or not _HEX.issuperset(size_text):
                raise ProtocolError(f"a malformed chunk size: {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:
                self._trailers = True
            else:
                self._chunk_left = size + 2

    def _done(self) -> None:
        self.complete = True
        if self._buffer:
            self.keep_alive = False
            self._buffer.clear()


def _value(lower_head: bytes, name: bytes) -> bytes:
    """The value of header ``name`` in a lower-cased head; b"" when absent."""
    at = lower_head.find(b"\r\n" + name + b":")
    if at < 0:
        return b""
    start = at + len(name) + 3
    end = lower_head.find(b"\r\n", start)
    return lower_head[start : end if end >= 0 else len(lower_head)].strip()


def _repeated(lower_head: bytes, name: bytes) -> bytes:
    """The value of a second header ``name`` in a lower-cased head; b"" when there is
    none."""
    first = lower_head.find(b"\r\n" + name + b":")
    second = lower_head.find(b"\r\n" + name + b":", first + 1) if first >= 0 else -1
    return b"" if second < 0 else _value(lower_head[second:], name)


def _header(line: bytes) -> tuple[str, str]:
    name, colon, value = line.partition(b":")
    if not colon:
        raise ProtocolError(f"a malformed header line: {line[:80]!r}")
    return name.strip().lower().decode("latin-1"), value.strip().decode("latin-1")


class LineSplitter:
    """Cuts a streamed body into lines without their ending (``\\n`` or ``\\r\\n``), as
    SSE reads them (docs/client.md, "Watch")."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, data: bytes) -> list[str]:
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        return [line.removesuffix(b"\r").decode("utf-8", "replace") for line in complete]
