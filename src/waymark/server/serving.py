"""Run an :class:`App` on uvicorn (uvloop + httptools), stopping cleanly on signals.

uvicorn stays the HTTP layer: granian measured slower for waymark on this machine
(docs/http-api.md, "The HTTP server"). Its httptools protocol is extended with the
connection limits of :mod:`.limits`; TLS is uvicorn's (docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import uvicorn

from .app import App
from .limits import guarded


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening socket; port 0 picks a free one (``getsockname`` tells it)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # Listening now, not when uvicorn starts: whoever is told the address may connect at
    # once, and is queued in the backlog instead of refused.
    sock.listen(2048)
    return sock


class Server(uvicorn.Server):
    def __init__(self, app: App) -> None:
        """Serve ``app`` as its configuration's ``http`` section says: with
        ``tls_client_ca`` every client must present a certificate that CA signed,
        checked in the TLS handshake (docs/security.md, "Client certificates")."""
        http = app.config.http
        super().__init__(
            uvicorn.Config(
                app,
                loop="uvloop",
                http=guarded(http, app.metrics, app.audit),
                lifespan="on",
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=5,
                timeout_keep_alive=http.keep_alive_s,  # type: ignore[arg-type]  # a float works
                ssl_certfile=_path(http.tls_cert),
                ssl_keyfile=_path(http.tls_key),
                ssl_ca_certs=_path(http.tls_client_ca),
                ssl_cert_reqs=ssl.CERT_REQUIRED if http.tls_client_ca else ssl.CERT_NONE,
            )
        )
        self.app = app

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.config.ssl is None:
            await super().startup(sockets)
            return
        # uvicorn passes no TLS handshake timeout, so the loop's default (60 s) held a
        # client that opens a connection and never says hello: the handshake gets the
        # header timeout, like the headers that would follow it (docs/security.md, Limits).
        loop = asyncio.get_running_loop()
        create_server = loop.create_server
        loop.create_server = partial(  # type: ignore[method-assign]
            create_server, ssl_handshake_timeout=self.app.config.http.header_timeout_s
        )
        try:
            await super().startup(sockets)
        finally:
            del loop.create_server  # type: ignore[method-assign]

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # End SSE streams and long-polls first: uvicorn otherwise waits for them.
        self.app.close()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises the signal after a graceful shutdown, which would turn a
        # clean stop into a KeyboardInterrupt traceback or a death by SIGTERM.
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only (a server run in a thread)
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        # SIGHUP re-reads the tokens file (docs/security.md).
        previous[signal.SIGHUP] = signal.signal(
            signal.SIGHUP, lambda sig, frame: self.app.reload_tokens()
        )
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)
