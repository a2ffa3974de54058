"""A stage with three instances, each a ``waymark pipeline run --stage deliver
--instance i`` process owning a shard of the key space: the one holding shard 1 is
SIGKILLed mid-run, a live instance takes the shard over, and the sink holds every
event exactly once (docs/semantics/pipeline.md §11)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import ServerProcess
from tests.pipeline.test_processes import WAYMARK, sink_events

from waymark.client import Client
from waymark.objstore import open_store
from waymark.objstore.local import INTERNAL
from waymark.pipeline.identity import load_identity
from waymark.pipeline.report import load_report
from waymark.pipeline.runner import PipelineRunner
from waymark.pipeline.shard import read_lease, shard_of
from waymark.pipeline.spec import PipelineSpec, SpecError
from waymark.pipeline.state import StageStateStore

EVENTS = 3000


def spec_text(
    handoff: Path, edge_url: str, sink_url: str, instances: int = 3, events: int = EVENTS
) -> str:
    return f"""
[pipeline]
name = "shards"
handoff = "{handoff.as_uri()}"

[[edge]]
name = "raw"
candidates = ["{edge_url}"]

[[stage]]
name = "produce"
function = "waymark.pipeline.demo:produce"
events = {events}
batch = 100
output = "raw"

[[stage]]
name = "deliver"
function = "waymark.pipeline.demo:deliver"
input = "raw"
instances = {instances}
lease_s = 1.0
batch = 50
sink = {{ url = "{sink_url}", topic = "out" }}
"""


def launch(spec: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([WAYMARK, "pipeline", "run", str(spec), *args],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip


def pause(proc: subprocess.Popen[bytes], store_root: Path) -> None:
    """SIGSTOP ``proc`` outside the handoff store's lock. A local store commits every
    write under one ``flock`` shared by the host's processes (docs/kv.md, "Object
    stores"): a process paused inside a commit holds it and stalls every other
    instance's writes, lease takeovers included, until it is woken. A loaded machine
    stretches its commits, and the test once waited 60 s for a takeover that could not
    come. Holding the lock while the signal lands, until the process is stopped,
    pauses it anywhere but there."""
    fd = os.open(store_root / INTERNAL / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, "SIGSTOP did not stop the process"
            time.sleep(0.01)
    finally:
        os.close(fd)  # releases the lock


def test_the_shard_of_an_event_is_its_ids_crc32_mod_n() -> None:
    # stable across processes and documented (docs/semantics/pipeline.md §11.1)
    for n in (1, 2, 3, 7):
        for event in ("a", "shards.abc/produce:1", "x/transform:2"):
            assert shard_of(event, n) == zlib.crc32(event.encode()) % n


def test_instances_are_validated(tmp_path: Path) -> None:
    text = spec_text(tmp_path / "h", "http://127.0.0.1:1", "http://127.0.0.1:2")
    for bad, message in (
        ("instances = 3", "instances = 0"),
        ("instances = 3", "instances = 65"),
        ("instances = 3", 'instances = "three"'),
    ):
        path = tmp_path / "bad.toml"
        path.write_text(text.replace(bad, message))
        with pytest.raises(SpecError, match=r"\[\[stage\]\] 'deliver': instances"):
            PipelineSpec.load(path)
    source = text.replace("events = 3000", "events = 3000\ninstances = 2")
    path = tmp_path / "source.toml"
    path.write_text(source)
    with pytest.raises(SpecError, match="'produce': instances = 2 needs input = EDGE"):
        PipelineSpec.load(path)
    path = tmp_path / "good.toml"
    path.write_text(text)
    spec = PipelineSpec.load(path)
    assert list(PipelineRunner(spec, ["deliver"], instance=2).runs) == [
        "deliver.0", "deliver.1", "deliver.2"]  # fmt: skip
    with pytest.raises(KeyError, match="instances 0 to 2, not 3"):
        PipelineRunner(spec, ["deliver"], instance=3)
    with pytest.raises(KeyError, match="none of produce has"):
        PipelineRunner(spec, ["produce"], instance=1)


@pytest.mark.slow
def test_sigkill_of_an_instance_hands_its_shard_to_a_live_one_exactly_once(
    tmp_path: Path, start_waymark: Callable[..., ServerProcess]
) -> None:
    edge, sink = start_waymark(), start_waymark()
    handoff = tmp_path / "handoff"
    spec = tmp_path / "pipeline.toml"
    spec.write_text(spec_text(handoff, edge.url, sink.url))
    log = tmp_path / "stages.log"
    instances = {i: launch(spec, log, "--stage", "deliver", "--instance", str(i)) for i in range(3)}
    producer = launch(spec, log, "--stage", "produce")
    procs = [producer, *instances.values()]
    try:
        store = open_store(handoff.as_uri())
        deadline = time.monotonic() + 60
        with Client(sink.url) as client:
            while True:  # under load: every shard held, a quarter of the events through
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                leases = [read_lease(store, "deliver", k)[0] for k in range(3)]
                try:
                    through = client.get_topic("out").head_seq
                except Exception:
                    through = 0
                if all(leases) and through >= EVENTS // 4:
                    break
                time.sleep(0.02)
        holder = leases[1]
        assert holder is not None
        victim = int(holder.owner.split("[", 1)[1].split("]", 1)[0])
        instances[victim].send_signal(signal.SIGKILL)
        instances[victim].wait()
        assert sink_events(sink.url, "out").total() < EVENTS, "killed after the end"
        for i, proc in enumerate(procs):
            if i - 1 != victim:
                assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    seen = sink_events(sink.url, "out")
    assert sorted(seen) == list(range(EVENTS)), "events lost"
    assert max(seen.values()) == 1, "events duplicated"
    status = json.loads(subprocess.run(
        [WAYMARK, "pipeline", "status", str(spec), "--json"], capture_output=True, text=True,
        check=True,
    ).stdout)  # fmt: skip
    taken = status["shards"]["deliver.1"]
    assert taken["epoch"] == holder.epoch + 1, status["shards"]
    assert f"[{victim}]" not in taken["owner"], status["shards"]
    assert set(status["edges"]) == {"raw.0", "raw.1", "raw.2"}
    assert status["edges"]["raw.1"]["consumer"] == "deliver.1"
    assert all(status["stages"][f"deliver.{k}"]["done"] for k in range(3))
    table = subprocess.run(
        [WAYMARK, "pipeline", "status", str(spec)], capture_output=True, text=True, check=True,
        env={**os.environ, "COLUMNS": "250"},
    ).stdout  # fmt: skip
    row = next(line for line in table.splitlines() if "deliver.1 (" in line)
    assert f"epoch {taken['epoch']})" in row and "done" in row, table


@pytest.mark.slow
def test_a_sigstopped_holder_is_taken_over_and_fenced_when_it_wakes(
    tmp_path: Path, start_waymark: Callable[..., ServerProcess]
) -> None:
    # A holder that is only paused (SIGSTOP: a GC pause, a frozen VM) loses its shard
    # to a live instance, which carries on; woken, it finds its lease and its stage
    # state claimed, stands by and writes nothing twice (docs/semantics/pipeline.md §11.2).
    edge, sink = start_waymark(), start_waymark()
    handoff = tmp_path / "handoff"
    spec = tmp_path / "pipeline.toml"
    # The source holds event EVENTS // 2 until the holder is paused, and event
    # EVENTS * 5 // 6 until it is woken: shard 1 then has events only the new holder can
    # deliver, and the woken holder finds events still flowing to race it for. (A source
    # paced by time alone let a loaded machine deliver all of shard 1 before the pause,
    # and the test waited 60 s for progress that could not come.)
    stopped, woken = tmp_path / "stopped", tmp_path / "woken"
    (tmp_path / "paced.py").write_text(f"""
import time
from pathlib import Path
from waymark.pipeline import demo

GATES = ((Path({str(stopped)!r}), {EVENTS // 2}), (Path({str(woken)!r}), {EVENTS * 5 // 6}))


def produce(n):
    for gate, at in GATES:
        while n >= at and not gate.exists():  # held until the test opens it
            time.sleep(0.01)
    time.sleep(0.002)
    return demo.produce(n)
""")
    text = spec_text(handoff, edge.url, sink.url)
    spec.write_text(text.replace("waymark.pipeline.demo:produce", "paced:produce"))
    logs = {i: tmp_path / f"deliver-{i}.log" for i in range(3)}
    instances = {i: launch(spec, logs[i], "--stage", "deliver", "--instance", str(i))
                 for i in range(3)}  # fmt: skip
    producer = launch(spec, tmp_path / "produce.log", "--stage", "produce")
    procs = [producer, *instances.values()]
    store = open_store(handoff.as_uri())

    def wait_for(what: str, ready: Callable[[], bool], within_s: float = 60) -> None:
        deadline = time.monotonic() + within_s
        while not ready():
            tail = "".join(p.read_text()[-1500:] for p in logs.values() if p.exists())
            assert time.monotonic() < deadline, f"{what}: not within {within_s} s\n{tail}"
            time.sleep(0.05)

    def through(shard: int | None = None) -> int:
        seen = sink_events(sink.url, "out")
        if shard is None:
            return len(seen)
        identity = load_identity(store)
        assert identity is not None
        return sum(shard_of(identity.event("produce", n), 3) == shard for n in seen)

    try:
        # four processes starting at once take long on a loaded machine
        wait_for("every shard held, a quarter through",
                 lambda: all(read_lease(store, "deliver", k)[0] for k in range(3))
                 and through() >= EVENTS // 4, within_s=120)  # fmt: skip
        holder = read_lease(store, "deliver", 1)[0]
        assert holder is not None
        victim = int(holder.owner.split("[", 1)[1].split("]", 1)[0])
        pause(instances[victim], handoff)
        stopped_at = through(1)
        stopped.touch()  # the rest of the first part flows, to the new holder only

        def taken_over() -> bool:
            lease = read_lease(store, "deliver", 1)[0]
            return lease is not None and lease.epoch > holder.epoch

        wait_for("shard 1 taken over", taken_over)
        taken = read_lease(store, "deliver", 1)[0]
        assert taken is not None and taken.owner != holder.owner
        wait_for("shard 1's events going on without the paused holder",
                 lambda: through(1) > stopped_at)  # fmt: skip
        assert through() < EVENTS, "resumed after the end: nothing left to race for"
        instances[victim].send_signal(signal.SIGCONT)
        woken.touch()  # the last events flow while the woken holder races for them
        for proc in procs:
            assert proc.wait(120) == 0, "".join(p.read_text()[-2000:] for p in logs.values())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
    woken = logs[victim].read_text()
    assert "deliver.1: the shard is another instance's" in woken, woken[-3000:]
    seen = sink_events(sink.url, "out")
    assert sorted(seen) == list(range(EVENTS)), "events lost"
    assert max(seen.values()) == 1, "events duplicated"
    # The shard's report is its last holder's, whatever the woken one sent after it
    # (docs/semantics/pipeline.md §4.7).
    state = StageStateStore(store).load("deliver.1")
    report = load_report(store, "deliver.1")
    assert state is not None and report is not None
    assert report.done and report.incarnation == state.incarnation, (report, state)


def test_a_sharded_transform_feeds_one_sink_stage_every_event_once(
    tmp_path: Path, start_waymark: Callable[..., ServerProcess]
) -> None:
    # The sink stage waits for every shard of its producer to be done, and reads
    # what the shards write to one edge (docs/semantics/pipeline.md §11.1).
    edge, sink = start_waymark(), start_waymark()
    text = spec_text(tmp_path / "handoff", edge.url, sink.url, instances=2, events=600)
    text = text.replace('''name = "deliver"''', '''name = "transform"''').replace(
        f'''sink = {{ url = "{sink.url}", topic = "out" }}''',
        '''output = "enriched"''',
    )
    text += f"""
[[edge]]
name = "enriched"
candidates = ["{edge.url}"]

[[stage]]
name = "deliver"
function = "waymark.pipeline.demo:deliver"
input = "enriched"
sink = {{ url = "{sink.url}", topic = "out" }}
"""
    path = tmp_path / "transform.toml"
    path.write_text(text)
    spec = PipelineSpec.load(path)
    assert spec.producer_keys("enriched") == ["transform.0", "transform.1"]
    runner = PipelineRunner(spec)
    runner.start()
    try:
        assert runner.wait(90), runner.failure()
    finally:
        runner.stop()
    seen = sink_events(sink.url, "out")
    assert sorted(seen) == list(range(600)), "events lost"
    assert max(seen.values()) == 1, "events duplicated"


def test_a_changed_instance_count_is_refused_naming_both_counts(
    tmp_path: Path, start_waymark: Callable[..., ServerProcess]
) -> None:
    # An event's shard is crc32 mod instances: a rerun on the same handoff store with
    # another count would route to shards other than those holding its records and
    # checkpoints, so it is refused before anything runs (docs/semantics/pipeline.md §11.4).
    edge, sink = start_waymark(), start_waymark()
    spec = tmp_path / "pipeline.toml"
    text = spec_text(tmp_path / "handoff", edge.url, sink.url, events=300)
    spec.write_text(text)
    first = subprocess.run([WAYMARK, "pipeline", "run", str(spec), "--timeout-s", "90"],
                           capture_output=True, text=True)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    for count in (2, 1):
        spec.write_text(text.replace("instances = 3", f"instances = {count}"))
        again = subprocess.run([WAYMARK, "pipeline", "run", str(spec), "--timeout-s", "30"],
                               capture_output=True, text=True)  # fmt: skip
        assert again.returncode == 5, again.stderr[-3000:]  # refused (docs/cli.md)
        assert "Traceback" not in again.stderr
        assert (f"stage 'deliver' ran with instances = 3 on this handoff store; the file now "
                f"says {count}") in again.stderr, again.stderr  # fmt: skip
        assert "set instances back to 3" in again.stderr
    spec.write_text(text)  # back to 3: resumes, done, nothing delivered twice
    same = subprocess.run([WAYMARK, "pipeline", "run", str(spec), "--timeout-s", "30"],
                          capture_output=True, text=True)  # fmt: skip
    assert same.returncode == 0, same.stderr[-3000:]
    seen = sink_events(sink.url, "out")
    assert sorted(seen) == list(range(300)) and max(seen.values()) == 1


def test_a_runners_injected_clock_is_the_one_its_stages_run_on(
    tmp_path: Path, start_waymark: Callable[..., ServerProcess]
) -> None:
    # `--clock-offset-file`: the fault campaign's clock jump on a pipeline
    # (docs/faults.md, "Faults"). The runner's clock, 1 day ahead here, is the one its
    # shard leases are timed by (one PipelineRunner clock) and its stage reports stamped with.
    server = start_waymark()
    spec = tmp_path / "pipeline.toml"
    spec.write_text(spec_text(tmp_path / "handoff", server.url, server.url, instances=2,
                              events=50))  # fmt: skip
    offset = tmp_path / "clock-offset"
    offset.write_text(f"{86_400_000}\n")
    ahead = time.time_ns() // 1_000_000 + 86_400_000
    ran = subprocess.run([WAYMARK, "pipeline", "run", str(spec), "--timeout-s", "90",
                          "--clock-offset-file", str(offset)],
                         capture_output=True, text=True)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = sink_events(server.url, "out")
    assert sorted(seen) == list(range(50)) and max(seen.values()) == 1
    store = open_store((tmp_path / "handoff").as_uri())
    report = load_report(store, "deliver.0")
    assert report is not None and report.updated_ms >= ahead - 60_000, report


def test_a_rerun_runs_every_shard_its_producers_have_new_events_for(
    tmp_path: Path, start_waymark: Callable[..., ServerProcess]
) -> None:
    # A shard whose stored report says done is not run again, unless its producers
    # have more (docs/semantics/pipeline.md §11.3). A rerun with a fresh handoff store
    # is a new run (docs/semantics/pipeline.md §8.1): its reports start empty, so every
    # shard runs and delivers every event again under new ids. A rerun on the same
    # store resumes: a shard done then may have nothing left, but a source given more
    # events has events for it, and a shard skipped on its old report left the source
    # waiting for acknowledgements that never came.
    edge, sink = start_waymark(), start_waymark()
    spec = tmp_path / "pipeline.toml"

    def run(handoff: str, events: int, topic: str) -> None:
        text = spec_text(tmp_path / handoff, edge.url, sink.url, instances=2, events=events)
        spec.write_text(text.replace('topic = "out"', f'topic = "{topic}"'))
        done = subprocess.run([WAYMARK, "pipeline", "run", str(spec), "--timeout-s", "30"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]

    run("handoff-1", 300, "first")
    run("handoff-2", 300, "second")  # the same spec as a new run: every event again
    assert sink_events(sink.url, "first") == sink_events(sink.url, "second")
    assert sorted(sink_events(sink.url, "second")) == list(range(300))
    run("handoff-2", 600, "second")  # resumed with 300 events more: each once
    seen = sink_events(sink.url, "second")
    assert sorted(seen) == list(range(600)) and max(seen.values()) == 1
