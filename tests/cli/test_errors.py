"""Expected failures of the shipped ``waymark`` command are one line on stderr with the
server's error code, a hint and the exit code docs/cli.md documents, never a traceback
(issue #26, "Errors a person can read"); the address and token come from
``--url``/``--token`` or ``WAYMARK_URL``/``WAYMARK_TOKEN``. Real ``waymark serve``
processes, the CLI run as a user runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import ServerProcess

from waymark.cli.errors import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    Failure,
    explain,
    guarded,
)
from waymark.client import ApiError, Client, ConnectError, TransportTimeout
from waymark.protocol import RecordIn

WAYMARK = str(Path(sys.executable).parent / "waymark")


def waymark(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # The caller's WAYMARK_* must not leak in: each test says what it sets.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WAYMARK_")}
    return subprocess.run([WAYMARK, *args], capture_output=True, text=True, timeout=120,
                          env={**clean, "COLUMNS": "200", **env})  # fmt: skip


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single ``waymark:`` line of stderr; no traceback anywhere."""
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("waymark: ")]
    assert len(lines) == 1, done.stderr
    return lines[0]


@dataclass
class Secured:
    server: ServerProcess
    secret: str


@pytest.fixture(scope="module")
def secured(
    spawn_module_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Secured:
    root = tmp_path_factory.mktemp("secured")
    tokens = root / "tokens.toml"
    made = waymark("token", "new", "ops", "--scope", "admin", "--tokens", str(tokens))
    assert made.returncode == 0, made.stderr
    server = spawn_module_server(root / "data", "--tokens", str(tokens))
    return Secured(server, made.stdout.strip().splitlines()[-1])


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port nothing listens on: bound, then closed (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


def test_a_401_is_one_line_with_the_code_the_server_and_a_hint(secured: Secured) -> None:
    done = waymark("recovery", "clients", "--url", secured.server.url)
    assert done.returncode == EXIT_REFUSED, done.stderr
    line = one_error_line(done)
    assert line.startswith(f"waymark: refused by {secured.server.url}: unauthorized")
    assert "pass --token or set WAYMARK_TOKEN" in line


def test_the_address_and_token_come_from_waymark_url_and_waymark_token(secured: Secured) -> None:
    done = waymark("recovery", "clients", "--json",
                   WAYMARK_URL=secured.server.url, WAYMARK_TOKEN=secured.secret)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('{"clients":')
    # the positional spelling of `fold reports` still works, and --url beside it
    for where in ((secured.server.url,), ("--url", secured.server.url)):
        shown = waymark("fold", "reports", *where, "--json", WAYMARK_TOKEN=secured.secret)
        assert shown.returncode == 0 and shown.stdout.startswith('{"folds":'), shown.stderr


def test_something_not_there_exits_4_with_the_servers_code(secured: Secured) -> None:
    done = waymark("fold", "reports", "--fold", "no-such-fold",
                   WAYMARK_URL=secured.server.url, WAYMARK_TOKEN=secured.secret)  # fmt: skip
    assert done.returncode == EXIT_NOT_FOUND, done.stderr
    assert "not_found" in one_error_line(done)


def test_a_refused_connection_exits_6_naming_the_address(closed_port: int) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    done = waymark("recovery", "clients", "--url", url)
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    line = one_error_line(done)
    assert line.startswith(f"waymark: cannot reach {url}") and "WAYMARK_URL" in line


def test_a_busy_port_exits_5_serve_naming_it(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = waymark("serve", "--port", str(port), "--data-dir", str(tmp_path / "data"))
        metrics = waymark("ship", "--url", "http://127.0.0.1:9", "--topic", "t", "--to",
                          "http://127.0.0.1:9", "--metrics-port", str(port),
                          "--state", str(tmp_path / "ship"))  # fmt: skip
    assert done.returncode == EXIT_REFUSED, done.stderr
    line = one_error_line(done)
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in line
    # any other listening socket (here ship's /metrics) through the generic rule
    assert metrics.returncode == EXIT_REFUSED, metrics.stderr
    assert "Address already in use" in one_error_line(metrics)


def test_ship_once_against_a_dead_server_gives_up_after_its_retry_budget(
    closed_port: int, tmp_path: Path
) -> None:
    done = waymark("ship", "--url", f"http://127.0.0.1:{closed_port}", "--topic", "t",
                   "--to", "http://127.0.0.1:9/", "--once", "--state", str(tmp_path),
                   "--retry-base-ms", "10", "--retry-budget-s", "0.3")  # fmt: skip
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert "retry budget 0.3 s spent" in one_error_line(done)


def test_ship_once_to_a_dead_collector_gives_up_keeping_its_checkpoint(
    secured: Secured, closed_port: int, tmp_path: Path
) -> None:
    with Client(secured.server.url, token=secured.secret) as client:
        client.append("ship-dead-collector", [RecordIn.of(i) for i in range(3)], create=True)
    done = waymark("ship", "--topic", "ship-dead-collector",
                   "--to", f"http://127.0.0.1:{closed_port}/", "--once", "--state",
                   str(tmp_path), "--retry-base-ms", "10", "--retry-budget-s", "0.3",
                   WAYMARK_URL=secured.server.url, WAYMARK_TOKEN=secured.secret)  # fmt: skip
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert "retry budget 0.3 s spent" in one_error_line(done)
    # nothing was acked: the committed checkpoint did not move past the batch
    assert '"ship-dead-collector"' not in (tmp_path / "checkpoints.json").read_text("utf-8")


@pytest.mark.parametrize(
    ("error", "code", "start"),
    [
        (ApiError(401, "unauthorized", "no token", {}), EXIT_REFUSED, "refused"),
        (ApiError(403, "forbidden", "no scope", {}), EXIT_REFUSED, "refused"),
        (ApiError(400, "invalid_request", "bad", {}), EXIT_REFUSED, "refused"),
        (ApiError(409, "fenced", "old", {}), EXIT_REFUSED, "refused"),
        (ApiError(429, "too_many_topics", "full", {}), EXIT_REFUSED, "refused"),
        (ApiError(404, "topic_not_found", "no t", {}), EXIT_NOT_FOUND, "not found"),
        (ApiError(429, "too_many_streams", "busy", {}), EXIT_UNAVAILABLE, "unavailable"),
        (ApiError(503, "storage_unavailable", "disk", {}), EXIT_UNAVAILABLE, "unavailable"),
        (ConnectError("refused"), EXIT_UNAVAILABLE, "cannot reach"),
        (TransportTimeout("slow"), EXIT_UNAVAILABLE, "no answer"),
        (Failure("said so", 4), 4, "said so"),
    ],
)
def test_each_expected_failure_has_its_exit_code(error: Exception, code: int, start: str) -> None:
    found = explain(error)
    assert found is not None and found[0] == code and found[1].startswith(start), found


def test_a_bug_keeps_its_traceback() -> None:
    assert explain(RuntimeError("a bug")) is None
    assert explain(OSError(5, "I/O error")) is None
    assert explain(BrokenPipeError(32, "Broken pipe")) is None  # stdout's reader left
    with pytest.raises(RuntimeError), guarded():
        raise RuntimeError("a bug")
    # an unexpected error raised from an expected one is explained by its cause
    try:
        raise RuntimeError("wrapped") from ConnectError("refused")
    except RuntimeError as wrapped:
        assert explain(wrapped) == explain(ConnectError("refused"))


def test_recovery_missed_passes_its_token_to_a_server_with_tokens(secured: Secured) -> None:
    args = ("recovery", "missed", "--store", "topic:no-such-receipts", "--client", "c")
    refused = waymark(*args, WAYMARK_URL=secured.server.url)
    assert refused.returncode == EXIT_REFUSED and "unauthorized" in one_error_line(refused)
    # with the token the server answers: the store is not there (a usage error, 2)
    answered = waymark(*args, WAYMARK_URL=secured.server.url, WAYMARK_TOKEN=secured.secret)
    assert answered.returncode == 2 and "no-such-receipts" in answered.stderr, answered.stderr


def test_a_demo_whose_kill_could_never_land_is_refused_before_it_starts(tmp_path: Path) -> None:
    """200,000 events in batches of up to 250,000 (the default) is one batch: the driver
    kill at 40% could never land mid-run. Refused at once, naming a setting that works,
    instead of a 20 s run that fails with a pointer to a log already removed."""
    result = waymark("demo", "--events", "200000", "--work-dir", str(tmp_path / "w"))
    assert result.returncode == 2, result.stderr
    assert "could not land mid-run" in result.stderr
    assert "--max-per-trigger 40,000" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "w").exists()  # nothing started
