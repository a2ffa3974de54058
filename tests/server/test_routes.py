"""Routing and error shape: routes from the endpoint table, 404 for unknown routes,
405 with Allow, metrics."""

from __future__ import annotations

import re

import httpx
import pytest

from waymark.protocol import ENDPOINTS
from waymark.server import App
from waymark.server.routing import PathTable


def test_every_endpoint_has_exactly_one_handler_and_every_handler_an_endpoint() -> None:
    app = App()
    assert set(app.handlers) == {e.operation_id for e in ENDPOINTS}
    served = {
        (method, route.template): handler
        for route in app.paths.routes
        for method, handler in route.methods.items()
    }
    assert served == {(e.method, e.path): app.handlers[e.operation_id] for e in ENDPOINTS}
    missing = {k: v for k, v in app.handlers.items() if k != "diff"}
    with pytest.raises(ValueError, match="no handler \\['diff'\\]"):
        PathTable.build(ENDPOINTS, missing)
    with pytest.raises(ValueError, match="without an endpoint \\['stray'\\]"):
        PathTable.build(ENDPOINTS, {**app.handlers, "stray": app.handlers["health"]})
    with pytest.raises(ValueError, match="duplicated ids \\['health'\\]"):
        PathTable.build([*ENDPOINTS, ENDPOINTS[0]], app.handlers)


def test_unknown_routes_are_404_not_found(http: httpx.Client, api) -> None:
    for path in ("/", "/v0", "/v1/topics", "/v0/topics/x/records/extra", "/v0/topics/x/nope"):
        api.error(http.get(path), 404, "not_found")


def test_wrong_methods_are_405_with_allow(http: httpx.Client, api) -> None:
    cases = {
        ("POST", "/v0/health"): "GET",
        ("DELETE", "/v0/topics"): "GET",
        ("POST", "/v0/topics/x"): "PUT, GET, DELETE",
        ("GET", "/v0/topics/x/records"): "POST",
        ("GET", "/v0/topics/x/diff"): "POST",
        ("POST", "/v0/topics/x/watch"): "GET",
        ("GET", "/v0/topics/x/delete"): "POST",
    }
    for (method, path), allow in cases.items():
        response = http.request(method, path)
        api.error(response, 405, "method_not_allowed")
        assert response.headers["allow"] == allow


def test_responses_are_json(http: httpx.Client, api, topic) -> None:
    api.write(topic, 1)
    for response in (http.get("/v0/health"), http.get(f"/v0/topics/{topic}"),
                     http.get("/v0/nope")):  # fmt: skip
        assert response.headers["content-type"] == "application/json"


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and all(f'{k}="{v}"' in (match[1] or "") for k, v in labels.items()):
            return float(match[2])
    raise AssertionError(f"no {name}{{{want}}} in metrics")


def test_metrics_count_requests_records_and_topics(http: httpx.Client, api, topic) -> None:
    before = http.get("/metrics").text
    api.write(topic, 1, 2, 3)
    api.diff(topic, 0)
    api.error(api.post(topic, "diff", from_seq=-1), 400, "invalid_request")
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    after = response.text
    route = "/v0/topics/{topic}/records"
    assert metric(after, "waymark_http_requests_total", route=route, status="200") == (
        metric(before, "waymark_http_requests_total", route=route, status="200") + 1
    )
    assert metric(after, "waymark_http_requests_total", route="/v0/topics/{topic}/diff",
                  status="400") >= 1  # fmt: skip
    assert (
        metric(after, "waymark_records_appended_total")
        - metric(before, "waymark_records_appended_total")
        == 3
    )
    assert metric(after, "waymark_records_read_total") >= 3
    assert metric(after, "waymark_topics") >= 1
    assert metric(after, "waymark_http_request_duration_seconds_count", route=route) >= 1
    assert metric(after, "waymark_http_request_duration_seconds_bucket", route=route,
                  le="+Inf") >= 1  # fmt: skip
