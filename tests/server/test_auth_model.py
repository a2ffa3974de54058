"""The auth invariants as a hypothesis state machine over the production app
(docs/security.md):

1. a request is admitted iff it carries the secret of a token the server holds now
   (tokens come and go through the file and SIGHUP's reload) whose scopes grant the
   endpoint's kind on the request's topic (kind and glob); otherwise 401 (no or unknown
   token) or 403 (lacking scope);
2. a refused request changes nothing stored.

Each guard broken on purpose (a mutant) makes the machine fail: those tests stay in
the suite.
"""

from __future__ import annotations

import asyncio
import tempfile
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from tests.conftest import only_rules

from waymark.clock import ManualClock
from waymark.server import App, ServerConfig
from waymark.server import app as app_module
from waymark.server.auth import Token, new_token
from waymark.server.config import AuthConfig
from waymark.server.serving import Server, listen

TOPICS = ("a", "ab", "b.1", "b.2")
GLOBS = ("*", "a*", "b.*", "ab", "b.[12]", "?")
KINDS = ("read", "write", "delete", "queue")
# admin is one scope among the 24 kind:glob ones: it holds every scope, so a token with
# it would hide a broken glob or kind check half the time if drawn as often as all the rest.
SCOPES = st.sampled_from(["admin", *(f"{k}:{g}" for k in KINDS for g in GLOBS)])
# (operation, needed kind or None for any token, method, path template, body); "read:any"
# is read on any topic (docs/security.md: reading routers, writers, checkpoints)
CALLS = (
    ("getTopic", "read", "GET", "/v0/topics/{t}", None),
    ("append", "write", "POST", "/v0/topics/{t}/records", b'{"records":[{"data":1}]}'),
    ("deleteRecords", "delete", "POST", "/v0/topics/{t}/delete", b'{"before_seq":1}'),
    ("claimJobs", "queue", "POST", "/v0/topics/{t}/claim", b'{"node":"n"}'),
    ("putTopic", "admin", "PUT", "/v0/topics/{t}", b"{}"),
    ("deleteTopic", "admin", "DELETE", "/v0/topics/{t}", None),
    ("listRouters", "read:any", "GET", "/v0/routers", None),  # not one topic's: any read
    ("whoami", None, "GET", "/v0/auth/whoami", None),
)


def call(app: App, method: str, path: str, secret: str | None, body: bytes | None) -> int:
    """One request through the ASGI app; its status."""
    headers = [(b"authorization", f"Bearer {secret}".encode())] if secret is not None else []
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": headers}  # fmt: skip
    messages = [{"type": "http.request", "body": body or b"", "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"]


def stored(app: App) -> bytes:
    return msgspec.json.encode(app.engine.list_topics())


def grants(scopes: list[str], kind: str | None, topic: str) -> bool:
    if kind is None or "admin" in scopes:  # admin holds every scope (a super user)
        return True
    if kind == "admin":
        return False
    if kind == "read:any":
        return any(s.startswith("read:") for s in scopes)
    return any(s.partition(":")[0] == kind and fnmatchcase(topic, s.partition(":")[2])
               for s in scopes)  # fmt: skip


class Auth(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "tokens.toml"
        self.tokens: dict[str, tuple[str, list[str]]] = {}  # held now: name -> secret, scopes
        self.gone: list[str] = []  # secrets of removed tokens
        self.made = 0
        new_token(self.path, "seed", ["read:zzz"])
        # A still clock: a topic's state then changes only with what a request does.
        self.app = App(ServerConfig(auth=AuthConfig(tokens=self.path)), clock=ManualClock())

    def teardown(self) -> None:
        self.dir.cleanup()

    def _rewrite(self) -> None:
        """The file with only the tokens held now (an operator deleting an entry)."""
        text = self.path.read_text()
        blocks = text.split("\n[tokens.")
        keep = [b for b in blocks[1:] if b.split("]", 1)[0].strip('"') in self.tokens]
        self.path.write_text(blocks[0] + "".join("\n[tokens." + b for b in keep))
        self.app.reload_tokens()

    @rule(scopes=st.lists(SCOPES, min_size=1, max_size=3, unique=True))
    def add_token(self, scopes: list[str]) -> None:
        self.made += 1
        name = f"t{self.made}"
        self.tokens[name] = (new_token(self.path, name, scopes), scopes)
        self.app.reload_tokens()

    @rule(data=st.data())
    def remove_token(self, data: st.DataObject) -> None:
        if not self.tokens:
            return
        name = data.draw(st.sampled_from(sorted(self.tokens)))
        self.gone.append(self.tokens.pop(name)[0])
        self._rewrite()

    @rule(data=st.data(), which=st.sampled_from(CALLS), topic=st.sampled_from(TOPICS))
    def request(self, data: st.DataObject, which: tuple, topic: str) -> None:
        _, kind, method, template, body = which
        choices: list[tuple[str | None, list[str] | None]] = [(None, None), ("wmk_x_y", None)]
        choices += [(secret, None) for secret in self.gone]
        choices += [(secret, scopes) for secret, scopes in self.tokens.values()]
        secret, scopes = data.draw(st.sampled_from(choices))
        if secret is not None and scopes is None and data.draw(st.booleans()) and self.tokens:
            # A held token's secret, one character changed.
            real = next(iter(self.tokens.values()))[0]
            secret = real[:-1] + ("A" if real[-1] != "A" else "B")
        before = stored(self.app)
        status = call(self.app, method, template.format(t=topic), secret, body)
        if scopes is None:
            assert status == 401, (secret, status)
        elif not grants(scopes, kind, topic):
            assert status == 403, (scopes, kind, topic, status)
        else:
            assert status not in (401, 403), (scopes, kind, topic, status)
        if status in (401, 403):
            assert stored(self.app) == before  # a refusal changes nothing stored


SETTINGS = settings(max_examples=60, stateful_step_count=25, deadline=None, database=None,
                    derandomize=True)  # fmt: skip
# A mutant only needs to be found, not shrunk to its smallest case.
MUTANT = settings(SETTINGS, phases=[Phase.generate])


def test_admitted_iff_a_held_token_grants_the_scope() -> None:
    run_state_machine_as_test(Auth, settings=SETTINGS)


@pytest.mark.parametrize("mutant", ["no_scope_check", "any_secret", "glob_ignored",
                                    "no_reload", "kind_ignored"])  # fmt: skip
def test_each_broken_guard_is_caught(
    mutant: str, monkeypatch: pytest.MonkeyPatch, fixed_constants: None
) -> None:
    from waymark.protocol import scopes as scopes_module

    if mutant == "no_scope_check":
        monkeypatch.setattr(app_module, "allows", lambda *a: True)
    elif mutant == "any_secret":
        monkeypatch.setattr(Token, "matches", lambda self, secret: True)
    elif mutant == "glob_ignored":
        monkeypatch.setattr(scopes_module, "glob_matches", lambda name, glob: True)
    elif mutant == "no_reload":
        original = App.reload_tokens
        monkeypatch.setattr(App, "reload_tokens",
                            lambda self: None if self.tokens and len(self.tokens.by_id) > 1
                            else original(self))  # fmt: skip
    elif mutant == "kind_ignored":
        real = scopes_module.allows
        monkeypatch.setattr(
            app_module,
            "allows",
            lambda grants, kind, topic: any(
                real(grants, k, topic) for k in scopes_module.ScopeKind
            ),
        )
    # A broken glob or kind check shows on a held token's request: the hunt draws only
    # those two rules (removals only dilute it; 60 examples of all four missed the glob).
    machine = (only_rules(Auth, "add_token", "request")
               if mutant in ("glob_ignored", "kind_ignored") else Auth)  # fmt: skip
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine, settings=MUTANT)


def test_a_header_timer_mutant_lets_slowloris_hold_on() -> None:
    """The header timeout is what cuts a dripping client: without it (the timer never
    armed) the connection is still open after the timeout."""
    import socket

    from waymark.server.config import HttpConfig
    from waymark.server.limits import GuardedProtocol

    def answer_within(app: App, seconds: float) -> bytes:
        import threading

        sock = listen("127.0.0.1", 0)
        server = Server(app)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            with socket.create_connection(sock.getsockname()) as client:
                client.sendall(b"GET /v0/health HTTP/1.1\r\nHost: localhost\r\n")
                client.settimeout(seconds)
                try:
                    return client.recv(4096)
                except TimeoutError:
                    return b""
        finally:
            app.close()
            server.should_exit = True
            thread.join(10)
            sock.close()

    config = ServerConfig(http=HttpConfig(header_timeout_s=0.2))
    assert answer_within(App(config), 3).startswith(b"HTTP/1.1 408")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GuardedProtocol, "_arm", lambda self: None)
        assert answer_within(App(config), 1) == b""
