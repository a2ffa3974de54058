"""Fault injectors for the client's transport: network faults a real waymark server
does not produce on demand (an answer cut in the middle, a connection closed right
after the request arrived or while idle in the client's pool)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections import deque
from dataclasses import dataclass, field

import msgspec

from waymark.protocol import AppendResponse

OK_APPEND = msgspec.json.encode(AppendResponse([1], 1, "memory"))
OK_HEALTH = b'{"status":"ok"}'


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FaultServer:
    """Fault injector: a tiny HTTP/1.1 server. Each request it reads takes the next
    action of :attr:`plan` (``"ok"`` when empty):

    - ``ok``: answer, keep the connection open;
    - ``close_idle``: answer, then close the connection (as a server's idle timeout
      does), setting :attr:`closed` once closed;
    - ``close_header``: answer with ``Connection: close`` and close;
    - ``drop``: close without answering (the server died after reading it);
    - ``partial``: send half the answer, then close;
    - ``silent``: never answer (until :meth:`close`).
    """

    tls: ssl.SSLContext | None = None
    plan: deque[str] = field(default_factory=deque)
    seen: list[Seen] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        self.url = f"{'https' if self.tls else 'http'}://localhost:{port}"
        self._sockets: list[socket.socket] = []
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self._sockets.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    if not (data := conn.recv(65536)):
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                line, *lines = head.decode("latin-1").split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
                length = int(headers.get("content-length", 0))
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                method, path, _ = line.split(" ")
                self.seen.append(Seen(method, path, headers, body))
                if not self._answer(conn, method, self.plan.popleft() if self.plan else "ok"):
                    return
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def _answer(self, conn: socket.socket, method: str, action: str) -> bool:
        """Act on one request; whether to keep the connection."""
        body = OK_APPEND if method == "POST" else OK_HEALTH
        close = "connection: close\r\n" if action == "close_header" else ""
        answer = (f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{close}"
                  f"content-length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip
        if action == "drop":
            return False
        if action == "silent":
            self._stopped.wait()
            return False
        if action == "partial":
            conn.sendall(answer[: len(answer) // 2])
            return False
        conn.sendall(answer)
        if action == "close_idle":
            conn.close()
            self.closed.set()
            return False
        return action == "ok"

    def close(self) -> None:
        self._stopped.set()
        self.listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
