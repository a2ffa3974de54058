"""A page in a browser against the default token-less loopback server
(docs/security.md, "Browsers"): a cross-origin form or no-cors fetch cannot write, a
DNS-rebinding page cannot read or write, and the console and allowed origins still work.
Each request is sent as the browser would send it, to a real ``waymark serve``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from waymark.client import Client


@pytest.fixture(scope="module")
def server(spawn_module_server, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return spawn_module_server(tmp_path_factory.mktemp("browser"),
                               "--cors-origin", "https://app.example")  # fmt: skip


def head_seq(url: str, topic: str) -> int:
    response = httpx.get(f"{url}/v0/topics/{topic}")
    return 0 if response.status_code == 404 else response.json()["head_seq"]


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain;charset=UTF-8",  # fetch(url, {mode: "no-cors", body: "..."})
        "application/x-www-form-urlencoded",  # <form method=post>
        "multipart/form-data; boundary=x",
        None,  # fetch with a Blob body of no type
    ],
)
def test_a_write_without_a_json_content_type_is_415_and_stores_nothing(
    server: Any, content_type: str | None
) -> None:
    with Client(server.url) as client:
        client.append("csrf", [{"data": 0}])  # type: ignore[list-item]
    before = head_seq(server.url, "csrf")
    headers = {"origin": server.url} if content_type is None else {
        "content-type": content_type, "origin": server.url}  # fmt: skip
    for path, body in [("records", b'{"records":[{"data":1}]}'),
                       ("delete", b'{"match":["tag","Glob",""]}')]:  # fmt: skip
        answer = httpx.post(f"{server.url}/v0/topics/csrf/{path}", content=body,
                            headers=headers)  # fmt: skip
        assert answer.status_code == 415, answer.text
        assert answer.json()["error"]["code"] == "unsupported_media_type"
    assert head_seq(server.url, "csrf") == before


def test_a_page_on_another_origin_is_refused_even_with_json(server: Any) -> None:
    """A page may send JSON only after a preflight, which a foreign origin fails; and
    its requests are refused outright, reads included."""
    evil = {"origin": "https://evil.example"}
    write = httpx.post(f"{server.url}/v0/topics/foreign/records",
                       json={"records": [{"data": 1}]}, headers=evil)  # fmt: skip
    read = httpx.get(f"{server.url}/v0/topics", headers=evil)
    preflight = httpx.options(f"{server.url}/v0/topics/foreign/records", headers={
        **evil, "access-control-request-method": "POST"})  # fmt: skip
    for answer in (write, read, preflight):
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["detail"] == {"origin": "https://evil.example"}
        assert "access-control-allow-origin" not in answer.headers
    assert head_seq(server.url, "foreign") == 0


def test_dns_rebinding_is_refused_by_host(server: Any) -> None:
    """The page's own name, rebound to 127.0.0.1: same-origin for the browser."""
    port = server.url.rsplit(":", 1)[1]
    rebound = {"host": f"evil.example:{port}", "origin": f"http://evil.example:{port}"}
    for answer in (
        httpx.get(f"{server.url}/v0/topics", headers=rebound),
        httpx.post(f"{server.url}/v0/topics/rebind/records", json={"records": [{"data": 1}]},
                   headers=rebound),
    ):  # fmt: skip
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["detail"] == {"host": f"evil.example:{port}"}
    assert head_seq(server.url, "rebind") == 0
    for name in ("localhost", "127.0.0.1"):  # the loopback names are the server's
        assert httpx.get(f"{server.url}/v0/health", headers={"host": f"{name}:{port}"}
                         ).status_code == 200  # fmt: skip


def test_the_console_s_origin_and_an_allowed_one_are_served(server: Any) -> None:
    same = httpx.post(f"{server.url}/v0/topics/console/records", json={"records": [{"data": 1}]},
                      headers={"origin": server.url})  # fmt: skip
    assert same.status_code == 200 and "access-control-allow-origin" not in same.headers
    app = {"origin": "https://app.example"}
    preflight = httpx.options(f"{server.url}/v0/topics/console/records", headers={
        **app, "access-control-request-method": "POST",
        "access-control-request-headers": "content-type, authorization"})  # fmt: skip
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "content-type" in preflight.headers["access-control-allow-headers"]
    write = httpx.post(f"{server.url}/v0/topics/console/records",
                       json={"records": [{"data": 2}]}, headers=app)  # fmt: skip
    assert write.status_code == 200
    assert write.headers["access-control-allow-origin"] == "https://app.example"
    assert head_seq(server.url, "console") == 2
