"""An object-store outage is waited out (docs/semantics/pipeline.md §10): the handoff
store is a real S3 (moto) behind a fault-injecting TCP proxy that is down for a few
seconds while ``waymark pipeline run`` moves events; the run finishes with every
event at the sink exactly once, and the live status says "waiting for the store"
meanwhile instead of dying."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import ServerProcess
from tests.objstore.s3 import MotoS3, moto_s3  # noqa: F401 -- the session's S3
from tests.pipeline.conftest import FaultProxy
from tests.pipeline.test_processes import sink_events

from waymark.client import ApiError, Client
from waymark.objstore import open_store
from waymark.pipeline.spec import PipelineSpec

WAYMARK = str(Path(sys.executable).parent / "waymark")
EVENTS = 6_000
OUTAGE_S = 3.0


@pytest.fixture
def s3_proxy(moto_s3: MotoS3) -> Iterator[FaultProxy]:  # noqa: F811
    proxy = FaultProxy(moto_s3.endpoint)
    yield proxy
    proxy.close()


def write_spec(root: Path, handoff: str, url: str, sink_topic: str) -> Path:
    path = root / "outage.toml"
    path.write_text(f"""
[pipeline]
name = "outage"
handoff = "{handoff}"
servers = ["{url}"]

[[edge]]
name = "raw"

[[stage]]
name = "produce"
function = "waymark.pipeline.demo:produce"
events = {EVENTS}
batch = 200
output = "raw"

[[stage]]
name = "sink"
function = "waymark.pipeline.demo:deliver"
input = "raw"
batch = 200
sink = {{ url = "{url}", topic = "{sink_topic}" }}
""")
    return path


def sink_head(url: str, topic: str) -> int:
    with Client(url) as client:
        try:
            return client.get_topic(topic).head_seq
        except ApiError:
            return 0


def test_an_object_store_outage_is_waited_out(
    tmp_path: Path,
    moto_s3: MotoS3,  # noqa: F811
    s3_proxy: FaultProxy,
    waymark_server: ServerProcess,
) -> None:
    handoff = f"s3://{moto_s3.create_bucket()}/outage"
    topic = f"outage-{uuid.uuid4().hex[:8]}"
    spec = write_spec(tmp_path, handoff, waymark_server.url, topic)
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_proxy.url, "COLUMNS": "250"}
    proc = subprocess.Popen([WAYMARK, "pipeline", "run", str(spec), "--timeout-s", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while sink_head(waymark_server.url, topic) < EVENTS // 5:  # under way
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        s3_proxy.down()
        started = time.monotonic()
        # what the live status shows meanwhile (the same tables, through the same proxy)
        os.environ["AWS_ENDPOINT_URL"] = s3_proxy.url
        try:
            from waymark.cli.pipeline import status_tables

            edges, _ = status_tables(PipelineSpec.load(spec), open_store(handoff))
        finally:
            os.environ["AWS_ENDPOINT_URL"] = moto_s3.endpoint
        assert "waiting for the store" in str(edges.title)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - started)))  # the outage's length
        s3_proxy.up()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert sink_events(waymark_server.url, topic) == Counter(range(EVENTS))
    # waited out, not failed and restarted
    status = subprocess.run([WAYMARK, "pipeline", "status", str(spec), "--json"],
                            capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    stages = json.loads(status.stdout)["stages"]
    assert {name: r["restarts"] for name, r in stages.items()} == {"produce": 0, "sink": 0}
