"""``waymark queue`` and ``waymark router`` through the shipped command against a real
server (docs/cli.md, "Data commands")."""

from __future__ import annotations

import json
import time

from tests.cli.conftest import run
from tests.conftest import ServerProcess

from waymark.cli.errors import EXIT_REFUSED
from waymark.client import Client, ConfigPatch, RecordIn, TopicType


def test_claim_ack_nack_stats(server: ServerProcess) -> None:
    url = server.url
    with Client(url) as c:
        c.put_topic("cli.jobs", ConfigPatch(lease_ms=60_000), type=TopicType.QUEUE)
        c.append("cli.jobs", [RecordIn.of({"to": n}) for n in "abc"])
        c.append("cli.log", [RecordIn.of(1)])

    claimed = run(url, "queue", "claim", "cli.jobs", "--node", "w1", "--max", "2", "--json")
    assert claimed.returncode == 0, claimed.stderr
    jobs = [json.loads(line) for line in claimed.stdout.splitlines()]
    assert [(j["$seq"], j["data"], j["delivery"]) for j in jobs] == [
        (1, {"to": "a"}, 1), (2, {"to": "b"}, 1)
    ]  # fmt: skip

    # Settling what another worker holds is skipped, and said on stderr.
    foreign = run(url, "queue", "ack", "cli.jobs", "1", "--node", "w2")
    assert foreign.returncode == 0 and foreign.stdout.strip() == b""
    assert b"not acked" in foreign.stderr and foreign.stderr.rstrip().endswith(b": 1")
    acked = run(url, "queue", "ack", "cli.jobs", "1", "--node", "w1",
                "--lease-id", jobs[0]["lease_id"], "--json")  # fmt: skip
    assert json.loads(acked.stdout) == {"acked": [1], "skipped": []}
    released = run(url, "queue", "nack", "cli.jobs", "2", "--node", "w1")
    assert released.stdout.strip() == b"2" and released.stderr == b""

    stats = run(url, "queue", "stats", "cli.jobs", "--json")
    counts = json.loads(stats.stdout)
    assert (counts["ready"], counts["in_flight"], counts["dead_lettered"]) == (2, 0, 0)
    not_queue = run(url, "queue", "stats", "cli.log")
    assert not_queue.returncode == EXIT_REFUSED and b"not_a_queue" in not_queue.stderr


def test_router_create_list_delete(server: ServerProcess) -> None:
    url = server.url
    made = run(url, "router", "create", "cli.r", "--source", "cli.src", "--dest", "cli.dst",
               "--filter-tag", "keep:*", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["filter"] == {"tag": ["tag", "Glob", "keep:*"]}
    again = run(url, "router", "create", "cli.r", "--source", "cli.src", "--dest", "other")
    assert again.returncode == EXIT_REFUSED and b"exists" in again.stderr

    with Client(url) as c:
        c.append("cli.src", [RecordIn.of(1, tag="keep:a"), RecordIn.of(2, tag="drop"),
                             RecordIn.of(3, tag="keep:b")])  # fmt: skip
        deadline = time.monotonic() + 20
        while c.get_topic("cli.dst", touch=False).count < 2:
            assert time.monotonic() < deadline, "the router never forwarded"
            c.diff("cli.dst", 0, wait_ms=1000)  # woken by the forward's commit
        assert [r.data for r in c.diff("cli.dst", 0).records] == [1, 3]

    listed = run(url, "router", "list").stdout.decode().splitlines()
    assert listed[0].split("\t")[:3] == ["name", "source", "dest"]
    assert [line.split("\t")[:3] for line in listed[1:]] == [["cli.r", "cli.src", "cli.dst"]]
    assert run(url, "router", "delete", "cli.r").returncode == 0
    assert json.loads(run(url, "router", "list", "--json").stdout) == []
