"""Fixtures shared across test packages."""

from __future__ import annotations

import gc
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import pytest
from hypothesis import settings
from hypothesis.internal.conjecture import providers as hypothesis_providers

# A mutant test expects the exception a broken property raises; when hypothesis finds
# two distinct failures it would raise an ExceptionGroup of both instead. One, the
# simplest, is enough for every test here.
settings.register_profile("waymark", report_multiple_bugs=False)
settings.load_profile("waymark")


@dataclass
class ServerProcess:
    """A real ``waymark serve`` process on a free port."""

    url: str
    process: subprocess.Popen[str]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


def readable(stream: IO[str], timeout: float) -> bool:
    """Whether ``stream`` has something to read within ``timeout`` s (epoll: a long
    suite can hold more than the 1024 descriptors ``select.select`` takes)."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        return bool(selector.select(timeout))


def start_server(data_dir: Path, *args: str, port: int = 0) -> ServerProcess:
    """Start ``waymark serve`` and wait until it answers /v0/health."""
    command = [str(Path(sys.executable).parent / "waymark"), "serve", "--port", str(port),
               "--data-dir", str(data_dir), *args]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert process.stdout is not None
    if not readable(process.stdout, 20):
        process.kill()
        raise RuntimeError("waymark serve printed nothing within 20 s")
    line = process.stdout.readline()
    prefix = "waymark listening on "
    if not line.startswith(prefix):
        process.kill()
        raise RuntimeError(f"unexpected first line from waymark serve: {line!r}")
    server = ServerProcess(line[len(prefix) :].split()[0], process)
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{server.url}/v0/health").status_code == 200:
                return server
        except httpx.TransportError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.05)


@pytest.fixture(scope="module", autouse=True)
def _release_cycles() -> Iterator[None]:
    """Collect reference cycles after each module: a failing hypothesis example's
    traceback holds its engine, and so its segments' mapped files, until the cyclic
    collector runs; one mutant test's shrinking left ~1000 open."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def waymark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the whole session; tests keep apart by using their own topics.

    A short SSE heartbeat keeps the heartbeat test fast.
    """
    server = start_server(tmp_path_factory.mktemp("waymark-data"), "--heartbeat-s", "0.2")
    yield server
    assert server.stop() == 0, "waymark serve did not exit cleanly on SIGTERM"


@pytest.fixture
def start_waymark(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start extra ``waymark serve`` processes; any still running are killed afterwards."""
    started: list[ServerProcess] = []

    def start(*args: str, port: int = 0) -> ServerProcess:
        server = start_server(tmp_path / f"data-{len(started)}", *args, port=port)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


@pytest.fixture
def spawn_server() -> Iterator[Callable[..., ServerProcess]]:
    """Start extra ``waymark serve`` processes (e.g. to kill and restart); all are
    killed at teardown."""
    started: list[ServerProcess] = []

    def spawn(data_dir: Path, *args: str) -> ServerProcess:
        server = start_server(data_dir, *args)
        started.append(server)
        return server

    yield spawn
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


@pytest.fixture(scope="module")
def spawn_module_server() -> Iterator[Callable[..., ServerProcess]]:
    """``spawn_server`` for module-scoped fixtures: all are killed when the module ends."""
    started: list[ServerProcess] = []

    def spawn(data_dir: Path, *args: str) -> ServerProcess:
        server = start_server(data_dir, *args)
        started.append(server)
        return server

    yield spawn
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


@dataclass
class LongPolls:
    """A server's ``waymark_long_polls`` gauge: tests wait for it instead of sleeping."""

    url: str

    def count(self) -> int:
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith("waymark_long_polls "):
                return int(float(line.split()[1]))
        raise AssertionError("no waymark_long_polls in /metrics")

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Return once ``count`` long-polls wait on the server: the next commit to a
        topic then wakes each of its polls. Every check is a request; nothing sleeps."""
        deadline = time.monotonic() + timeout
        while self.count() < count:
            assert time.monotonic() < deadline, f"{count} long-polls never waited"


@pytest.fixture
def long_polls() -> Callable[[str], LongPolls]:
    """``long_polls(url)``: the long-poll gauge of the server at ``url``."""
    return LongPolls


@pytest.fixture(autouse=True)
def fixed_constants(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pin hypothesis' pool of "local constants" (empty) for every test.

    Hypothesis also draws values from the literals of every local module imported so
    far, so a derandomized search still changed with what else the process had run (in
    the full suite, machines missed mutants they caught alone, or caught them by
    another assertion). Pinned, a test's search is the same in every run, alone or in
    the suite. Some tests name the fixture to say they depend on it.
    """
    empty = hypothesis_providers.Constants()
    monkeypatch.setattr(hypothesis_providers, "_get_local_constants", lambda: empty)
    hypothesis_providers.CONSTANTS_CACHE.cache.clear()  # drawn from the real pool
    yield
    hypothesis_providers.CONSTANTS_CACHE.cache.clear()  # drawn from the empty one


# Spark test modules of the first Spark group; the others make the second (about even
# by the durations CI prints).
SPARK_A = frozenset({"test_sink.py", "test_source.py", "test_edge_plan.py", "test_register.py",
                     "test_security.py"})  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for ``pytest -n 3 --dist loadgroup`` (how ``./run test`` runs): a
    module's tests stay on one worker, so its module fixtures (servers, nats-server)
    start once. The Spark tests are two groups, each on one worker with one Spark
    session (one group was the whole suite's critical path); they are the longest and
    come first, so the other workers take every other module meanwhile."""
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        # The cluster tests run their drivers as processes of their own: no shared session.
        if module.startswith("tests/spark/") and module != "tests/spark/test_cluster.py":
            group = "spark-a" if module.rpartition("/")[2] in SPARK_A else "spark-b"
        else:
            group = module
        item.add_marker(pytest.mark.xdist_group(group))
        # xdist's loadgroup reads the group from a "@group" suffix of the node id, which
        # it sets through the _nodeid pytest 9 no longer reads: without this every
        # module's tests were spread over the workers (its module fixtures started more
        # than once). The suffix goes into the id itself, after the item's name, which
        # for schemathesis names the API operation (its items share one function's id,
        # and xdist keys its work by node id).
        if item.parent is not None:
            item._id = item.parent.id.child(f"{item.name}@{group}")  # noqa: SLF001
    items.sort(key=lambda item: not item.nodeid.startswith("tests/spark/"))
