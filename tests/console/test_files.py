"""The console's files at /ui (docs/console.md) on a real server, and the API numbers
added for it: ``GET /v0/writers`` and a queue's ``earliest_lease_deadline``."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from tests.conftest import ServerProcess

from waymark.client import AsyncClient, Client
from waymark.protocol import ConfigPatch, RecordIn, StagedPart, TopicType

UI = Path(__file__).resolve().parents[2] / "src" / "waymark" / "server" / "ui"


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=server.url)


@pytest.mark.parametrize("path", ["/ui", "/ui/", "/ui/index.html"])
def test_the_console_page_is_served_at_ui(http: httpx.Client, path: str) -> None:
    page = http.get(path)
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert b'<script type="module" src="/ui/console.js">' in page.content
    # Only its own files and its own server: nothing from the internet.
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_every_module_the_console_imports_is_served(http: httpx.Client) -> None:
    scripts = sorted(p.name for p in UI.glob("*.js"))
    assert "console.js" in scripts and len(scripts) >= 5
    for name in scripts:
        served = http.get(f"/ui/{name}")
        assert served.status_code == 200, name
        assert served.headers["content-type"] == "text/javascript; charset=utf-8"
        assert served.content == (UI / name).read_bytes()
        for imported in re.findall(r'from "\./([\w.-]+)"', served.text):
            assert http.get(f"/ui/{imported}").status_code == 200, (name, imported)
        # No absolute URL: nothing is fetched from elsewhere at run time.
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", served.text), name
    assert http.get("/ui/style.css").headers["content-type"] == "text/css; charset=utf-8"


def test_unknown_files_and_writes_are_refused_with_the_api_s_errors(http: httpx.Client) -> None:
    missing = http.get("/ui/nope.js")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert http.get("/ui/../v0/health").status_code in (200, 404)  # never a file outside
    assert http.get("/uix").status_code == 404
    posted = http.post("/ui/", content=b"x")
    assert posted.status_code == 405
    assert posted.json()["error"]["code"] == "method_not_allowed"


def test_the_openapi_document_describes_the_api_only(http: httpx.Client) -> None:
    paths = http.get("/v0/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/ui")]
    assert "get" in paths["/v0/writers"] and "post" in paths["/v0/writers"]


def test_list_writers_gives_epochs_and_each_topic_s_last_published_batch(client: Client) -> None:
    writer, topic, other = "lw-sink", "lw-out", "lw-other"
    assert writer not in {w.writer for w in client.list_writers()}
    client.open_writer(writer)
    epoch = client.open_writer(writer).epoch
    published = []
    for batch in (3, 7):  # batch ids need not be contiguous; the last published counts
        client.stage(topic, [RecordIn.of(batch)] * 2, writer=writer, epoch=epoch,
                     batch_id=batch, partition=0, attempt=0)  # fmt: skip
        published.append(client.publish(topic, writer=writer, epoch=epoch, batch_id=batch,
                                        parts=[StagedPart(0, 0, 1)]))  # fmt: skip
    client.stage(other, [RecordIn.of("x")], writer=writer, epoch=epoch, batch_id=0,
                 partition=1, attempt=0)  # fmt: skip
    [state] = [w for w in client.list_writers() if w.writer == writer]
    assert state.epoch == epoch == 2
    by_topic = {t.topic: t for t in state.topics}
    assert by_topic[topic].last_batch_id == 7
    assert (by_topic[topic].first_seq, by_topic[topic].count) == (published[1].first_seq, 2)
    assert by_topic[topic].staged_parts == 0
    # Staged, not yet published: no last batch, one staged part.
    assert by_topic[other].last_batch_id is None and by_topic[other].staged_parts == 1


def test_a_queue_state_reports_its_oldest_lease_through_the_client(client: Client) -> None:
    name = "oldest-lease-q"
    client.put_topic(name, ConfigPatch(lease_ms=60_000), type=TopicType.QUEUE)
    client.append(name, [RecordIn.of(i) for i in range(3)])
    state = client.get_topic(name, touch=False).queue
    assert state is not None and state.earliest_lease_deadline is None
    [first] = client.claim(name, "w", 1, lease_ms=5_000)
    [second] = client.claim(name, "w", 1, lease_ms=50_000)
    state = client.get_topic(name, touch=False).queue
    assert state is not None and state.earliest_lease_deadline == first.deadline
    client.ack(name, "w", [first.seq])
    state = client.get_topic(name, touch=False).queue
    assert state is not None and state.earliest_lease_deadline == second.deadline


async def test_the_async_client_lists_writers_too(server: ServerProcess, client: Client) -> None:
    client.open_writer("async-lw")
    async with AsyncClient(server.url) as aclient:
        states = {w.writer: w for w in await aclient.list_writers()}
    assert states["async-lw"].epoch >= 1 and states["async-lw"].topics == []


def test_writers_and_their_last_batch_survive_a_sigkill(
    tmp_path: Path, spawn_server: Callable[..., ServerProcess]
) -> None:
    """The Writers page after a crash: epochs and publish ledgers are durable
    (docs/spark.md), so the list shows the same last batch."""
    data = tmp_path / "data"
    first = spawn_server(data)
    with Client(first.url) as c:
        epoch = c.open_writer("crash-sink").epoch
        c.stage("crash-out", [RecordIn.of(1), RecordIn.of(2)], writer="crash-sink",
                epoch=epoch, batch_id=41, partition=0, attempt=0)  # fmt: skip
        done = c.publish("crash-out", writer="crash-sink", epoch=epoch, batch_id=41,
                         parts=[StagedPart(0, 0, 1)])  # fmt: skip
        before = c.list_writers()
    first.stop(signal.SIGKILL)
    with Client(spawn_server(data).url) as c:
        assert c.list_writers() == before
        [state] = c.list_writers()
    assert state.epoch == epoch
    assert (state.topics[0].last_batch_id, state.topics[0].first_seq) == (41, done.first_seq)
