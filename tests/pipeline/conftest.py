"""Pipeline tests run real ``waymark serve`` processes. A server's death inside a
hypothesis run is a fault injector: a TCP proxy in front of the real server that,
when down, cuts every connection and refuses to forward (a real network fault;
SIGKILLing processes per example would take seconds each). The process-level
tests SIGKILL the real servers and stages."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from tests.conftest import ServerProcess, start_server

from waymark.objstore import OVERWRITE, ObjectStore, ObjectStoreError, ObjectVersion, PutMode


class FaultProxy:
    """Forwards TCP to one server; :meth:`down` makes the server look dead (every open
    connection cut, new ones closed at once) until :meth:`up`; :meth:`hang` makes it
    look hung (connections stay open, nothing is forwarded either way)."""

    def __init__(self, target_url: str) -> None:
        host, port = target_url.removeprefix("http://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.is_down = False
        self.flowing = threading.Event()  # cleared while hung
        self.flowing.set()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.is_down:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.flowing.wait()  # held while hung
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def down(self) -> None:
        self.is_down = True
        with self._lock:
            sockets, self._open = self._open, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def up(self) -> None:
        self.is_down = False
        self.flowing.set()

    def hang(self) -> None:
        self.flowing.clear()

    def close(self) -> None:
        self.listener.close()
        self.down()


@dataclass
class Fleet:
    """Three edge servers behind fault proxies, and a sink server."""

    proxies: list[FaultProxy]
    sink: ServerProcess

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.proxies]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root: Path = tmp_path_factory.mktemp("pipeline-fleet")
    servers = [start_server(root / f"edge-{i}") for i in range(3)]
    sink = start_server(root / "sink")
    proxies = [FaultProxy(s.url) for s in servers]
    yield Fleet(proxies, sink)
    for proxy in proxies:
        proxy.close()
    for server in [*servers, sink]:
        server.process.kill()
        server.process.wait()


class StoreFaults:
    """A fault injector for an object store (the file:// store has no network to cut):
    while ``down`` every call fails as an outage; ``outage_calls`` makes that many next
    calls fail so, and counts down; ``lose`` makes that many writes land and then fail
    as an outage, the answer lost on its way back. ``failed`` counts the calls that failed."""

    def __init__(self) -> None:
        self.down = False
        self.outage_calls = 0
        self.lose = 0
        self.failed = 0

    def wrap(self, store: ObjectStore) -> ObjectStore:
        return cast(ObjectStore, _FaultyStore(store, self))


class _FaultyStore:
    def __init__(self, inner: ObjectStore, faults: StoreFaults) -> None:
        self.inner, self.faults = inner, faults
        self.url, self.capabilities = inner.url, inner.capabilities

    def _check(self) -> None:
        faults = self.faults
        if faults.down or faults.outage_calls > 0:
            faults.outage_calls = max(0, faults.outage_calls - 1)
            faults.failed += 1
            raise ObjectStoreError("injected outage")

    def __getattr__(self, name: str) -> Any:  # reads: get, head, list, ...
        call = getattr(self.inner, name)

        def checked(*args: Any, **kwargs: Any) -> Any:
            self._check()
            return call(*args, **kwargs)

        return checked

    def put(self, key: str, data: bytes, *, mode: PutMode = OVERWRITE) -> ObjectVersion:
        self._check()
        version = self.inner.put(key, data, mode=mode)
        if self.faults.lose > 0:
            self.faults.lose -= 1
            raise ObjectStoreError(f"injected: the answer to put {key} was lost")
        return version
