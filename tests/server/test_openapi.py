"""The OpenAPI document, and schemathesis fuzzing the real server with it."""

from __future__ import annotations

from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from waymark.protocol import ENDPOINTS, MAX_WAIT_MS
from waymark.protocol.openapi import document

ROUTES = {
    ("get", "/v0/health"), ("get", "/v0/topics"), ("put", "/v0/topics/{topic}"),
    ("get", "/v0/topics/{topic}"), ("delete", "/v0/topics/{topic}"),
    ("post", "/v0/topics/{topic}/records"), ("post", "/v0/topics/{topic}/diff"),
    ("get", "/v0/topics/{topic}/watch"), ("post", "/v0/topics/{topic}/delete"),
    ("get", "/v0/openapi.json"), ("get", "/metrics"),
}  # fmt: skip


def test_the_document_is_openapi_3_1_and_covers_every_route(http: httpx.Client) -> None:
    served = http.get("/v0/openapi.json").json()
    assert served == document(auth=False)  # this server has no tokens
    assert served["openapi"] == "3.1.0"
    operations = {(m, p) for p, ops in served["paths"].items() for m in ops}
    assert operations >= ROUTES
    assert operations == {(e.method.lower(), e.path) for e in ENDPOINTS}  # one table
    schemas = served["components"]["schemas"]
    # Body schemas come from the msgspec structs the server decodes into.
    assert schemas["RecordIn"]["required"] == ["data"]
    assert schemas["AppendRequest"]["additionalProperties"] is False
    assert "wait_ms" in schemas["DiffRequest"]["properties"]


# The watch streams never end by themselves, so they are fuzzed by hand instead (the
# topic watch in test_sse, the change checkpoint watch in tests/recovery/test_server.py).
schema = (
    schemathesis.openapi.from_dict(document(auth=False))
    .exclude(path="/v0/topics/{topic}/watch")
    .exclude(path="/v0/changes/watch")
)


@schema.parametrize()
# No database: under CI hypothesis derandomizes, and schemathesis, rebuilding these
# settings, refuses the suite's database beside that (tests/conftest.py).
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_no_input_crashes_the_server(case: schemathesis.Case, waymark_server: Any) -> None:
    body: Any = case.body
    # A long-poll on a topic the fuzzer created would wait up to a minute; keep it short.
    # Out-of-range values stay as they are: they must still be refused.
    wait = body.get("wait_ms") if isinstance(body, dict) else None
    if type(wait) is int and 20 < wait <= MAX_WAIT_MS:
        body["wait_ms"] = 20
    case.call_and_validate(
        base_url=waymark_server.url,
        timeout=15,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            negative_data_rejection,
        ],
    )
