"""``waymark kv put|get|watch`` through the shipped command, against the session's real
nats-server (tests/kv/conftest.py), as a user runs it: NATS_URL set in the environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import readable

from waymark.cli.errors import EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_USAGE
from waymark.kv.server import EmbeddedNats

WAYMARK = str(Path(sys.executable).parent / "waymark")


def kv(nats: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "NATS_URL": nats}
    return subprocess.run(
        [WAYMARK, "kv", *args], input=stdin, capture_output=True, env=env, timeout=120,
        check=False,
    )  # fmt: skip


def test_put_then_get_round_trips_text_and_bytes(
    nats_server: EmbeddedNats, bucket_name: str
) -> None:
    put = kv(nats_server.url, "put", bucket_name, "routes.eu-1", "10.0.0.1", "--json")
    assert put.returncode == 0, put.stderr
    written = json.loads(put.stdout)
    assert written["key"] == "routes.eu-1" and written["version"] >= 1

    got = kv(nats_server.url, "get", bucket_name, "routes.eu-1")
    assert (got.returncode, got.stdout) == (0, b"10.0.0.1")  # as stored, nothing added
    as_json = json.loads(kv(nats_server.url, "get", bucket_name, "routes.eu-1", "--json").stdout)
    assert as_json == {"key": "routes.eu-1", "value": "10.0.0.1", "version": written["version"]}

    raw = bytes(range(256))
    assert kv(nats_server.url, "put", bucket_name, "blob", stdin=raw).returncode == 0
    assert kv(nats_server.url, "get", bucket_name, "blob").stdout == raw
    blob = json.loads(kv(nats_server.url, "get", bucket_name, "blob", "--json").stdout)
    assert blob["encoding"] == "base64"


def test_missing_key_bucket_and_bad_key_are_one_line_errors(
    nats_server: EmbeddedNats, bucket_name: str
) -> None:
    assert kv(nats_server.url, "put", bucket_name, "a", "1").returncode == 0
    missing_key = kv(nats_server.url, "get", bucket_name, "nope")
    assert missing_key.returncode == EXIT_NOT_FOUND
    assert b"no key nope" in missing_key.stderr and b"Traceback" not in missing_key.stderr

    missing_bucket = kv(nats_server.url, "get", f"{bucket_name}-absent", "a")
    assert missing_bucket.returncode == EXIT_NOT_FOUND, missing_bucket.stderr
    assert b"does not exist" in missing_bucket.stderr
    watch_missing = kv(nats_server.url, "watch", f"{bucket_name}-absent", "-n", "1")
    assert watch_missing.returncode == EXIT_NOT_FOUND  # and it was not created:
    assert kv(nats_server.url, "get", f"{bucket_name}-absent", "a").returncode == EXIT_NOT_FOUND

    bad = kv(nats_server.url, "put", bucket_name, "a b*", "1")
    assert bad.returncode == EXIT_USAGE and b"not a NATS KV key" in bad.stderr


def test_an_unreachable_nats_is_a_bounded_one_line_failure() -> None:
    done = kv("nats://127.0.0.1:1", "get", "b", "k", "--timeout", "2")
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert done.stderr.count(b"\n") == 1 and b"Traceback" not in done.stderr


def test_watch_prints_the_state_then_each_change(
    nats_server: EmbeddedNats, bucket_name: str
) -> None:
    assert kv(nats_server.url, "put", bucket_name, "orders.1", "first").returncode == 0
    assert kv(nats_server.url, "put", bucket_name, "other.1", "skip").returncode == 0
    env = {**os.environ, "NATS_URL": nats_server.url}
    watcher = subprocess.Popen(
        [WAYMARK, "kv", "watch", bucket_name, "--prefix", "orders", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    assert watcher.stdout is not None
    try:

        def line() -> dict[str, object]:
            assert readable(watcher.stdout, 60), "the watch printed nothing"  # type: ignore[arg-type]
            return json.loads(watcher.stdout.readline())  # type: ignore[union-attr]

        assert line() | {"version": 0} == {
            "op": "PUT", "key": "orders.1", "value": "first", "version": 0
        }  # fmt: skip
        assert kv(nats_server.url, "put", bucket_name, "orders.2", "second").returncode == 0
        assert line()["key"] == "orders.2"  # live, and other.1 never shown
    finally:
        watcher.send_signal(signal.SIGINT)
        code = watcher.wait(30)
    assert code == 130 and "Traceback" not in watcher.stderr.read()  # type: ignore[union-attr]


def test_watch_n_exits_after_n_updates_in_plain_lines(
    nats_server: EmbeddedNats, bucket_name: str
) -> None:
    assert kv(nats_server.url, "put", bucket_name, "k.1", "v1").returncode == 0
    assert kv(nats_server.url, "put", bucket_name, "k.2", "v2").returncode == 0
    done = kv(nats_server.url, "watch", bucket_name, "-n", "2")
    assert done.returncode == 0, done.stderr
    rows = [row.split(b"\t") for row in done.stdout.splitlines()]
    assert [(r[0], r[1], r[3]) for r in rows] == [(b"PUT", b"k.1", b"v1"), (b"PUT", b"k.2", b"v2")]
