"""Schemathesis against a real ``waymark serve`` with tokens, from the OpenAPI document
the server itself serves (docs/security.md, "Hostile clients"): every operation, called
with a token of each scope kind and with none, with cases that fit the schema and cases
that do not. No answer is a 5xx; every refusal is the API's error body whose code has
the status docs/http-api.md gives it; a caller without the route's scope is refused
(401 without a token, 403 with one) whatever else is wrong with its request, and one
with it never is; and a checker appending with fsync meanwhile loses nothing it was
acknowledged.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

from waymark.protocol import ENDPOINTS, ErrorCode, ScopeKind
from waymark.protocol.errors import STATUS
from waymark.protocol.scopes import Grant, allows
from waymark.server.auth import new_token

CHECKED = "fuzz.checked"  # the checker's fsync topic
# Who calls: a token per scope kind (admin holds them all), and no token at all.
CALLERS: dict[str, tuple[str, ...] | None] = {
    "read": ("read:*",), "write": ("write:*",), "delete": ("delete:*",),
    "queue": ("queue:*",), "admin": ("admin",), "none": None,
}  # fmt: skip
EXAMPLES = 3  # per operation and mode: the callers take turns across them
STREAMS = {"watch", "work", "watchCheckpoints"}  # SSE: only the head is read
ENDPOINT = {(e.method.lower(), e.path): e for e in ENDPOINTS}


@dataclass
class Fuzzed:
    url: str
    secrets: dict[str, str | None]
    grants: dict[str, tuple[Grant, ...]]
    tried: Counter[str] = field(default_factory=Counter)  # mode -> requests sent
    statuses: Counter[int] = field(default_factory=Counter)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, spawn_module_server) -> Fuzzed:
    root = tmp_path_factory.mktemp("fuzz")
    tokens = root / "tokens.toml"
    secrets: dict[str, str | None] = {"none": None}
    for name, scopes in CALLERS.items():
        if scopes is not None:
            secrets[name] = new_token(tokens, name, list(scopes))
    secrets["checker"] = new_token(tokens, "checker", [f"write:{CHECKED}", f"read:{CHECKED}"])
    server = spawn_module_server(root / "data", "--tokens", str(tokens))
    from waymark.server.auth import Tokens

    loaded = {t.name: t.grants for t in Tokens.load(tokens).by_id.values()}
    return Fuzzed(server.url, secrets, loaded)


@dataclass
class Checker:
    """Appends to an fsync topic until stopped, keeping every acknowledged seq."""

    url: str
    token: str
    acked: dict[int, int] = field(default_factory=dict)  # seq -> n
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        headers = {"authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as http:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                answer = http.post(f"/v0/topics/{CHECKED}/records",
                                   json={"records": [{"data": {"n": n}}]})  # fmt: skip
                if answer.status_code == 200:
                    self.acked[answer.json()["seqs"][0]] = n

    def lost(self) -> list[int]:
        headers = {"authorization": f"Bearer {self.token}"}
        stored: dict[int, Any] = {}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as http:
            cursor = 0
            while True:
                page = http.post(f"/v0/topics/{CHECKED}/diff",
                                 json={"from_seq": cursor, "limit": 10_000}).json()  # fmt: skip
                stored.update((r["$seq"], r["data"]) for r in page["records"])
                if not page["records"]:
                    return [s for s, n in self.acked.items() if stored.get(s) != {"n": n}]
                cursor = page["next_from_seq"]


@pytest.fixture(scope="module")
def checker(fuzzed: Fuzzed) -> Iterator[Checker]:
    secret = fuzzed.secrets["checker"]
    assert secret is not None
    admin = {"authorization": f"Bearer {fuzzed.secrets['admin']}"}
    put = httpx.put(f"{fuzzed.url}/v0/topics/{CHECKED}", json={"durability": "fsync"},
                    headers=admin, timeout=30)  # fmt: skip
    assert put.status_code == 201, put.text
    checker = Checker(fuzzed.url, secret)
    thread = threading.Thread(target=checker.run, daemon=True)
    thread.start()
    yield checker
    checker.stop.set()
    thread.join(30)


def _short_waits(kwargs: dict[str, Any]) -> None:
    """A long-poll (``wait_ms``) on a topic nobody writes would wait up to a minute."""
    for place in (kwargs.get("json"), kwargs.get("params")):
        if isinstance(place, dict) and type(place.get("wait_ms")) is int:
            place["wait_ms"] = min(place["wait_ms"], 20) if place["wait_ms"] >= 0 else -1


def _send(http: httpx.Client, kwargs: dict[str, Any], stream: bool) -> tuple[int, bytes] | None:
    """Status and body (a stream's: none), or None if httpx cannot send it at all."""
    request = {"method": kwargs["method"], "url": kwargs["url"], "params": kwargs.get("params"),
               "headers": dict(kwargs.get("headers", {}))}  # fmt: skip
    if "json" in kwargs:
        request["json"] = kwargs["json"]
    elif kwargs.get("data") is not None:
        data = kwargs["data"]
        request["content"] = data if isinstance(data, bytes) else str(data).encode()
    try:
        if stream:
            with http.stream(**request) as answer:
                if answer.status_code == 200:
                    return 200, b""
                return answer.status_code, answer.read()
        answer = http.request(**request)
    except (httpx.InvalidURL, httpx.LocalProtocolError, UnicodeEncodeError, TypeError,
            ValueError):  # fmt: skip
        return None  # not an HTTP request a client could send
    return answer.status_code, answer.content


def _check(fuzzed: Fuzzed, case: schemathesis.Case, who: str, status: int, body: bytes) -> None:
    endpoint = ENDPOINT[(case.method.lower(), case.path)]
    where = f"{case.method} {case.formatted_path} as {who}: {status} {body[:300]!r}"
    assert status < 500, where
    code = None
    if status >= 400:
        error = httpx.Response(status, content=body).json()["error"]
        code = ErrorCode(error["code"])  # a code the API documents
        assert STATUS[code] == status, where  # with the status docs/http-api.md gives it
        assert isinstance(error["message"], str) and error["message"], where
    if endpoint.scope is ScopeKind.OPEN or code in (ErrorCode.NOT_FOUND,
                                                    ErrorCode.INVALID_TOPIC_NAME):  # fmt: skip
        return  # no token needed, or refused before the route's scope is asked
    topic = (case.path_parameters or {}).get("topic")
    if who == "none":
        assert code is ErrorCode.UNAUTHORIZED, where
    elif endpoint.scope is ScopeKind.TOKEN or allows(
        fuzzed.grants[who], endpoint.scope, None if topic is None else str(topic)
    ):
        assert code not in (ErrorCode.UNAUTHORIZED, ErrorCode.FORBIDDEN), where
    else:
        assert code is ErrorCode.FORBIDDEN, where


def _fuzz(fuzzed: Fuzzed, http: httpx.Client, operation: Any, mode: GenerationMode) -> None:
    """``EXAMPLES`` cases of one operation in one mode, the callers taking turns."""
    callers = list(CALLERS)
    # The negative cases start where the positive ones stopped: every caller, both modes.
    start = (len(operation.path) + (EXAMPLES if mode is GenerationMode.NEGATIVE else 0)) % len(
        callers
    )
    turns = itertools.cycle(callers[start:] + callers[:start])
    stream = operation.definition.raw.get("operationId") in STREAMS

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=operation.as_strategy(generation_mode=mode))
    def call(case: schemathesis.Case) -> None:
        who = next(turns)
        secret = fuzzed.secrets[who]
        headers = {} if secret is None else {"authorization": f"Bearer {secret}"}
        kwargs = case.as_transport_kwargs(base_url=fuzzed.url, headers=headers)
        sent_token = {k.lower(): v for k, v in kwargs["headers"].items()}.get("authorization")
        if sent_token != headers.get("authorization"):
            who = "none"  # a negative case made its own Authorization: no valid token
        _short_waits(kwargs)
        sent = _send(http, kwargs, stream)
        if sent is None:
            return
        fuzzed.tried[mode.value] += 1
        fuzzed.statuses[sent[0]] += 1
        _check(fuzzed, case, who, *sent)

    try:
        call()
    except Unsatisfiable:
        # An operation without parameters or a body has no case that breaks its schema.
        assert (
            mode is GenerationMode.NEGATIVE
            and not operation.body
            and not any(operation.iter_parameters())
        ), operation.path


def test_every_route_with_every_scope_refuses_with_its_code_and_loses_nothing(
    fuzzed: Fuzzed, checker: Checker
) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzzed.url}/v0/openapi.json")
    with httpx.Client(base_url=fuzzed.url, timeout=30) as http:
        for result in schema.get_all_operations():
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz(fuzzed, http, result.ok(), mode)
    checker.stop.set()
    lost = checker.lost()
    print(f"fuzzed {dict(fuzzed.tried)}; statuses {sorted(fuzzed.statuses.items())}; "
          f"{len(checker.acked)} fsync appends acknowledged, {len(lost)} lost")  # fmt: skip
    assert fuzzed.tried["negative"] > 0 and fuzzed.tried["positive"] > 0
    assert checker.acked and not lost, lost


def test_the_fuzzed_document_is_the_served_one(fuzzed: Fuzzed) -> None:
    """What the fuzzer read is what the server says it serves: with tokens on, every
    operation but the open ones asks for the bearer scheme."""
    served = httpx.get(f"{fuzzed.url}/v0/openapi.json").json()
    for path, operations in served["paths"].items():
        for method, operation in operations.items():
            endpoint = ENDPOINT[(method, path)]
            open_route = endpoint.scope is ScopeKind.OPEN
            assert (operation["security"] == []) is open_route, (method, path)
