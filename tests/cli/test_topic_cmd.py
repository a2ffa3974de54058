"""``waymark topic``: create, list, describe, config, delete records, drop, through the
shipped command against a real server (docs/cli.md, "Data commands")."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.cli.conftest import WAYMARK, run
from tests.conftest import ServerProcess

from waymark.cli.errors import EXIT_NOT_FOUND, EXIT_REFUSED
from waymark.client import Client, RecordIn


def test_topic_lifecycle(server: ServerProcess) -> None:
    url = server.url
    made = run(url, "topic", "create", "cli.orders", "-c", "cap_records=50",
               "-c", "discard=reject", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    state = json.loads(made.stdout)
    assert state["name"] == "cli.orders"
    assert state["config"]["cap_records"] == 50 and state["config"]["discard"] == "reject"

    # Creating it again is refused and leaves its config alone.
    again = run(url, "topic", "create", "cli.orders", "-c", "cap_records=7")
    assert again.returncode == EXIT_REFUSED and b"exists" in again.stderr
    # A config key the server does not have is a usage error, before any request.
    assert run(url, "topic", "create", "cli.other", "-c", "cap_recrods=1").returncode == 2

    with Client(url) as c:
        assert c.get_topic("cli.orders").config.cap_records == 50
        c.append("cli.orders", [RecordIn.of(i, tag=f"user:{i % 3}") for i in range(9)])
        assert "cli.other" not in {t.name for t in c.list_topics()}

    # In a pipe: a header, then one tab-separated line per topic.
    listed = run(url, "topic", "list").stdout.decode().splitlines()
    assert listed[0].split("\t")[:3] == ["name", "type", "count"]
    assert ["cli.orders", "log", "9"] in [line.split("\t")[:3] for line in listed[1:]]
    names = [t["name"] for t in json.loads(run(url, "topic", "list", "--json").stdout)]
    assert "cli.orders" in names

    described = dict(
        line.split("\t", 1) for line in run(url, "topic", "describe", "cli.orders").stdout
        .decode().splitlines()
    )  # fmt: skip
    assert described["count"] == "9" and described["head_seq"] == "9"
    assert described["config.discard"] == "reject"

    changed = run(url, "topic", "config", "cli.orders", "ttl_ms=60000", "--json")
    assert changed.returncode == 0, changed.stderr
    config = json.loads(changed.stdout)
    assert config["ttl_ms"] == 60000 and config["cap_records"] == 50  # the others kept
    # `config` changes topics, never creates one: the server's 404 propagates.
    missing = run(url, "topic", "config", "cli.nope", "ttl_ms=1")
    assert missing.returncode == EXIT_NOT_FOUND and b"topic_not_found" in missing.stderr
    with Client(url) as c:
        assert "cli.nope" not in {t.name for t in c.list_topics()}

    # Records by tag (Eq), then by tag prefix, then below a seq.
    deleted = json.loads(run(url, "topic", "delete", "cli.orders", "--tag", "user:0",
                             "--json").stdout)  # fmt: skip
    assert deleted["deleted"] == 3 and deleted["count"] == 6
    deleted = json.loads(run(url, "topic", "delete", "cli.orders", "--tag", "user:1*",
                             "--json").stdout)  # fmt: skip
    assert deleted["deleted"] == 3 and deleted["count"] == 3
    deleted = json.loads(run(url, "topic", "delete", "cli.orders", "--before-seq", "6",
                             "--json").stdout)  # fmt: skip
    assert deleted["deleted"] == 1 and deleted["count"] == 2
    with Client(url) as c:
        assert [r.data for r in c.diff("cli.orders", 0).records] == [5, 8]
    assert run(url, "topic", "delete", "cli.orders").returncode == 2  # no selector

    dropped = run(url, "topic", "drop", "cli.orders")
    assert dropped.returncode == 0, dropped.stderr
    gone = run(url, "topic", "describe", "cli.orders")
    assert gone.returncode == EXIT_NOT_FOUND and b"topic_not_found" in gone.stderr


def test_token_from_the_environment_or_the_option(
    tmp_path: Path, start_waymark: Callable[..., ServerProcess]
) -> None:
    tokens = tmp_path / "tokens.toml"
    made = subprocess.run(
        [WAYMARK, "token", "new", "reader", "--scope", "read:*", "--tokens", str(tokens)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    secret = made.stdout.strip().splitlines()[-1]
    server = start_waymark("--tokens", str(tokens))

    refused = run(server.url, "topic", "list")
    assert refused.returncode == EXIT_REFUSED and b"unauthorized" in refused.stderr
    from_env = run(server.url, "topic", "list", "--json", token=secret)
    assert from_env.returncode == 0, from_env.stderr
    assert json.loads(from_env.stdout) == []
    # A read-only token lists but cannot create; --token works like WAYMARK_TOKEN.
    denied = run(server.url, "topic", "create", "cli.t", "--token", secret)
    assert denied.returncode != 0 and b"forbidden" in denied.stderr
