"""Bearer tokens with scopes against a real ``waymark serve --tokens`` process
(docs/security.md): every endpoint of the table x {no token, wrong token, a token
lacking its scope, the right token}, tokens made by the real ``waymark token new``."""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from waymark.client import ApiError, Client, ErrorCode
from waymark.protocol import ENDPOINTS, Endpoint, ScopeKind
from waymark.protocol.openapi import document
from waymark.protocol.scopes import ALL_SCOPES

WAYMARK = str(Path(sys.executable).parent / "waymark")
KINDS = ("read", "write", "delete", "queue", "admin")


def token_new(path: Path, name: str, *scopes: str) -> str:
    """``waymark token new`` as a user runs it: the secret is the last stdout line."""
    args = [WAYMARK, "token", "new", name, "--tokens", str(path)]
    for scope in scopes:
        args += ["--scope", scope]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def grants(kind: str) -> tuple[str, ...]:
    return ("admin",) if kind == "admin" else (f"{kind}:*",)


@dataclass
class Secured:
    url: str
    tokens: Path
    all: str  # every scope
    lacking: dict[str, str]  # kind -> a token with every scope but that kind
    process: subprocess.Popen[str]

    def as_token(self, secret: str | None) -> httpx.Client:
        headers = {} if secret is None else {"authorization": f"Bearer {secret}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, spawn_module_server) -> Secured:
    root = tmp_path_factory.mktemp("secured")
    tokens = root / "tokens.toml"
    everything = token_new(tokens, "all", *ALL_SCOPES)
    # Never admin among the others: admin holds every scope (docs/security.md, Scopes).
    lacking = {
        kind: token_new(tokens, f"no-{kind}",
                        *itertools.chain(*(grants(k) for k in KINDS if k not in (kind, "admin"))))
        for kind in KINDS
    }  # fmt: skip
    server = spawn_module_server(root / "data", "--tokens", str(tokens))
    return Secured(server.url, tokens, everything, lacking, server.process)


_ids = itertools.count()


def _setup(admin: httpx.Client) -> None:
    """Topics, a queue with jobs and a writer the right-token calls act on."""
    for response in (
        admin.post("/v0/topics/t/records", json={"records": [{"data": i} for i in range(3)]}),
        admin.put("/v0/topics/q", json={"type": "queue"}),
        admin.post("/v0/topics/q/records", json={"records": [{"data": 1}]}),
    ):
        assert response.status_code < 300, response.text


def _stage(admin: httpx.Client, writer: str) -> dict[str, int]:
    epoch = admin.post("/v0/writers", json={"writer": writer}).json()["epoch"]
    batch = {"writer": writer, "epoch": epoch, "batch_id": 0}
    staged = admin.post("/v0/topics/t/stage", json={**batch, "partition": 0, "attempt": 0,
                                                     "records": [{"data": 1}]})  # fmt: skip
    assert staged.status_code == 200, staged.text
    return batch


def _status(http: httpx.Client, method: str, path: str, **kw: object) -> int:
    if path.endswith(("/watch", "/work")) or "/work?" in path:  # streams: the status only
        with http.stream(method, path, **kw) as response:  # type: ignore[arg-type]
            return response.status_code
    return http.request(method, path, **kw).status_code  # type: ignore[arg-type]


# Per operation id: (admin set-up) -> (method, path, request kwargs) that succeeds for
# a token holding the scope. A route without a case fails test_every_route_has_a_case.
Case = Callable[[httpx.Client], tuple[str, str, dict[str, object]]]
CASES: dict[str, Case] = {
    "health": lambda a: ("GET", "/v0/health", {}),
    "whoami": lambda a: ("GET", "/v0/auth/whoami", {}),
    "listTopics": lambda a: ("GET", "/v0/topics", {}),
    "putTopic": lambda a: ("PUT", f"/v0/topics/new-{next(_ids)}", {"json": {}}),
    "getTopic": lambda a: ("GET", "/v0/topics/t", {}),
    "getTopicHistory": lambda a: ("GET", "/v0/topics/t/history", {}),
    "deleteTopic": lambda a: (
        "DELETE", f"/v0/topics/{a.put(f'/v0/topics/d-{next(_ids)}').json()['name']}", {}),
    "append": lambda a: ("POST", "/v0/topics/t/records", {"json": {"records": [{"data": 1}]}}),
    "diff": lambda a: ("POST", "/v0/topics/t/diff", {"json": {"from_seq": 0}}),
    "watch": lambda a: ("GET", "/v0/topics/t/watch", {}),
    "deleteRecords": lambda a: ("POST", "/v0/topics/t/delete", {"json": {"before_seq": 1}}),
    "openWriter": lambda a: ("POST", "/v0/writers", {"json": {"writer": f"w{next(_ids)}"}}),
    "listWriters": lambda a: ("GET", "/v0/writers", {}),
    "stage": lambda a: ("POST", "/v0/topics/t/stage", {"json": {
        **_stage(a, f"s{next(_ids)}"), "partition": 1, "attempt": 0, "records": []}}),
    "publish": lambda a: ("POST", "/v0/topics/t/publish", {"json": {
        **_stage(a, f"p{next(_ids)}"), "parts": [{"partition": 0, "attempt": 0, "chunks": 1}]}}),
    "claimJobs": lambda a: ("POST", "/v0/topics/q/claim", {"json": {"node": "n"}}),
    "ackJobs": lambda a: ("POST", "/v0/topics/q/ack", {"json": {"node": "n", "seqs": [99]}}),
    "nackJobs": lambda a: ("POST", "/v0/topics/q/nack", {"json": {"node": "n", "seqs": [99]}}),
    "extendLeases": lambda a: (
        "POST", "/v0/topics/q/extend", {"json": {"node": "n", "seqs": [99]}}),
    "redrive": lambda a: ("POST", "/v0/topics/q/redrive", {"json": {}}),
    "work": lambda a: ("GET", "/v0/topics/q/work?node=w", {}),
    "listRouters": lambda a: ("GET", "/v0/routers", {}),
    "putRouter": lambda a: (
        "PUT", f"/v0/routers/r{next(_ids)}", {"json": {"source": "t", "dest": "t.copy"}}),
    "getRouter": lambda a: (
        "GET", f"/v0/routers/{_router(a)}", {}),
    "deleteRouter": lambda a: ("DELETE", f"/v0/routers/{_router(a)}", {}),
    "listCheckpoints": lambda a: ("GET", "/v0/changes/checkpoints", {}),
    "watchCheckpoints": lambda a: ("GET", "/v0/changes/watch", {}),
    "reportFold": lambda a: ("POST", "/v0/folds", {"json": {
        "fold": "f", "node": "n", "backend": "lmdb", "bucket": "b", "cursor": 1,
        "bucket_seq": 2}}),
    "listFolds": lambda a: ("GET", "/v0/folds", {}),
    "getFold": lambda a: ("GET", f"/v0/folds/{_fold(a)}", {}),
    "reportRecovery": lambda a: ("POST", "/v0/recovery/clients", {"json": {
        "client": "c", "watermark": None, "range_receipts": 0, "pending": 0}}),
    "listRecoveryClients": lambda a: ("GET", "/v0/recovery/clients", {}),
    "forgetFold": lambda a: ("DELETE", f"/v0/folds/{_fold(a)}", {}),
    "forgetRecoveryClient": lambda a: ("DELETE", f"/v0/recovery/clients/{_client(a)}", {}),
    "reportPipeline": lambda a: ("POST", "/v0/pipelines", {"json": _PIPELINE}),
    "listPipelines": lambda a: ("GET", "/v0/pipelines", {}),
    "forgetPipeline": lambda a: ("DELETE", f"/v0/pipelines/{_pipeline(a)}", {}),
    "openapi": lambda a: ("GET", "/v0/openapi.json", {}),
    "metrics": lambda a: ("GET", "/metrics", {}),
}  # fmt: skip


def _fold(admin: httpx.Client) -> str:
    body = {"fold": "g", "node": "n", "backend": "lmdb", "bucket": "b", "cursor": 0,
            "bucket_seq": 0}  # fmt: skip
    response = admin.post("/v0/folds", json=body)
    assert response.status_code == 200, response.text
    return "g"


_PIPELINE = {"pipeline": "p", "run": "r", "stages": {}, "edges": {}, "shards": {},
             "topology": {}}  # fmt: skip


def _pipeline(admin: httpx.Client) -> str:
    response = admin.post("/v0/pipelines", json=_PIPELINE)
    assert response.status_code == 200, response.text
    return "p"


def _client(admin: httpx.Client) -> str:
    body = {"client": "gone", "watermark": None, "range_receipts": 0, "pending": 0}
    response = admin.post("/v0/recovery/clients", json=body)
    assert response.status_code == 200, response.text
    return "gone"


def _router(admin: httpx.Client) -> str:
    name = f"r{next(_ids)}"
    response = admin.put(f"/v0/routers/{name}", json={"source": "t", "dest": f"{name}.out"})
    assert response.status_code < 300, response.text
    return name


def test_every_route_has_a_case_and_a_scope() -> None:
    # A new route needs its scope (Endpoint.scope is required) and a case here.
    assert set(CASES) == {e.operation_id for e in ENDPOINTS}
    assert all(isinstance(e.scope, ScopeKind) for e in ENDPOINTS)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.operation_id)
def test_route_by_token(secured: Secured, endpoint: Endpoint) -> None:
    """no token / wrong token -> 401 unauthorized, lacking scope -> 403 forbidden, the
    right token -> 2xx; open routes answer everyone, ``token`` routes any valid token."""
    with secured.as_token(secured.all) as admin:
        _setup(admin)
        method, path, kw = CASES[endpoint.operation_id](admin)
    assert (endpoint.method, path.split("?")[0].count("/")) == (
        method, endpoint.path.count("/"))  # the case calls this very route  # fmt: skip
    wrong = secured.all[:-4] + ("AAAA" if not secured.all.endswith("AAAA") else "BBBB")
    refused = 200 if endpoint.scope is ScopeKind.OPEN else 401
    checks: list[tuple[str | None, int]] = [
        (None, refused),
        (wrong, refused),
        ("not-a-waymark-token", refused),
    ]
    if endpoint.scope.value in KINDS:
        checks.append((secured.lacking[endpoint.scope.value], 403))
    else:  # open, or any valid token: one without most scopes passes too
        checks.append((secured.lacking["admin"], 200))
    for secret, expected in checks:
        with secured.as_token(secret) as http:
            if expected >= 400:
                response = http.request(method, path, **kw)  # type: ignore[arg-type]
                assert response.status_code == expected, (secret, response.text)
                code = "unauthorized" if expected == 401 else "forbidden"
                assert response.json()["error"]["code"] == code
                if expected == 401:
                    assert response.headers["www-authenticate"].startswith("Bearer")
            else:
                assert _status(http, method, path, **kw) < 300
    with secured.as_token(secured.all) as http:
        assert _status(http, method, path, **kw) < 300


def test_a_glob_limits_a_scope_to_its_topics(secured: Secured, tmp_path: Path) -> None:
    # A new token on the running server, picked up by SIGHUP.
    secret = token_new(secured.tokens, f"logs-{next(_ids)}", "write:logs.*", "read:logs.*")
    secured.process.send_signal(signal.SIGHUP)
    with Client(secured.url, token=secret) as client:
        for _ in range(100):  # the signal is handled between two requests
            try:
                client.whoami()
                break
            except ApiError:
                pass
        me = client.whoami()
        assert me.auth and me.scopes == ["write:logs.*", "read:logs.*"]
        assert client.append("logs.web", [{"data": 1}]).seqs  # type: ignore[list-item]
        with pytest.raises(ApiError) as refused:
            client.append("metrics.web", [{"data": 1}])  # type: ignore[list-item]
        assert refused.value.code is ErrorCode.FORBIDDEN and refused.value.status == 403
        assert refused.value.detail == {"token": me.name, "needs": "write",
                                        "topic": "metrics.web"}  # fmt: skip
        # The list shows only the topics the token may read.
        assert [t.name for t in client.list_topics()] == ["logs.web"]
    with pytest.raises(ApiError) as refused, Client(secured.url, token="wmk_x_y") as client:
        client.get_topic("logs.web")
    assert refused.value.code is ErrorCode.UNAUTHORIZED


def test_the_token_comes_from_the_environment(
    secured: Secured, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WAYMARK_TOKEN", secured.all)
    with Client(secured.url) as client:
        assert client.whoami().name == "all"
    monkeypatch.delenv("WAYMARK_TOKEN")
    with Client(secured.url) as client, pytest.raises(ApiError) as refused:
        client.whoami()
    assert refused.value.code is ErrorCode.UNAUTHORIZED


def test_the_tokens_file_holds_no_secret_and_no_log_shows_one(secured: Secured) -> None:
    text = secured.tokens.read_text()
    assert secured.all not in text and secured.all.split("_", 2)[2] not in text
    assert secured.tokens.stat().st_mode & 0o077 == 0  # only its owner reads it


def test_whoami_without_tokens_is_everything(waymark_server) -> None:
    with Client(waymark_server.url) as client:
        me = client.whoami()
    assert (me.name, me.scopes, me.auth) == (None, list(ALL_SCOPES), False)


def test_a_non_loopback_bind_needs_tokens(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "::", "example.org"):
        result = subprocess.run([WAYMARK, "serve", "--host", host, "--port", "0",
                                 "--data-dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert result.returncode == 2, result
        assert "--tokens" in result.stderr and "--insecure-no-auth" in result.stderr
    assert not any(tmp_path.iterdir()), "refused before anything was opened"


def test_token_new_refuses_a_bad_scope_and_a_taken_name(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    token_new(path, "a", "read:*")
    for name, scope in (("b", "read"), ("b", "reed:*"), ("b", "write:"), ("a", "read:*")):
        args = [WAYMARK, "token", "new", name, "--scope", scope, "--tokens", str(path)]
        result = subprocess.run(args, capture_output=True, text=True)
        assert result.returncode == 2 and "waymark:" in result.stderr, (name, scope)
        assert result.stdout == ""


@pytest.fixture
def metrics_of(secured: Secured) -> Iterator[Callable[[str], float]]:
    def value(line_prefix: str) -> float:
        with secured.as_token(secured.all) as http:
            for line in http.get("/metrics").text.splitlines():
                if line.startswith(line_prefix):
                    return float(line.split()[-1])
        return 0.0

    yield value


def test_refusals_are_counted(secured: Secured, metrics_of) -> None:
    before = metrics_of('waymark_refusals_total{code="unauthorized"}')
    with secured.as_token(None) as http:
        assert http.get("/v0/topics").status_code == 401
        assert http.get("/metrics").status_code == 401  # admin unless --open-metrics
    assert metrics_of('waymark_refusals_total{code="unauthorized"}') == before + 2


def test_the_scopes_table_of_the_docs_is_the_endpoint_table() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| `(\w+) (\S+)` \| (\w+) \|$", text, re.MULTILINE)
    assert rows == [(e.operation_id, e.method, e.path, e.scope.value) for e in ENDPOINTS]


# Streams never end by themselves; test_sse and the table above cover them.
authenticated = schemathesis.openapi.from_dict(document()).exclude(path_regex=r".*/(watch|work)$")


@authenticated.parametrize()
# No database: under CI hypothesis derandomizes, and schemathesis, rebuilding these
# settings, refuses the suite's database beside that (tests/conftest.py).
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_schemathesis_with_a_token_finds_no_server_error(
    case: schemathesis.Case, secured: Secured
) -> None:
    body: Any = case.body
    if isinstance(body, dict) and type(body.get("wait_ms")) is int and body["wait_ms"] > 20:
        body["wait_ms"] = 20  # a long-poll would wait up to a minute
    case.call_and_validate(
        base_url=secured.url, timeout=15,
        headers={"authorization": f"Bearer {secured.all}"},
        checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                response_schema_conformance],
    )  # fmt: skip


def test_open_metrics_serves_metrics_without_a_token(start_waymark, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    token_new(tokens, "someone", "read:*")
    server = start_waymark("--tokens", str(tokens), "--open-metrics")
    assert httpx.get(f"{server.url}/metrics").status_code == 200
    assert httpx.get(f"{server.url}/v0/topics").status_code == 401
    # What the server asks for, its OpenAPI document says.
    ops = httpx.get(f"{server.url}/v0/openapi.json").json()["paths"]
    assert ops["/v0/topics"]["get"]["security"] == [{"bearer": []}]
    assert ops["/v0/health"]["get"]["security"] == []
    assert ops["/metrics"]["get"]["security"] == []


def test_a_revoked_token_loses_its_open_streams(secured: Secured) -> None:
    """A watch and a queue's /work stream opened with a token end with an in-band 401
    once the token is revoked (``waymark token revoke`` + SIGHUP); before, both went on
    for good, and /work kept leasing jobs to the revoked token."""
    name = f"revoked-{next(_ids)}"
    secret = token_new(secured.tokens, name, "read:rv.*", "queue:rv.*", "write:rv.*")
    secured.process.send_signal(signal.SIGHUP)
    with secured.as_token(secured.all) as admin:
        assert admin.put("/v0/topics/rv.q", json={"type": "queue"}).status_code in (200, 201)
        assert admin.post("/v0/topics/rv.log/records", json={"records": [{"data": 0}]})
    with secured.as_token(secret) as http:
        deadline = time.monotonic() + 10
        while http.get("/v0/auth/whoami").status_code != 200:  # the SIGHUP is handled
            assert time.monotonic() < deadline
        with (
            http.stream("GET", "/v0/topics/rv.log/watch", params={"from_seq": 0}) as watch,
            http.stream("GET", "/v0/topics/rv.q/work", params={"node": "w", "max": 1}) as work,
        ):
            assert watch.status_code == 200 and work.status_code == 200
            lines, work_lines = watch.iter_lines(), work.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # record 0
            subprocess.run([WAYMARK, "token", "revoke", name, "--tokens", str(secured.tokens)],
                           check=True, capture_output=True)  # fmt: skip
            revoked_at = time.monotonic()
            secured.process.send_signal(signal.SIGHUP)
            for stream_lines in (lines, work_lines):
                events = []
                for line in stream_lines:  # ends when the server closes the stream
                    events.append(line)
                assert "event: error" in events, events
                error = next(e for e in events if e.startswith("data:") and "unauthorized" in e)
                assert '"code":"unauthorized"' in error
            assert time.monotonic() - revoked_at < 5
        assert http.get("/v0/auth/whoami").status_code == 401
        with secured.as_token(secured.all) as admin:  # /work leased nothing after it
            assert admin.post("/v0/topics/rv.q/records", json={"records": [{"data": 1}]})
            assert admin.get("/v0/topics/rv.q").json()["queue"]["in_flight"] == 0


def test_a_narrowed_token_loses_its_open_stream_within_a_second(secured: Secured) -> None:
    """A stream keeps the auth decision made when it opened until the tokens file is
    reloaded: a reload that takes the topic's read scope away from its token (the same
    secret) ends the stream with an in-band 403 within a second, while the token's
    other streams, still covered, go on."""
    name = f"narrowed-{next(_ids)}"
    secret = token_new(secured.tokens, name, "read:nw.a", "read:nw.b")
    secured.process.send_signal(signal.SIGHUP)
    with secured.as_token(secured.all) as admin:
        for topic in ("nw.a", "nw.b"):
            assert admin.post(f"/v0/topics/{topic}/records", json={"records": [{"data": 0}]})
    with secured.as_token(secret) as http:
        deadline = time.monotonic() + 10
        while http.get("/v0/auth/whoami").status_code != 200:  # the SIGHUP is handled
            assert time.monotonic() < deadline
        with (
            http.stream("GET", "/v0/topics/nw.a/watch", params={"from_seq": 0}) as narrowed,
            http.stream("GET", "/v0/topics/nw.b/watch", params={"from_seq": 0}) as kept,
        ):
            lines, kept_lines = narrowed.iter_lines(), kept.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            assert next(line for line in kept_lines if line.startswith("data:"))
            text = secured.tokens.read_text()
            # The token's table, as the TOML writer lays it out (quoted key or not, the
            # scopes inline or one per line).
            entry = re.search(rf'\[tokens\."?{name}"?\][^\[]*?scopes = \[[^\]]*\]', text)
            assert entry is not None, text
            narrower = re.sub(r'"read:nw\.a",\s*', "", entry.group(0))
            secured.tokens.write_text(text.replace(entry.group(0), narrower))
            narrowed_at = time.monotonic()
            secured.process.send_signal(signal.SIGHUP)
            events = list(lines)  # ends when the server closes the stream
            assert time.monotonic() - narrowed_at < 1.0, events
            error = next(e for e in events if e.startswith("data:") and "forbidden" in e)
            assert '"topic":"nw.a"' in error and "event: error" in events
            with secured.as_token(secured.all) as admin:  # the covered stream goes on
                assert admin.post("/v0/topics/nw.b/records", json={"records": [{"data": 1}]})
            assert '"data":1' in next(line for line in kept_lines if line.startswith("data:"))


def test_token_names_in_any_script_read_back_and_control_characters_are_refused(
    tmp_path: Path,
) -> None:
    """An emoji was written as a pair of JSON surrogate escapes that TOML refuses: after
    it, ``token new`` and ``serve --tokens`` both exited 2 on the broken file."""
    from waymark.server.auth import Tokens

    tokens = tmp_path / "tokens.toml"
    token_new(tokens, "café 😀", "read:*")
    token_new(tokens, "second", "admin")
    assert sorted(t.name for t in Tokens.load(tokens).by_id.values()) == ["café 😀", "second"]
    refused = subprocess.run([WAYMARK, "token", "new", "bell\a", "--tokens", str(tokens),
                              "--scope", "admin"], capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 2 and "control characters" in refused.stderr
    subprocess.run([WAYMARK, "token", "revoke", "café 😀", "--tokens", str(tokens)], check=True,
                   capture_output=True)  # fmt: skip
    assert [t.name for t in Tokens.load(tokens).by_id.values()] == ["second"]
    assert tokens.stat().st_mode & 0o777 == 0o600
    missing = subprocess.run([WAYMARK, "token", "revoke", "nobody", "--tokens", str(tokens)],
                             capture_output=True, text=True)  # fmt: skip
    assert missing.returncode == 2 and "no token named 'nobody'" in missing.stderr


def until_known(client: Client) -> None:
    """Wait until the server took the client's new token up (its SIGHUP is handled
    between two requests)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            client.whoami()
            return
        except ApiError:
            assert time.monotonic() < deadline


def test_admin_holds_every_scope(secured: Secured) -> None:
    """``admin`` alone was refused listing topics and appending (403), though the
    console and the docs treated it as a super user."""
    secret = token_new(secured.tokens, f"root-{next(_ids)}", "admin")
    secured.process.send_signal(signal.SIGHUP)
    with Client(secured.url, token=secret) as client:
        until_known(client)
        assert client.append("root.anything", [{"data": 1}]).seqs  # type: ignore[list-item]
        assert "root.anything" in [t.name for t in client.list_topics()]
        assert client.diff("root.anything", 0).records[0].data == 1


def test_a_token_fences_only_writers_of_topics_it_may_write(secured: Secured) -> None:
    """Any write token could open (and so fence) another team's exactly-once writer;
    and the writers list showed every team's topics to any read token."""
    n = next(_ids)
    team_a = token_new(secured.tokens, f"team-a-{n}", f"write:a{n}.*", f"read:a{n}.*")
    team_b = token_new(secured.tokens, f"team-b-{n}", f"write:b{n}.*", f"read:b{n}.*")
    secured.process.send_signal(signal.SIGHUP)
    with Client(secured.url, token=team_a) as a, Client(secured.url, token=team_b) as b:
        until_known(b)
        writer = f"sink-a{n}"
        epoch = a.open_writer(writer).epoch
        a.stage(f"a{n}.out", [{"data": 1}], writer=writer, epoch=epoch, batch_id=0,  # type: ignore[list-item]
                partition=0, attempt=0)  # fmt: skip
        with pytest.raises(ApiError) as refused:
            b.open_writer(writer)
        assert refused.value.status == 403
        assert refused.value.detail["topic"] == f"a{n}.out"
        assert a.open_writer(writer).epoch == epoch + 1  # its own team still may
        assert writer not in [w.writer for w in b.list_writers()]  # none of its topics shown
        theirs = [w for w in a.list_writers() if w.writer == writer]
        assert [t.topic for w in theirs for t in w.topics] == [f"a{n}.out"]


def test_change_checkpoints_show_a_token_only_the_topics_it_may_read(secured: Secured) -> None:
    """Any read token listed every topic's changed keys (a read:public token asking for
    ?topic=secret saw secret/customer:42)."""
    n = next(_ids)
    reader = token_new(secured.tokens, f"public-{n}", f"read:pub{n}")
    secured.process.send_signal(signal.SIGHUP)
    with Client(secured.url, token=secured.all) as admin, Client(secured.url, token=reader) as c:
        until_known(c)
        admin.append(f"pub{n}", [{"data": 1, "tag": "visible"}])  # type: ignore[list-item]
        admin.append(f"sec{n}", [{"data": 1, "tag": "customer:42"}])  # type: ignore[list-item]

        def keys(client: Client, topics: list[str] | None) -> set[str]:
            return {change.key for checkpoint in client.checkpoints(topics=topics)
                    for change in checkpoint.changes}  # fmt: skip

        deadline = time.monotonic() + 20
        while not {f"pub{n}/visible", f"sec{n}/customer:42"} <= keys(admin, None):
            assert time.monotonic() < deadline, "no checkpoint named the two writes"
        assert keys(c, None) & {f"pub{n}/visible", f"sec{n}/customer:42"} == {f"pub{n}/visible"}
        assert keys(c, [f"sec{n}"]) == set()
        secret = max(cp.id for cp in admin.checkpoints()
                     if any(ch.key == f"sec{n}/customer:42" for ch in cp.changes))  # fmt: skip
        streamed: set[str] = set()
        for checkpoint in c.watch_checkpoints(after=0, read_timeout=10):  # SSE: the same
            streamed |= {change.key for change in checkpoint.changes}
            if checkpoint.id >= secret:
                break
        assert f"pub{n}/visible" in streamed and f"sec{n}/customer:42" not in streamed
