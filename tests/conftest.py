"""Fixtures shared across test packages."""

from __future__ import annotations

import gc
import inspect
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
import pytest
from hypothesis import settings
from hypothesis.internal.conjecture import providers as hypothesis_providers
from hypothesis.stateful import RuleBasedStateMachine
from tests import hypothesis_store
from xdist.scheduler import LoadGroupScheduling

# A mutant test expects the exception a broken property raises; when hypothesis finds
# two distinct failures it would raise an ExceptionGroup of both instead. One, the
# simplest, is enough for every test here. The database adds the committed store of
# failures (tests/hypothesis_store.py) to the local one: every run replays it, CI's too
# (hypothesis' own CI profile has no database at all).
settings.register_profile(
    "waymark", report_multiple_bugs=False, database=hypothesis_store.database()
)
settings.load_profile("waymark")

MachineT = TypeVar("MachineT", bound=RuleBasedStateMachine)


def only_rules(machine: type[MachineT], *rules: str) -> type[MachineT]:
    """A hypothesis state machine with only ``rules`` among its rules, for a mutant
    hunt: the steps that can expose the mutant's bug, so it is found within a few
    examples. Every invariant and the teardown stay; each other rule stays a method (a
    rule may call another) but is no longer drawn."""
    drawn = {name for name, member in inspect.getmembers(machine)
             if getattr(member, "hypothesis_stateful_rule", None) is not None}  # fmt: skip
    assert set(rules) <= drawn, f"not rules of {machine.__name__}: {set(rules) - drawn}"

    def plain(name: str) -> Callable[..., Any]:
        return lambda self, *args, **kwargs: getattr(machine, name)(self, *args, **kwargs)

    others = {name: plain(name) for name in drawn - set(rules)}
    return type(f"{machine.__name__}Only", (machine,), others)


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


# How long a server start may take: ~1 s on a quiet machine, tens of seconds on one
# whose 2 cores run several suites at once (a deadline, not a wait).
START_S = 90


def start_server(data_dir: Path, *args: str, port: int = 0) -> ServerProcess:
    """Start ``waymark serve`` and wait until it answers /v0/health."""
    command = [str(Path(sys.executable).parent / "waymark"), "serve", "--port", str(port),
               "--data-dir", str(data_dir), *args]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert process.stdout is not None
    if not readable(process.stdout, START_S):
        process.kill()
        raise RuntimeError(f"waymark serve printed nothing within {START_S} s")
    line = process.stdout.readline()
    prefix = "waymark listening on "
    if not line.startswith(prefix):
        process.kill()
        raise RuntimeError(f"unexpected first line from waymark serve: {line!r}")
    server = ServerProcess(line[len(prefix) :].split()[0], process)
    deadline = time.monotonic() + START_S
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

# Each test's seconds (setup + call + teardown) in a ./run test on this 2-core machine,
# to hand out the longest groups first; `./run test --store-durations` rewrites it.
DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_TEST_S = 2.0  # a test the table does not know yet (a new one, a renamed one)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations", action="store_true",
        help=f"write each test's seconds into {DURATIONS.name} (its other entries stay)",
    )  # fmt: skip
    parser.addoption(
        "--promote-examples", action="store_true",
        help="save the failures this run finds into tests/hypothesis-examples/ (committed, "
             "replayed by every run) as well as .hypothesis/",
    )  # fmt: skip


def test_id(nodeid: str) -> str:
    """A node id without the ``@group`` suffix the collection gives it (below)."""
    return nodeid.rpartition("@")[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def group_of(nodeid: str) -> str:
    """The xdist group of a test: its module; the Spark tests' two groups (one Spark
    session each); the cluster tests, whose drivers are processes of their own; a
    test's own ``xdist_group`` mark wins (a slow test whose module fixtures are cheap)."""
    module = nodeid.split("::", 1)[0]
    # The cluster tests run their drivers as processes of their own: no shared session.
    if module.startswith("tests/spark/") and module != "tests/spark/test_cluster.py":
        return "spark-a" if module.rpartition("/")[2] in SPARK_A else "spark-b"
    return module


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for ``pytest -n 3 --dist loadgroup`` (how ``./run test`` runs): a
    module's tests stay on one worker, so its module fixtures (servers, nats-server)
    start once. The Spark tests are two groups, each on one worker with one Spark
    session (one group was the whole suite's critical path). The groups are handed out
    longest first (:class:`LongestFirst`)."""
    for item in items:
        own = item.get_closest_marker("xdist_group")
        group = str(own.args[0]) if own is not None and own.args else group_of(item.nodeid)
        item.add_marker(pytest.mark.xdist_group(group))
        # xdist's loadgroup reads the group from a "@group" suffix of the node id, which
        # it sets through the _nodeid pytest 9 no longer reads: without this every
        # module's tests were spread over the workers (its module fixtures started more
        # than once). The suffix goes into the id itself, after the item's name, which
        # for schemathesis names the API operation (its items share one function's id,
        # and xdist keys its work by node id).
        if item.parent is not None:
            item._id = item.parent.id.child(f"{item.name}@{group}")  # noqa: SLF001


# The groups that run Spark JVMs (a session each, or a standalone cluster, or Spark on
# every Python): at most two of them run at once.
JVM_GROUPS = frozenset({"spark-a", "spark-b", "tests/spark/test_cluster.py",
                        "tests/pythons/test_pythons.py"})  # fmt: skip
MAX_JVM_GROUPS = 2


class _LongestFirstQueue(OrderedDict[str, dict[str, bool]]):
    """xdist's queue of groups (group -> its tests), from which ``popitem(last=False)``
    takes the group the durations table makes longest, not the first inserted."""

    def __init__(self, known: dict[str, float]) -> None:
        super().__init__()
        self.known = known
        self.running_jvm = 0  # JVM groups with tests left on some worker (set before a pop)

    def seconds(self, tests: dict[str, bool]) -> float:
        return sum(self.known.get(test_id(t), UNKNOWN_TEST_S) for t in tests)

    def popitem(self, last: bool = True) -> tuple[str, dict[str, bool]]:
        if last:
            return super().popitem(last=True)
        # At most MAX_JVM_GROUPS groups that run Spark at once: with all three on two
        # cores (two sessions, a standalone cluster), their JVMs' CPU time grew by half.
        # A free JVM slot goes to a JVM group first: those two slots are the run's
        # narrowest lane (the JVM groups take ~10 min between them), so a JVM group
        # waiting behind a longer plain module only lengthened the run's tail.
        jvm_slot = self.running_jvm < MAX_JVM_GROUPS
        allowed = [g for g in self if g not in JVM_GROUPS or jvm_slot]

        def rank(g: str) -> tuple[bool, float]:
            return jvm_slot and g in JVM_GROUPS, self.seconds(self[g])

        group = max(allowed or self, key=rank)
        return group, self.pop(group)


class LongestFirst(LoadGroupScheduling):
    """``--dist loadgroup`` that hands out the longest group first (longest processing
    time first, by the table of measured durations): xdist hands them out in the order
    of its queue, which it sorts by the number of tests in a group, so the Spark groups
    (~2 min each, few tests) started after many short modules and made a run's tail.

    A worker also gets its next group once its current one has one test left to run,
    not two (xdist's default): a group handed to a worker waits behind those tests,
    while another worker may have been free. A worker needs one test queued behind the
    one it runs (pytest's ``nextitem``), so one is the least."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        self.workqueue = _LongestFirstQueue(known)

    def _assign_work_unit(self, node: Any) -> None:
        self.workqueue.running_jvm = sum(
            1
            for work in self.assigned_work.values()
            for group, tests in work.items()
            if group in JVM_GROUPS and not all(tests.values())
        )
        super()._assign_work_unit(node)

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 1:
            return
        self._assign_work_unit(node)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return LongestFirst(config, log) if config.getvalue("dist") == "loadgroup" else None


# With --store-durations, in the process that reports (xdist's controller sees every
# worker's reports): each test's seconds so far.
_measured: dict[str, float] | None = None


SPARK_SOCKET_TIMEOUT = "120s"  # what waymark.spark.demo_job.session sets for users too

# The process making the JVMs' class archive (tests/jvm_archive.py), while it runs.
_archiving: subprocess.Popen[bytes] | None = None


def runs_spark(config: pytest.Config) -> bool:
    """Whether the run's paths include Spark tests (tests/spark), the JVM starters."""
    spark = Path(__file__).with_name("spark")
    for arg in config.args:
        path = Path(arg.split("::", 1)[0]).resolve()
        if path == spark or spark in path.parents or path in spark.parents:
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    global _measured, _archiving
    if config.getoption("promote_examples"):  # in xdist's workers too: they run the tests
        settings.register_profile(
            "waymark", report_multiple_bugs=False, database=hypothesis_store.database(promote=True)
        )
    if hasattr(config, "workerinput"):
        return  # xdist's workers inherit what the controller set up (the environment too)
    # Every Spark driver the tests start, however deep (PySpark's launcher reads this):
    # its Python side waits up to 120 s, not 15, for the JVM's socket (a collect, an
    # Arrow batch): a run at load 13 failed with CANNOT_OPEN_SOCKET at 15 s.
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--conf spark.python.authenticate.socketTimeout={SPARK_SOCKET_TIMEOUT} "
        + os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    )
    if config.getoption("store_durations"):
        _measured = {}
    if getattr(config, "cache", None) is not None and runs_spark(config):
        from tests import jvm_archive

        _archiving = jvm_archive.start(config.cache.mkdir("jvm-archive"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _archiving is not None and _archiving.poll() is None:
        try:  # a short run: let the archive be finished for the next one
            _archiving.wait(120)
        except subprocess.TimeoutExpired:
            _archiving.kill()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _measured is not None:
        key = test_id(report.nodeid)
        _measured[key] = _measured.get(key, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    measured = _measured
    # Not from an interrupted run: its last tests' durations are cut short, and a run
    # stopped because it was too slow (a loaded machine) would skew the table.
    if measured and exitstatus != pytest.ExitCode.INTERRUPTED:
        table = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        table.update({k: round(v, 2) for k, v in measured.items()})
        DURATIONS.write_text(json.dumps(dict(sorted(table.items())), indent=0) + "\n")
