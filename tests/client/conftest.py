"""Client tests run against the real server process, directly or through a TCP proxy
whose connections the test can cut (a real network fault, not a mocked one)."""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from waymark.client import Client


class CuttableProxy:
    """Forwards TCP to ``target``; :meth:`cut` drops every open connection at once.
    With ``tls`` it is also a TLS terminator (``https://localhost:<port>``)."""

    def __init__(self, target: tuple[str, int], tls: ssl.SSLContext | None = None) -> None:
        self.target = target
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        self.url = f"https://localhost:{port}" if tls else f"http://127.0.0.1:{port}"
        self.connections = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                if self.tls is not None:
                    client = self.tls.wrap_socket(client, server_side=True)
            except ssl.SSLError:
                continue  # a client that refused our certificate
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self.connections += 1
                self._open += [client, upstream]
            ended: list[bool] = []  # the pipes of this connection that are done
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b, ended), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, ended: list[bool]) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        # The second pipe to end closes both: closed earlier, a socket's number could be
        # reused by a new connection while the other pipe still reads it.
        with self._lock:
            ended.append(True)
            last = len(ended) == 2
        if last:
            source.close()
            sink.close()

    def cut(self) -> None:
        """Drop every open connection: both ends see it closed (the pipes then end)."""
        with self._lock:
            sockets, self._open = self._open, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        self.cut()


@pytest.fixture
def proxy(waymark_server: Any) -> Iterator[CuttableProxy]:
    host, port = waymark_server.url.removeprefix("http://").rsplit(":", 1)
    proxy = CuttableProxy((host, int(port)))
    yield proxy
    proxy.close()


@pytest.fixture
def proxy_to() -> Iterator[Callable[[str], CuttableProxy]]:
    """A cuttable proxy in front of any server (e.g. one restarted after a crash)."""
    proxies: list[CuttableProxy] = []

    def make(url: str) -> CuttableProxy:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        proxies.append(CuttableProxy((host, int(port))))
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def client(waymark_server: Any) -> Iterator[Client]:
    with Client(waymark_server.url) as client:
        yield client


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9._:-]", ".", request.node.name[:60]) + "-" + uuid.uuid4().hex[:8]
