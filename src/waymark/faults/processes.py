"""The processes under test: real ``waymark`` commands, killed, paused and restarted
(docs/faults.md, "The data flow").

Each runs from the environment's ``waymark`` script with its output in a log file of
the campaign's directory (kept: a violation is read there).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path


def waymark_executable() -> str:
    return str(Path(sys.executable).parent / "waymark")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], object], timeout: float = 30.0) -> object:
    """Poll ``check`` until it returns something truthy; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            if got := check():
                return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout}s")
        time.sleep(0.05)


class Managed:
    """One long-running ``waymark`` process (or ``program``): start, SIGKILL,
    SIGSTOP/SIGCONT, restart."""

    def __init__(
        self,
        name: str,
        args: list[str],
        log: Path,
        ready: Callable[[], object] | None = None,
        program: list[str] | None = None,
        group: bool = False,
    ) -> None:
        """``group``: the process leads a process group of its own, which every signal
        reaches whole (a Spark driver: its JVM and Python workers are its children)."""
        self.name = name
        self.args = args
        self.program = program or [waymark_executable()]
        self.log = log
        self.ready = ready
        self.group = group
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: list[int] = []  # the exit status of each run before the current one
        self.starts = 0
        self.killed = False  # by kill(), since its last start
        self.started_at = 0.0  # wall-clock time of its last start (files it wrote since)
        # launch, kill and restart_if_exited: a supervisor's restart and a fault's lift
        # must never both start one (two Spark drivers at once fence each other).
        self._lock = threading.RLock()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start it without waiting until it is ready (:meth:`wait_ready`)."""
        with self._lock:
            self._launch()

    def restart_if_exited(self) -> bool:
        """Start it again if it exited by itself (not by :meth:`kill`), as a supervisor
        does; whether it did."""
        with self._lock:
            if self.proc is None or self.proc.poll() is None or self.killed:
                return False
            self._launch()
            return True

    def _launch(self) -> None:
        if self.proc is not None:
            self.exits.append(self.proc.wait())
        self.starts += 1
        self.killed = False
        self.started_at = time.time()
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts}: {' '.join(self.args)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [*self.program, *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
                start_new_session=self.group,
            )

    def wait_ready(self, timeout: float = 30.0) -> None:
        if self.ready is not None:

            def up() -> object:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with {self.proc.returncode}; see {self.log}"
                    )
                return self.ready() if self.ready else True

            wait_for(f"{self.name} ready", up, timeout)

    def kill(self) -> bool:
        """SIGKILL it; whether that ended it (False: it had exited by itself, before or
        as the signal came, and its exit status says how)."""
        with self._lock:
            self.killed = True
            if self.proc is None or self.proc.poll() is not None:
                return False
            self._signal(signal.SIGCONT)  # a paused process dies as well
            self._signal(signal.SIGKILL)
            return self.proc.wait() == -signal.SIGKILL

    def pause(self) -> bool:
        """SIGSTOP it; whether it was running (an exited one is not signalled)."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        self._signal(signal.SIGSTOP)
        return True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return  # never signal a pid (or a group id) that may be reused
        if self.group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int | None:
        """Its exit code once it exits by itself within ``timeout``; None if it runs on."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in ``timeout``; its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


def listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True


def moto_server(port: int, log: Path) -> Managed | None:
    """moto's S3 server as a process (the S3 endpoint of a campaign with ``s3=True``);
    None when it is not installed (it is a development dependency)."""
    program = Path(sys.executable).parent / "moto_server"
    if not program.exists():
        return None
    return Managed(
        "s3", ["-H", "127.0.0.1", "-p", str(port)], log,
        ready=lambda: listening(port), program=[str(program)],
    )  # fmt: skip


S3_ENVIRONMENT = {
    "AWS_ALLOW_HTTP": "true",
    "AWS_ACCESS_KEY_ID": "campaign",
    "AWS_SECRET_ACCESS_KEY": "campaign",
    "AWS_REGION": "us-east-1",
}
