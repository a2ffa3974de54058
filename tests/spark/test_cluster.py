"""On a Spark standalone cluster (1 master, 2 workers, started with ``waymark cluster up``
as a user would): the demo with a driver SIGKILL, the exactly-once sink with a worker
SIGKILLed mid-batch, a Spark stage reading a relocatable edge whose handoff store is on
S3, and the cluster commands themselves (docs/spark.md, "Running on a cluster").

One cluster for the module; each driver is its own process (the other Spark tests hold
a local SparkContext in the test process).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.objstore.s3 import MotoS3, moto_s3  # noqa: F401
from tests.pipeline.test_processes import sink_events
from tests.spark.conftest import external_stage_spec
from tests.spark.test_security import token_new

from waymark.client import Client
from waymark.objstore import open_store
from waymark.pipeline import HandoffReader
from waymark.pipeline.report import load_report
from waymark.protocol import RecordIn

WAYMARK = str(Path(sys.executable).parent / "waymark")
HERE = Path(__file__).parent


def without_s3() -> dict[str, str]:
    """The environment without the test process's ``AWS_*`` settings (tests/objstore/s3.py
    puts moto's there), for the cluster's daemons: the workers stand for other machines,
    whose executors get S3 settings only as a user hands them, through
    ``spark.executorEnv``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


def waymark(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([WAYMARK, *args], capture_output=True, text=True, timeout=timeout,
                          env=without_s3())  # fmt: skip


def status(directory: Path) -> dict[str, Any]:
    result = waymark("cluster", "status", "--json", "--dir", str(directory))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def group_alive(pgid: int) -> list[int]:
    """Processes still in the process group ``pgid`` (a daemon and what it started)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                alive.append(int(entry.name))
    return alive


def ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        chain.append(pid)
    return chain


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    """Not under pytest's base temp: concurrent pytest runs on the machine rotate those
    directories away, and the cluster outlives many of them."""
    directory = Path(tempfile.mkdtemp(prefix="waymark-cluster-test-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(root: Path) -> Iterator[Path]:
    directory = root / "cluster"
    result = waymark("cluster", "up", "--workers", "2", "--dir", str(directory))
    pids: list[int] = []
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        pids = [d["pid"] for d in status(directory)["daemons"]]
        yield directory
    finally:
        pids += [d["pid"] for d in status(directory)["daemons"]]  # restarted workers too
        down = waymark("cluster", "down", "--dir", str(directory))
        left = [p for p in set(pids) if group_alive(p)]
        for pgid in left:  # never leave a JVM behind, even when the test failed
            os.killpg(pgid, signal.SIGKILL)
        assert down.returncode == 0, down.stderr
        # No JVM left behind: not the daemons, not an executor in a worker's group.
        assert left == []


@pytest.fixture
def work(root: Path, request: pytest.FixtureRequest) -> Path:
    directory = root / request.node.name[:60]
    directory.mkdir()
    return directory


def test_up_reports_two_alive_workers_each_with_its_own_work_dir(cluster: Path) -> None:
    state = status(cluster)
    assert state["running"] and state["alive_workers"] == 2
    assert state["master_url"].startswith("spark://127.0.0.1:")
    workers = [d for d in state["daemons"] if d["role"] != "master"]
    assert [w["state"] for w in workers] == ["ALIVE", "ALIVE"]
    assert len({w["work_dir"] for w in workers}) == 2
    assert all(Path(w["work_dir"]).is_dir() for w in workers)
    # `up` again on a running cluster starts nothing new.
    again = waymark("cluster", "up", "--workers", "2", "--dir", str(cluster))
    assert again.returncode == 0, again.stderr
    assert [d["pid"] for d in status(cluster)["daemons"]] == [d["pid"] for d in state["daemons"]]


def test_two_ups_at_once_start_one_cluster_and_down_leaves_nothing(root: Path) -> None:
    """Two ``waymark cluster up`` on one directory at once (two terminals, a script run
    twice): one master and one worker, which both report, and ``down`` stops every
    JVM. Without the directory's lock each started a master of its own."""
    directory = root / "twice"
    command = [WAYMARK, "cluster", "up", "--workers", "1", "--dir", str(directory)]
    both = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=without_s3()) for _ in range(2)]  # fmt: skip
    pids: set[int] = set()
    try:
        for process in both:
            out, err = process.communicate(timeout=180)
            assert process.returncode == 0, out + err
        state = status(directory)
        assert state["alive_workers"] == 1 and len(state["daemons"]) == 2
        pids = {d["pid"] for d in state["daemons"]}
        # Every Spark daemon with this directory in its command line is one of those.
        started = {
            int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and _daemon_of(int(p.name), directory)
        }  # fmt: skip
        assert started == pids
    finally:
        down = waymark("cluster", "down", "--dir", str(directory))
        left = [p for p in pids if group_alive(p)]
        for pgid in left:
            os.killpg(pgid, signal.SIGKILL)
    assert down.returncode == 0, down.stderr
    assert left == []
    assert not [p for p in Path("/proc").iterdir()
                if p.name.isdigit() and _daemon_of(int(p.name), directory)]  # fmt: skip


def _daemon_of(pid: int, directory: Path) -> bool:
    """Whether ``pid`` is a live Spark master or worker started for ``directory``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return b"org.apache.spark.deploy." in cmdline and cwd.startswith(str(directory))


@pytest.mark.timeout(600)  # two driver starts and their executors on a shared machine
def test_demo_on_the_cluster_survives_a_driver_sigkill(cluster: Path, work: Path) -> None:
    master = status(cluster)["master_url"]
    result = waymark(
        "demo", "--master", master, "--events", "20000", "--users", "300",
        "--max-per-trigger", "8000", "--kill-at", "0.3", "--work-dir", str(work),
        timeout=420,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert master in out and "SIGKILL the driver" in out
    assert out.count("exactly once") == 2 and "records lost = 0, duplicated = 0" in out
    # The executors ran on the workers (their work dirs hold the applications), two
    # applications: the killed driver's and the restarted one's.
    apps = {p.name for w in ("worker-1", "worker-2") for p in (cluster / w).glob("app-*")}
    assert len(apps) >= 2
    # The class archive (tests/jvm_archive.py) reached the executors, and no JVM (the
    # drivers, the daemons, the executors) printed "Picked up JAVA_TOOL_OPTIONS".
    executors = list(cluster.glob("worker-*/app-*/*/stderr"))
    assert executors and all("-XX:SharedArchiveFile=" in p.read_text() for p in executors)
    logs = [*executors, *cluster.glob("*.log")]
    assert [p for p in logs if "Picked up" in p.read_text(errors="replace")] == []
    assert "Picked up" not in result.stderr


@pytest.mark.timeout(600)
def test_a_worker_sigkilled_mid_batch_reruns_its_tasks_on_the_other(
    cluster: Path, work: Path, spawn_server: Any
) -> None:
    """Also: a server with tokens, the token only in the driver's WAYMARK_TOKEN (the
    workers' environment has none): the driver hands it to the tasks."""
    tokens = work / "tokens.toml"
    token = token_new(tokens, "pipeline", "read:in", "write:out")
    producer, reader = token_new(tokens, "producer", "write:in"), token_new(tokens, "r", "read:*")
    server = spawn_server(work / "data", "--tokens", str(tokens))
    with Client(server.url, token=producer) as client:
        for lo in range(0, 2000, 500):
            client.append("in", [RecordIn.of({"i": i}) for i in range(lo, lo + 500)])
    markers = work / "markers"
    markers.mkdir()
    state = status(cluster)
    victim = next(d for d in state["daemons"] if d["role"] == "worker-1")
    driver = subprocess.Popen(
        [sys.executable, str(HERE / "cluster_driver.py"), state["master_url"], server.url,
         "in", "out", str(work / "checkpoint"), str(markers)],
        stdout=subprocess.DEVNULL, stderr=(work / "driver.log").open("wb"),
        env={**os.environ, "PYTHONPATH": str(HERE.parents[1]), "WAYMARK_TOKEN": token},
    )  # fmt: skip
    try:
        # Wait (with a deadline) until a task of batch 0 is held on the victim worker.
        deadline = time.monotonic() + 300
        held: list[Path] = []
        while not held:
            assert time.monotonic() < deadline, "no task of batch 0 reached worker-1"
            assert driver.poll() is None, (work / "driver.log").read_text()[-3000:]
            held = [
                m for m in markers.glob("task-*")
                if victim["pid"] in ancestors(int(m.name.rsplit("-", 1)[1]))
            ]  # fmt: skip
            time.sleep(0.1)
        partition = held[0].name.split("-")[1]
        os.killpg(victim["pid"], signal.SIGKILL)  # the machine is gone: worker, executor
        (markers / "go").touch()
        assert driver.wait(300) == 0, (work / "driver.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    # The held task ran again, as another attempt, on the surviving worker.
    survivor = next(d for d in state["daemons"] if d["role"] == "worker-2")
    reruns = [m for m in markers.glob(f"task-{partition}-*") if m != held[0]]
    assert reruns, sorted(p.name for p in markers.iterdir())
    # Exactly once at the sink: every input record once, nothing else.
    with Client(server.url, token=reader) as client:
        records = client.diff("out", 0, limit=5000).records
    assert sorted(r.data["i"] for r in records) == list(range(2000))
    assert status(cluster)["alive_workers"] == 1
    # `up` starts the dead worker again, on its work directory.
    again = waymark("cluster", "up", "--workers", "2", "--dir", str(cluster))
    assert again.returncode == 0, again.stderr
    after = status(cluster)
    assert after["alive_workers"] == 2
    assert [d["pid"] for d in after["daemons"] if d["role"] == "worker-2"] == [survivor["pid"]]


def test_a_spark_stage_on_the_cluster_survives_the_relocation_of_its_edge_on_s3(
    cluster: Path,
    work: Path,
    spawn_server: Any,
    moto_s3: MotoS3,  # noqa: F811
) -> None:
    """The edge's handoff store on S3 (moto), reached by the executors as well as the
    driver: the ``AWS_*`` settings reach the executors through ``spark.executorEnv``, as
    a user hands them. Two moves of the edge, each by another side:

    1. by a task, on an executor: a restart of the edge's server loses records the
       stage has not read (the edge topic is ``ephemeral`` there, so the restart loses
       them all, deterministically). The first batch's task meets the ``lost``
       tombstone and moves the edge with a conditional write to S3 from the executor
       (docs/semantics/pipeline.md §7.4); the producer writes them again there.
    2. by the producer: the edge's server is SIGKILLed mid-run, the edge moves to the
       other server, and the driver follows it between micro-batches.

    Every event reaches the sink exactly once."""
    from waymark.client import ConfigPatch, Durability
    from waymark.faults.processes import free_port
    from waymark.pipeline.identity import establish

    events = 1500  # in packs of 100, read 5 packs a micro-batch (each a cluster job)
    port = free_port()
    a, b, sink = (spawn_server(work / "a", "--port", str(port)),
                  *(spawn_server(work / name) for name in ("b", "sink")))  # fmt: skip
    handoff = f"s3://{moto_s3.create_bucket()}/handoff"
    store = open_store(handoff)
    edge_topic = establish(store, "cluster-stage").edge_topic("raw")
    with Client(a.url) as client:  # the producer claims it as it is: ephemeral
        client.put_topic(edge_topic, ConfigPatch(durability=Durability.EPHEMERAL))
    spec = external_stage_spec(work / "pipeline.toml", "cluster-stage", handoff, "raw",
                               [a.url, b.url], events)  # fmt: skip
    producer = subprocess.Popen(
        [WAYMARK, "pipeline", "run", str(spec), "--stage", "produce"],
        stdout=(work / "produce.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip

    def head() -> int:
        with Client(a.url) as client:
            return client.get_topic(edge_topic).head_seq

    deadline = time.monotonic() + 120
    while head() < 3:  # three packs of 100 events on the edge, none read: no stage yet
        assert time.monotonic() < deadline, "the producer wrote nothing to the edge"
        assert producer.poll() is None, (work / "produce.log").read_text()[-3000:]
        time.sleep(0.1)
    # A clean restart, the ephemeral topic keeping none of them; the producer paused
    # meanwhile, else it finds the server gone and moves the edge itself.
    producer.send_signal(signal.SIGSTOP)
    a.process.terminate()
    a.process.wait(30)
    a = spawn_server(work / "a", "--port", str(port))
    producer.send_signal(signal.SIGCONT)
    assert HandoffReader(store, "raw").current().generation == 1  # type: ignore[union-attr]
    executor_env = " ".join(
        f"--conf spark.executorEnv.{key}={value}" for key, value in moto_s3.environment().items()
    )
    stop, log = work / "stop", work / "driver.log"
    driver = subprocess.Popen(
        [sys.executable, str(HERE / "cluster_edge_driver.py"), status(cluster)["master_url"],
         "raw", handoff, sink.url, "enriched", str(work / "checkpoint"), str(stop)],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"),
        env={**os.environ, "PYTHONPATH": str(HERE.parents[1]),
             "PYSPARK_SUBMIT_ARGS": f"{executor_env} "
             + os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")},
    )  # fmt: skip

    def wait(predicate: Any, what: str, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            assert driver.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)

    try:
        wait(lambda: sum(sink_events(sink.url, "enriched").values()) >= events // 4,
             "a quarter of the events at the sink")  # fmt: skip
        moved_by_task = HandoffReader(store, "raw").current()
        assert moved_by_task is not None
        assert (moved_by_task.generation, moved_by_task.server) == (2, a.url)
        a.process.kill()  # SIGKILL the edge's server, mid-run
        a.process.wait()
        wait(lambda: (placed := HandoffReader(store, "raw").current()) is not None
             and placed.generation >= 3, "the edge to move")  # fmt: skip
        wait(lambda: producer.poll() is not None, "every event acknowledged to the producer")
        assert producer.returncode == 0, (work / "produce.log").read_text()[-3000:]
        wait(lambda: len(sink_events(sink.url, "enriched")) == events, "every event at the sink")
        stop.touch()
        assert driver.wait(120) == 0, log.read_text()[-3000:]
    finally:
        for process in (driver, producer):
            if process.poll() is None:
                process.kill()
    seen = sink_events(sink.url, "enriched")
    assert set(seen) == set(range(events)) and set(seen.values()) == {1}  # exactly once
    moved = HandoffReader(store, "raw").current()
    assert moved is not None and moved.generation >= 3 and moved.server == b.url
    report = load_report(store, "enrich")
    assert report is not None and report.rebinds >= 1
    # The first move was a task's, on an executor of the cluster (its log says so).
    executors = [p.read_text(errors="replace") for p in cluster.glob("worker-*/app-*/*/stderr")]
    assert any(f"are gone from {a.url}" in text for text in executors)
