"""Pipeline identity through the CLI, as a user runs it (docs/semantics/pipeline.md §8):
a rerun with a fresh handoff store delivers every event again, and two pipelines with
the same edge names on the same servers each deliver exactly their own events."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import ServerProcess
from tests.pipeline.test_processes import sink_events

from waymark.client import ApiError, Client, ConfigPatch, ErrorCode
from waymark.objstore import open_store
from waymark.pipeline.identity import establish

WAYMARK = str(Path(sys.executable).parent / "waymark")


@dataclass
class Servers:
    a: ServerProcess
    b: ServerProcess
    sink: ServerProcess


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
    spawn_module_server: Callable[..., ServerProcess],
) -> Servers:
    root = tmp_path_factory.mktemp("identity")
    return Servers(*(spawn_module_server(root / name) for name in ("a", "b", "sink")))


def write_spec(
    root: Path, servers: Servers, tag: str, *, name: str, sink_topic: str, events: int
) -> Path:
    """The docs' three-stage pipeline: produce -> raw -> transform -> enriched -> sink,
    in ``root/<tag>.toml`` with its handoff store in ``root/handoff-<tag>``."""
    path, handoff = root / f"{tag}.toml", root / f"handoff-{tag}"
    path.write_text(f"""
[pipeline]
name = "{name}"
handoff = "{handoff.as_uri()}"
servers = ["{servers.a.url}", "{servers.b.url}"]

[[edge]]
name = "raw"

[[edge]]
name = "enriched"
candidates = ["{servers.b.url}", "{servers.a.url}"]

[[stage]]
name = "produce"
function = "waymark.pipeline.demo:produce"
events = {events}
output = "raw"

[[stage]]
name = "transform"
function = "waymark.pipeline.demo:enrich"
input = "raw"
output = "enriched"

[[stage]]
name = "sink"
function = "waymark.pipeline.demo:deliver"
input = "enriched"
sink = {{ url = "{servers.sink.url}", topic = "{sink_topic}" }}
""")
    return path


def run(spec: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [WAYMARK, "pipeline", "run", str(spec), "--timeout-s", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
    )  # fmt: skip


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    return out


def exactly(events: int) -> Counter[int]:
    return Counter(range(events))


def test_a_rerun_with_a_fresh_handoff_store_delivers_every_event(
    tmp_path: Path, servers: Servers
) -> None:
    first = write_spec(tmp_path, servers, "1", name="clicks", sink_topic="rerun-1", events=1000)
    finish(run(first))
    assert sink_events(servers.sink.url, "rerun-1") == exactly(1000)
    # The same spec, only the handoff store and the sink topic changed.
    second = write_spec(tmp_path, servers, "2", name="clicks", sink_topic="rerun-2", events=1000)
    finish(run(second))
    assert sink_events(servers.sink.url, "rerun-2") == exactly(1000)


def test_two_pipelines_sharing_edge_names_and_servers_each_get_their_own_events(
    tmp_path: Path, servers: Servers
) -> None:
    alpha = write_spec(tmp_path, servers, "a", name="alpha", sink_topic="alpha-out", events=3000)
    beta = write_spec(tmp_path, servers, "b", name="beta", sink_topic="beta-out", events=5000)
    procs = [run(alpha), run(beta)]
    for proc in procs:
        finish(proc)
    assert sink_events(servers.sink.url, "alpha-out") == exactly(3000)
    assert sink_events(servers.sink.url, "beta-out") == exactly(5000)


def test_a_server_refuses_a_second_owner_of_a_topic_even_after_a_restart(
    tmp_path: Path, spawn_server: Callable[..., ServerProcess]
) -> None:
    server = spawn_server(tmp_path / "data")
    with Client(server.url) as client:
        state, created = client.put_topic("edge.alpha.0123456789ab.raw", ConfigPatch(owner="alpha"))
        assert created and state.config.owner == "alpha"
        client.put_topic("edge.alpha.0123456789ab.raw", ConfigPatch(owner="alpha"))  # idempotent
        client.put_topic("edge.alpha.0123456789ab.raw", ConfigPatch(cap_records=10))  # no claim
    server.stop(signal.SIGKILL)
    server = spawn_server(tmp_path / "data")
    with Client(server.url) as client:
        with pytest.raises(ApiError) as refused:
            client.put_topic("edge.alpha.0123456789ab.raw", ConfigPatch(owner="beta"))
        assert refused.value.status == 409
        assert refused.value.code == ErrorCode.TOPIC_EXISTS_INCOMPATIBLE
        assert refused.value.detail == {"topic": "edge.alpha.0123456789ab.raw",
                                        "reason": "topic_owned", "owner": "alpha",
                                        "requested": "beta"}  # fmt: skip
        state = client.get_topic("edge.alpha.0123456789ab.raw")
        assert state.config.owner == "alpha" and state.config.cap_records == 10


def test_a_pipeline_whose_edge_topic_another_owns_stops_naming_it(
    tmp_path: Path, servers: Servers
) -> None:
    spec = write_spec(tmp_path, servers, "t", name="taken", sink_topic="taken-out", events=10)
    topic = establish(open_store((tmp_path / "handoff-t").as_uri()), "taken").edge_topic("raw")
    with Client(servers.a.url) as client:
        client.put_topic(topic, ConfigPatch(owner="someone-else"))
    proc = run(spec)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "stage 'produce'" in out and "owned by 'someone-else'" in out, out
