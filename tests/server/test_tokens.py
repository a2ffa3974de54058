"""Beyond scopes (docs/security.md): token expiry, per-token rate limits and the audit
log. Exact times run in-process on a manual clock (:mod:`waymark.clock`) over a real
socket; the rest against a real ``waymark serve`` with tokens made by the real
``waymark token new``."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.client.test_contract import serving

from waymark.client import ApiError, Client, ErrorCode
from waymark.clock import ManualClock
from waymark.protocol import RecordIn
from waymark.server import App, ServerConfig
from waymark.server.auth import new_token
from waymark.server.config import AuthConfig

WAYMARK = str(Path(sys.executable).parent / "waymark")


def token_new(path: Path, name: str, *args: str) -> str:
    """``waymark token new`` as a user runs it: the secret is the last stdout line."""
    command = [WAYMARK, "token", "new", name, "--tokens", str(path), *args]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def test_a_token_expires_at_its_time_and_its_open_stream_ends(tmp_path: Path) -> None:
    clock = ManualClock()
    tokens = tmp_path / "tokens.toml"
    secret = new_token(tokens, "brief", ["read:*", "write:*"], expires_in_s=3600, clock=clock)
    writer = new_token(tokens, "writer", ["write:*"])  # never expires
    with (
        serving(App(ServerConfig(auth=AuthConfig(tokens=tokens)), clock=clock)) as url,
        Client(url, token=secret) as client,
        Client(url, token=writer) as other,
    ):
        client.append("t", [RecordIn.of(0)])
        with httpx.stream(
            "GET",
            f"{url}/v0/topics/t/watch",
            params={"from_seq": 0},
            headers={"authorization": f"Bearer {secret}"},
            timeout=10,
        ) as watch:
            lines = watch.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            clock.advance(3600 * 1000 - 1)  # the last millisecond it is valid
            client.append("t", [RecordIn.of(1)])  # wakes the stream: still admitted
            assert '"data":1' in next(line for line in lines if line.startswith("data:"))
            clock.advance(1)
            with pytest.raises(ApiError) as expired:
                client.append("t", [RecordIn.of(2)])
            other.append("t", [RecordIn.of(3)])  # wakes the stream: it checks and ends
            events = list(lines)  # until the server closes it
        assert expired.value.code is ErrorCode.TOKEN_EXPIRED and expired.value.status == 401
        assert expired.value.detail == {"token": "brief", "expires_ms": clock.now_ms()}
        assert "event: error" in events and not any('"data":3' in e for e in events), events
        assert any('"code":"token_expired"' in e for e in events)


def test_an_expiring_token_made_by_the_cli_is_refused_once_expired(
    start_waymark, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    lasting = token_new(tokens, "lasting", "--scope", "read:*", "--expires-in", "1h")
    brief = token_new(tokens, "brief", "--scope", "read:*", "--expires-in", "1s")
    entries = tomllib.loads(tokens.read_text())["tokens"]
    in_an_hour = entries["lasting"]["expires"] - datetime.now(UTC)
    assert timedelta(minutes=59) < in_an_hour <= timedelta(hours=1)
    assert lasting not in tokens.read_text() and brief not in tokens.read_text()
    # Past the brief one's expiry by the wall clock the server reads (no sleep-and-hope:
    # a condition on the clock).
    while datetime.now(UTC) <= entries["brief"]["expires"]:
        time.sleep(0.05)
    server = start_waymark("--tokens", str(tokens))
    with httpx.Client(base_url=server.url) as http:
        ok = http.get("/v0/auth/whoami", headers={"authorization": f"Bearer {lasting}"})
        assert ok.status_code == 200 and ok.json()["name"] == "lasting"
        answer = http.get("/v0/auth/whoami", headers={"authorization": f"Bearer {brief}"})
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "token_expired"
        assert answer.headers["www-authenticate"].startswith("Bearer")


def test_a_rate_limited_token_gets_429_with_retry_after(tmp_path: Path) -> None:
    clock = ManualClock()
    tokens = tmp_path / "tokens.toml"
    secret = new_token(tokens, "slow", ["read:*"], rate_per_s=2)
    free = new_token(tokens, "free", ["read:*"])
    with serving(App(ServerConfig(auth=AuthConfig(tokens=tokens)), clock=clock)) as url:
        headers = {"authorization": f"Bearer {secret}"}
        with httpx.Client(base_url=url, headers=headers, timeout=10) as http:
            assert [http.get("/v0/auth/whoami").status_code for _ in range(2)] == [200, 200]
            refused = http.get("/v0/auth/whoami")
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "rate_limited"
            assert error["detail"] == {"token": "slow", "rate_per_s": 2.0, "retry_after_s": 1}
            assert http.get("/v0/health").status_code == 200  # an open route: no token
            clock.advance(500)  # half a second: one request's worth
            assert http.get("/v0/auth/whoami").status_code == 200
            assert http.get("/v0/auth/whoami").status_code == 429
        with Client(url, token=free) as other:  # another token is not held up
            assert [other.whoami().name for _ in range(5)] == ["free"] * 5


def _audit(path: Path) -> list[dict]:
    lines = []
    for file in sorted(path.parent.glob(path.name + "*")):
        lines += [json.loads(line) for line in file.read_text().splitlines()]
    return lines


def test_the_audit_log_has_every_refusal_and_admin_action_and_rotates(
    start_waymark, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    admin = token_new(tokens, "root", "--scope", "admin")
    reader = token_new(tokens, "reader", "--scope", "read:*", "--rate", "1000")
    audit = tmp_path / "audit.jsonl"
    server = start_waymark("--tokens", str(tokens), "--audit-log", str(audit),
                           "--audit-log-max-bytes", "4000")  # fmt: skip
    url = server.url
    assert httpx.get(f"{url}/v0/topics").status_code == 401  # no token
    bearer = {"authorization": f"Bearer {reader}"}
    assert httpx.post(f"{url}/v0/topics/a/records", headers=bearer,
                      json={"records": [{"data": 1}]}).status_code == 403  # fmt: skip
    assert httpx.post(f"{url}/v0/topics/a/diff", headers=bearer,
                      content=b"{}").status_code == 415  # fmt: skip
    with Client(url, token=admin) as client:
        client.put_topic("audited")
        client.delete_topic("audited")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:  # headers past 64 KiB
        sock.sendall(b"GET /v0/health HTTP/1.1\r\nX-Big: " + b"x" * (128 << 10))
        sock.settimeout(10)
        assert sock.recv(4096).startswith(b"HTTP/1.1 431")
    server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while not any(e["event"] == "tokens_reloaded" for e in _audit(audit)):
        assert time.monotonic() < deadline
    events = _audit(audit)
    refused = [(e["code"], e["status"], e.get("token")) for e in events if e["event"] == "refused"]
    assert refused == [("unauthorized", 401, None), ("forbidden", 403, "reader"),
                       ("unsupported_media_type", 415, "reader"),
                       ("headers_too_large", 431, None)]  # fmt: skip
    assert all(e["client"] == "127.0.0.1" for e in events if e["event"] == "refused")
    admin_actions = [(e["operation"], e["status"], e["token"]) for e in events
                     if e["event"] == "admin"]  # fmt: skip
    assert admin_actions == [("putTopic", 201, "root"), ("deleteTopic", 200, "root")]
    reloaded = next(e for e in events if e["event"] == "tokens_reloaded")
    assert reloaded["tokens"] == ["reader", "root"]
    assert stat.S_IMODE(os.stat(audit).st_mode) == 0o600
    # A flood of refusals fills a bounded amount of disk: rotated past 4000 bytes.
    with httpx.Client(base_url=url) as http:
        for _ in range(100):
            http.get("/v0/topics")
    files = sorted(audit.parent.glob(audit.name + "*"))
    assert [f.name for f in files][:2] == ["audit.jsonl", "audit.jsonl.1"]
    assert len(files) <= 6 and all(f.stat().st_size <= 4000 for f in files)
    text = "".join(f.read_text() for f in files)
    assert admin not in text and reader not in text  # no secret is ever written


def test_an_open_stream_verifies_its_token_once_until_a_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream checked its token before every read, a salted SHA-256 each time: with
    2,000 streams woken by every commit, the hashing alone held the event loop. The
    decision made at the open holds until the tokens file is reloaded (a revoked or
    narrowed token still ends its streams: tests/server/test_auth.py); expiry, a clock
    comparison, is still checked before every read (the test above)."""
    from waymark.server import auth

    hashed: dict[str, int] = {}
    matches = auth.Token.matches

    def counted(self: auth.Token, secret: bytes) -> bool:  # a spy: counts, changes nothing
        hashed[self.name] = hashed.get(self.name, 0) + 1
        return matches(self, secret)

    monkeypatch.setattr(auth.Token, "matches", counted)
    tokens = tmp_path / "tokens.toml"
    reader = new_token(tokens, "reader", ["read:*"])
    writer = new_token(tokens, "writer", ["write:*"])
    with (
        serving(App(ServerConfig(auth=AuthConfig(tokens=tokens)))) as url,
        Client(url, token=writer) as client,
    ):
        client.append("t", [RecordIn.of(0)])
        bearer = {"authorization": f"Bearer {reader}"}
        with httpx.stream(
            "GET", f"{url}/v0/topics/t/watch", params={"from_seq": 0}, headers=bearer, timeout=10
        ) as watch:
            lines = (line for line in watch.iter_lines() if line.startswith("data:"))
            assert next(lines)
            for n in range(1, 21):  # each append wakes the stream for one read
                client.append("t", [RecordIn.of(n)])
                assert next(lines).endswith(f'"data":{n}}}')
        assert hashed["reader"] == 1, hashed  # the open, and no read after it


# A token name: any text but control characters and lone surrogates (refused, see
# test_auth.py), with TOML's own syntax characters drawn often.
NAMES = st.text(
    st.one_of(
        st.sampled_from("\"\\'[]=.# 😀é\u2028\ufeff"),
        st.characters(exclude_categories=("Cc", "Cs")),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(names=st.lists(NAMES, min_size=1, max_size=3, unique=True))
def test_any_token_name_round_trips_through_the_tokens_file(
    tmp_path_factory: pytest.TempPathFactory, names: list[str]
) -> None:
    """``token new`` wrote the file by hand (an emoji became surrogate escapes TOML
    refuses); written by a TOML writer, every name reads back as written, and each
    secret verifies as its own token."""
    from waymark.server.auth import Tokens

    path = tmp_path_factory.mktemp("names") / "tokens.toml"
    secrets = {name: new_token(path, name, ["read:*"], rate_per_s=2.5) for name in names}
    loaded = Tokens.load(path)
    assert [t.name for t in loaded.by_id.values()] == names
    for name, secret in secrets.items():
        token = loaded.verify(f"Bearer {secret}".encode())
        assert token is not None and token.name == name and token.rate_per_s == 2.5


def test_a_file_that_would_not_read_back_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-read guard: a writer fault injector that drops the last table (a TOML
    writer bug) makes ``token new`` refuse, and the file keeps what it had."""
    import tomli_w

    from waymark.server.auth import TokenFileError

    path = tmp_path / "tokens.toml"
    new_token(path, "first", ["read:*"])
    before = path.read_bytes()
    real = tomli_w.dumps
    monkeypatch.setattr(
        tomli_w, "dumps", lambda data: real({"tokens": dict(list(data["tokens"].items())[:-1])})
    )
    with pytest.raises(TokenFileError, match="would not read back"):
        new_token(path, 'sec"ond\\', ["read:*"])
    assert path.read_bytes() == before
