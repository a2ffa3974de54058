"""The process faults on real processes, without a campaign (docs/faults.md, "Faults"):
a pipeline fault on a runner that finished does nothing and starts nothing, one on a
running runner kills its whole process group and runs it again, and nats-server
SIGKILLed and started again on its store keeps every write it acknowledged."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from waymark.faults.campaign import FINISHED, _apply
from waymark.faults.processes import Managed, free_port, listening, wait_for
from waymark.faults.schedule import Fault, FaultKind
from waymark.kv.server import nats_server_executable

NONE: Any = None  # the proxy, disk and clock: no process fault touches them


def now() -> float:
    return time.monotonic()


def runner(tmp_path: Path, code: str) -> Managed:
    """A stand-in for `waymark pipeline run`, in a process group of its own as the
    campaign starts it."""
    return Managed("pipeline", ["-c", code], tmp_path / "pipeline.log",
                   program=[sys.executable], group=True)  # fmt: skip


def test_a_pipeline_fault_on_a_finished_runner_does_nothing_and_runs_nothing_again(
    tmp_path: Path,
) -> None:
    pipeline = runner(tmp_path, "pass")
    pipeline.start()
    assert pipeline.wait(30) == 0
    for kind in (FaultKind.PIPELINE_KILL, FaultKind.PIPELINE_PAUSE):
        applied = _apply(Fault(0, kind, 0.1), {"pipeline": pipeline}, NONE, NONE, NONE, now)
        assert applied.noop == FINISHED
    assert pipeline.starts == 1 and pipeline.wait(0) == 0  # not run a second time


def test_a_pipeline_kill_ends_the_runners_whole_group_and_runs_it_again(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    code = (
        "import pathlib, subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"pathlib.Path({str(child)!r}).write_text(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    pipeline = runner(tmp_path, code)
    pipeline.start()
    try:
        first = int(str(wait_for("the child started", lambda: child.read_text().strip())))
        applied = _apply(Fault(0, FaultKind.PIPELINE_KILL, 0.1), {"pipeline": pipeline},
                         NONE, NONE, NONE, now)  # fmt: skip
        assert applied.noop is None and applied.lifted_s > applied.injected_s
        assert pipeline.exits == [-signal.SIGKILL] and pipeline.alive  # run again

        def gone() -> bool:  # the runner's child died with it (reaped by init)
            try:
                os.kill(first, 0)
            except ProcessLookupError:
                return True
            return Path(f"/proc/{first}/stat").read_text().split()[2] == "Z"

        wait_for("the killed runner's child gone", gone, 10)
        applied = _apply(Fault(0, FaultKind.PIPELINE_PAUSE, 0.1), {"pipeline": pipeline},
                         NONE, NONE, NONE, now)  # fmt: skip
        assert applied.noop is None and pipeline.alive
    finally:
        pipeline.kill()


def test_nats_server_killed_and_started_again_keeps_every_acknowledged_write(
    tmp_path: Path,
) -> None:
    """SIGKILL leaves what nats-server wrote in the page cache: a write it acknowledged
    is in the bucket after it starts again on the same store directory and port, and a
    client connected throughout writes on once it is back."""
    from waymark.kv import Connection, NatsConnectionConfig, StoreConfig

    port = free_port()
    nats = Managed(
        "nats", ["-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp_path / "nats")],
        tmp_path / "nats.log", ready=lambda: listening(port), program=[nats_server_executable()],
    )  # fmt: skip
    nats.start()

    async def run() -> None:
        config = NatsConnectionConfig(url=f"nats://127.0.0.1:{port}", timeout=5)
        async with Connection(config) as conn:
            kv = await conn.store("apply", StoreConfig(max_bytes=None))
            acked = {
                f"k{i}": (await kv.writer().put(f"k{i}", b"v%d" % i)).as_u64() for i in range(500)
            }
            await asyncio.to_thread(_apply, Fault(0, FaultKind.NATS_KILL, 0.2),
                                    {"nats": nats}, NONE, NONE, NONE, now)  # fmt: skip
            assert nats.exits == [-signal.SIGKILL]
            after = await kv.writer().put("after", b"x")  # the client reconnected
            got = {e.key: e.version.as_u64() for e in await kv.reader().scan()}
            assert {k: got.get(k) for k in acked} == acked
            assert got["after"] == after.as_u64() == 501

    try:
        asyncio.run(run())
    finally:
        nats.stop()
