"""A fault-injecting TCP proxy: a named fault injector between a client and its server
(docs/faults.md, "Faults").

It forwards bytes both ways on its own event loop thread; ``cut()`` closes every open
connection and refuses new ones until ``restore()``; ``latency(ms)`` delays each chunk
it forwards. A network cut and added latency between two real processes cannot be
produced on loopback otherwise without root.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading


class FaultProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.port = 0
        self._cut = False
        self._delay_s = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, sock=sock), self._loop
        ).result()
        return self

    def cut(self) -> None:
        """Drop every connection and refuse new ones (closed as soon as accepted)."""
        self._cut = True
        self._loop.call_soon_threadsafe(self._close_all)

    def latency(self, ms: int) -> None:
        self._delay_s = ms / 1000

    def restore(self) -> None:
        self._cut = False
        self._delay_s = 0.0

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            self._close_all()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _close_all(self) -> None:
        for w in list(self._writers):
            w.transport.abort()  # a reset, as a cable pulled out mid-request looks to the peer
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await reader.read(65536):
                if self._delay_s:
                    await asyncio.sleep(self._delay_s)
                if self._cut:
                    break
                writer.write(chunk)
                await writer.drain()
        writer.transport.abort()
