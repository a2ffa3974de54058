"""A Spark standalone cluster on this machine: one master and N workers started from
the PySpark installation (docs/spark.md, "Running on a cluster").

Each process is ``bin/spark-class org.apache.spark.deploy.master.Master`` (or
``...worker.Worker``) from the pyspark wheel, on loopback, with ports the JVM picks
(``--port 0``; read back from its log), in its own session (process group), so that
the CLI that started it can exit and a SIGKILL of a worker's group takes its
executors and Python workers with it, as a lost machine would. Each worker has its
own work directory. The state — pids, ports, work directories, logs — is one JSON
file in the cluster directory; :func:`up` waits until the master's JSON
(``http://HOST:UI/json/``) reports every worker ALIVE, with a deadline.

Nothing here imports pyspark: the wheel is only located.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..protocol.errors import WaymarkError

STATE_FILE = "cluster.json"
LOCK_FILE = "cluster.lock"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Master and worker daemons are small: their heap is not the executors' memory.
DAEMON_MEMORY = "512m"
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"  # as the demo's driver


class ClusterError(WaymarkError, RuntimeError):
    """The cluster could not be started, or is not there."""


@dataclass
class Daemon:
    """One master or worker process."""

    role: str  # "master" or "worker-N"
    pid: int
    port: int  # its RPC port
    ui_port: int
    log: str
    work_dir: str | None = None  # a worker's

    def alive(self) -> bool:
        return _is_spark_daemon(self.pid)


@dataclass
class Cluster:
    """The state file's content."""

    directory: str
    host: str
    cores: int  # per worker
    memory: str  # per worker
    python: str  # PYSPARK_PYTHON of the executors
    master: Daemon
    workers: list[Daemon] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.master.ui_port}"

    def save(self) -> None:
        path = Path(self.directory) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, directory: Path) -> Cluster | None:
        try:
            raw = json.loads((directory / STATE_FILE).read_text())
        except FileNotFoundError:
            return None
        raw["master"] = Daemon(**raw["master"])
        raw["workers"] = [Daemon(**w) for w in raw["workers"]]
        return cls(**raw)


def spark_home() -> Path:
    """The pyspark wheel's directory: its ``bin/spark-class`` and ``jars/``."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ClusterError("pyspark is not installed: pip install 'waymark[spark]'")
    return Path(next(iter(spec.submodule_search_locations)))


def up(
    directory: Path,
    workers: int = 2,
    *,
    cores: int = 1,
    memory: str = "1g",
    host: str = "127.0.0.1",
    python: str | None = None,
    timeout: float = 120.0,
) -> Cluster:
    """Start a master and ``workers`` workers, or the missing ones of a running cluster
    (a dead worker is started again on its work directory); return once the master
    reports every worker ALIVE, or raise :class:`ClusterError` at ``timeout``."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    with _exclusive(directory):
        return _up(directory, workers, cores, memory, host, python, timeout)


def _up(directory: Path, workers: int, cores: int, memory: str, host: str,
        python: str | None, timeout: float) -> Cluster:  # fmt: skip
    deadline = time.monotonic() + timeout
    cluster = Cluster.load(directory)
    if cluster is not None and not cluster.master.alive():
        _stop_all(cluster, timeout=10)  # a stale state: its workers are orphans
        cluster = None
    if cluster is None:
        cluster = Cluster(str(directory), host, cores, memory, python or sys.executable,
                          _start_master(directory, host, deadline))  # fmt: skip
        cluster.save()
    alive = {w.role for w in cluster.workers if w.alive()}
    roles = [f"worker-{i}" for i in range(1, max(workers, len(cluster.workers)) + 1)]
    # Started together (each JVM takes seconds to start), then their ports are read.
    spawned = [(role, *_spawn_worker(cluster, role)) for role in roles if role not in alive]
    for role, process, log, work in spawned:
        port, ui = _ports(process, log, "sparkWorker", "WorkerUI", deadline)
        started = Daemon(role, process.pid, port, ui, str(log), str(work))
        cluster.workers = [w for w in cluster.workers if w.role != role] + [started]
        cluster.workers.sort(key=lambda w: int(w.role.split("-")[1]))
        cluster.save()
    _wait_alive(cluster, deadline)
    return cluster


def down(directory: Path, timeout: float = 30.0) -> list[Daemon]:
    """Stop the cluster's workers, then its master (SIGTERM to each process group,
    SIGKILL after ``timeout``); remove the state file. Returns what was running."""
    directory = directory.resolve()
    if not directory.is_dir():
        return []
    with _exclusive(directory):
        cluster = Cluster.load(directory)
        if cluster is None:
            return []
        running = [d for d in [*cluster.workers, cluster.master] if d.alive()]
        _stop_all(cluster, timeout)
        (directory / STATE_FILE).unlink(missing_ok=True)
        return running


@contextlib.contextmanager
def _exclusive(directory: Path) -> Iterator[None]:
    """One ``up`` or ``down`` at a time on a cluster directory: two at once would each
    find no master and start one, and the state file would keep only the last, leaving
    the other's JVMs where no ``down`` finds them. The lock goes with the process
    holding it, however it ends."""
    with (directory / LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def status(directory: Path) -> dict[str, Any]:
    """The cluster as its state file and the master's JSON see it: each daemon's pid,
    ports, liveness and (workers) the state the master reports."""
    cluster = Cluster.load(directory.resolve())
    if cluster is None:
        return {"directory": str(directory.resolve()), "running": False, "daemons": []}
    seen = _master_json(cluster) if cluster.master.alive() else None
    states = {w["port"]: w for w in (seen or {}).get("workers", [])}
    daemons = []
    for d in [cluster.master, *cluster.workers]:
        entry = {**asdict(d), "alive": d.alive()}
        if d.role == "master":
            entry["state"] = seen.get("status") if seen else "DOWN"
        else:
            # The master keeps a killed worker ALIVE until its heartbeat times out
            # (spark.worker.timeout, 60 s): the process is the sooner truth.
            worker = states.get(d.port, {})
            entry["state"] = worker.get("state", "UNKNOWN") if d.alive() else "DEAD"
            entry["cores_used"] = worker.get("coresused")
        daemons.append(entry)
    return {
        "directory": cluster.directory,
        "running": cluster.master.alive(),
        "master_url": cluster.master_url,
        "ui_url": cluster.ui_url,
        "python": cluster.python,
        "alive_workers": sum(1 for d in daemons if d["role"] != "master" and d["state"] == "ALIVE"),
        "active_apps": [a.get("name") for a in (seen or {}).get("activeapps", [])],
        "daemons": daemons,
    }


# --- processes ------------------------------------------------------------------------


def _env(host: str, python: str | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": host,  # the web UIs bind here too, not 0.0.0.0
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": DAEMON_JAVA_OPTS,
    }
    if python is not None:
        env["PYSPARK_PYTHON"] = python
    return env


def _properties(directory: Path) -> Path:
    path = directory / "spark-defaults.conf"
    # No REST submission server (it would take the fixed port 6066).
    path.write_text("spark.master.rest.enabled false\n")
    return path


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True, cwd=log.parent,
        )  # fmt: skip


def _start_master(directory: Path, host: str, deadline: float) -> Daemon:
    log = directory / "master.log"
    log.write_bytes(b"")
    process = _spawn(
        [MASTER_CLASS, "--host", host, "--port", "0", "--webui-port", "0",
         "--properties-file", str(_properties(directory))],
        log, _env(host),
    )  # fmt: skip
    port, ui = _ports(process, log, "sparkMaster", "MasterUI", deadline)
    return Daemon("master", process.pid, port, ui, str(log))


def _spawn_worker(cluster: Cluster, role: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    directory = Path(cluster.directory)
    work = directory / role
    work.mkdir(exist_ok=True)
    log = directory / f"{role}.log"
    log.write_bytes(b"")
    process = _spawn(
        [WORKER_CLASS, "--host", cluster.host, "--port", "0", "--webui-port", "0",
         "--cores", str(cluster.cores), "--memory", cluster.memory, "--work-dir", str(work),
         "--properties-file", str(_properties(directory)), cluster.master_url],
        log, _env(cluster.host, cluster.python),
    )  # fmt: skip
    return process, log, work


def _ports(
    process: subprocess.Popen[bytes], log: Path, rpc: str, ui: str, deadline: float
) -> tuple[int, int]:
    """The RPC and UI ports the daemon reports in its log (it binds port 0)."""
    found: dict[str, int] = {}
    pattern = re.compile(r"Successfully started service '(\w+)' on port (\d+)")
    while time.monotonic() < deadline:
        for name, port in pattern.findall(log.read_text(errors="replace")):
            found[name] = int(port)
        if rpc in found and ui in found:
            return found[rpc], found[ui]
        if process.poll() is not None:
            raise ClusterError(f"{rpc} exited with status {process.returncode}; see {log}")
        time.sleep(0.1)
    _kill_group(process.pid, signal.SIGKILL)
    raise ClusterError(f"{rpc} did not report its ports in time; see {log}")


def _wait_alive(cluster: Cluster, deadline: float) -> None:
    want = {w.port for w in cluster.workers}
    alive: set[int] = set()
    while time.monotonic() < deadline:
        seen = _master_json(cluster)
        if seen is not None:
            alive = {w["port"] for w in seen.get("workers", []) if w.get("state") == "ALIVE"}
            if want <= alive:
                return
        dead = [w.role for w in cluster.workers if not w.alive()]
        if dead:
            raise ClusterError(f"{', '.join(dead)} exited; see their logs in {cluster.directory}")
        time.sleep(0.2)
    missing = sorted(w.role for w in cluster.workers if w.port not in alive)
    raise ClusterError(f"the master does not report {', '.join(missing)} ALIVE in time")


def _master_json(cluster: Cluster) -> dict[str, Any] | None:
    try:
        response = httpx.get(f"{cluster.ui_url}/json/", timeout=5)
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None  # type: ignore[no-any-return]


def _stop_all(cluster: Cluster, timeout: float) -> None:
    daemons = [*cluster.workers, cluster.master]  # workers first: they stop their executors
    for d in daemons:
        if d.alive():
            _kill_group(d.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(d.alive() for d in daemons) and time.monotonic() < deadline:
        time.sleep(0.1)
    for d in daemons:
        if d.alive():
            _kill_group(d.pid, signal.SIGKILL)
    # Executors and Python workers left in a worker's group after it exited.
    for d in cluster.workers:
        _kill_group(d.pid, signal.SIGKILL, only_if_group=True)


def _kill_group(pid: int, sig: int, *, only_if_group: bool = False) -> None:
    """Signal the process group ``pid`` leads (each daemon started its own session)."""
    if only_if_group and not _group_members(pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _is_spark_daemon(pid: int) -> bool:
    """Whether ``pid`` is alive and still a Spark daemon (a recorded pid may be reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and b"org.apache.spark.deploy." in cmdline
