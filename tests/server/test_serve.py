"""``waymark serve`` as a real process: URL on stdout, data dir, clean exit on signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx


def test_serve_prints_its_url_creates_the_data_dir_and_stops_on_sigint(
    start_waymark, tmp_path: Path
) -> None:
    server = start_waymark()
    assert server.url.startswith("http://127.0.0.1:")
    assert (tmp_path / "data-0").is_dir()
    assert server.stop(signal.SIGINT) == 0
    assert server.process.stdout is not None
    assert "waymark stopped" in server.process.stdout.read()


def test_sigterm_ends_open_streams_and_long_polls_promptly(start_waymark, long_polls) -> None:
    server = start_waymark()
    httpx.post(f"{server.url}/v0/topics/t/records", json={"records": [{"data": 1}]})
    opened, ended = threading.Event(), threading.Event()

    def hold_a_stream() -> None:
        with httpx.stream("GET", f"{server.url}/v0/topics/t/watch", timeout=30) as response:
            opened.set()
            for _ in response.iter_lines():
                pass
        ended.set()

    watcher = threading.Thread(target=hold_a_stream)
    watcher.start()
    long_poll = {"json": {"from_seq": 1, "wait_ms": 60_000}, "timeout": 30}
    poll = threading.Thread(
        target=httpx.post, args=(f"{server.url}/v0/topics/t/diff",), kwargs=long_poll
    )
    poll.start()
    # Both must be in flight before the signal, or the test measures a race, not shutdown.
    assert opened.wait(10), "the SSE stream never opened"
    long_polls(server.url).wait_for(1)
    # Prompt, well inside the 60 s long-poll and the stream's lifetime.
    assert server.stop(signal.SIGTERM, timeout=10) == 0
    watcher.join(5)
    poll.join(5)
    assert ended.is_set() and not poll.is_alive()


def test_serve_help_lists_its_options() -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "waymark"), "serve", "--help"],
        capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    text = " ".join(result.stdout.split())
    for option in ("--host", "--port", "--data-dir", "--heartbeat-s", "--wal-shards",
                   "--tokens", "--insecure-no-auth", "--open-metrics", "--tls-cert", "--tls-key",
                   "--header-timeout-s", "--keep-alive-s", "--max-connections", "--max-streams",
                   "--max-body-bytes", "--max-topics"):  # fmt: skip
        assert option in text
    assert "recovered" in text  # --data-dir is real storage now


def test_the_listening_line_is_true_when_printed(tmp_path: Path) -> None:
    """A caller may connect the moment it reads the address: never a refused connection."""
    for attempt in range(5):
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "waymark"), "serve", "--port", "0",
             "--data-dir", str(tmp_path / str(attempt))],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            url = process.stdout.readline().split("listening on ")[1].strip()
            response = httpx.post(f"{url}/v0/topics/t/records",
                                  json={"records": [{"data": attempt}]}, timeout=10)  # fmt: skip
            assert response.status_code == 200
        finally:
            process.kill()
            process.wait()


WAYMARK = str(Path(sys.executable).parent / "waymark")


def test_a_sighup_while_the_data_dir_recovers_does_not_kill_the_server(tmp_path: Path) -> None:
    """SIGHUP (a tokens reload) sent between the start and the listening line killed
    the process by its default action."""
    process = subprocess.Popen(
        [WAYMARK, "serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None and process.stdout is not None
        assert "waymark recovered" in process.stderr.readline()  # recovered, not serving yet
        process.send_signal(signal.SIGHUP)
        url = process.stdout.readline().split("listening on ")[1].strip()
        assert httpx.get(f"{url}/v0/health", timeout=10).status_code == 200
        process.send_signal(signal.SIGHUP)  # and once serving: a reload, not a death
        assert httpx.get(f"{url}/v0/health", timeout=10).status_code == 200
    finally:
        process.kill()
        process.wait()


def test_a_bad_tls_certificate_fails_before_the_listening_line(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    key.write_text("nor a key\n")
    done = subprocess.run(
        [WAYMARK, "serve", "--port", "0", "--data-dir", str(tmp_path / "data"),
         "--tls-cert", str(cert), "--tls-key", str(key)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "listening" not in done.stdout
    assert "cannot use --tls-cert/--tls-key" in done.stderr
