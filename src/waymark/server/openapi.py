"""``GET /v0/openapi.json``: an OpenAPI 3.1 document of the /v0 API.

Body schemas are generated from the msgspec structs in :mod:`.schemas` (the
same structs the server decodes requests into), so the document cannot drift
from what the server accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

import waymark

from ..log.records import TOPIC_NAME
from . import schemas as s
from .schemas import MAX_DIFF_LIMIT


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    operation_id: str
    summary: str
    ok: int = 200
    ok_type: type | None = None
    body: type | None = None
    body_required: bool = True
    errors: tuple[int, ...] = (400, 404)
    query: tuple[dict[str, Any], ...] = ()
    # A non-JSON success body: (media type, description).
    raw_ok: tuple[str, str] | None = None


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


_SEQ = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_TOPIC = "/v0/topics/{topic}"

OPERATIONS = (
    Operation(
        "get",
        "/v0/health",
        "health",
        "Readiness: 200 when the server serves requests",
        ok_type=s.Health,
        errors=(),
    ),
    Operation(
        "get",
        "/v0/topics",
        "listTopics",
        "Every topic's state, sorted by name",
        ok_type=s.TopicList,
        errors=(),
    ),
    Operation(
        "put",
        _TOPIC,
        "putTopic",
        "Create (201) or update (200) a topic; config fields at the top level",
        ok_type=s.TopicState,
        body=s.TopicPut,
        body_required=False,
        errors=(400, 409),
    ),
    Operation(
        "get",
        _TOPIC,
        "getTopic",
        "A topic's state; touch=false reads without consuming",
        ok_type=s.TopicState,
        query=(_query("touch", {"type": "boolean"}, "count this read as consumption"),),
    ),
    Operation(
        "delete",
        _TOPIC,
        "deleteTopic",
        "Delete a topic with its records, tag index and dedupe state",
        ok_type=s.TopicDeleted,
    ),
    Operation(
        "post",
        f"{_TOPIC}/records",
        "append",
        "Append records atomically; lazily creates the topic unless create=false",
        ok_type=s.AppendResponse,
        body=s.AppendRequest,
        errors=(400, 404, 409, 422),
    ),
    Operation(
        "post",
        f"{_TOPIC}/diff",
        "diff",
        "Records with $seq > from_seq (a tombstone first if live records were lost); "
        "wait_ms long-polls for new records",
        ok_type=s.DiffResponse,
        body=s.DiffRequest,
    ),
    Operation(
        "get",
        f"{_TOPIC}/watch",
        "watch",
        "Server-Sent Events: `event: record|tombstone`, `id: <epoch>:<seq>`; resumes "
        "from Last-Event-ID; idle streams get `: heartbeat` comment lines",
        raw_ok=("text/event-stream", "An endless event stream"),
        query=(
            _query("from_seq", _SEQ, "exclusive lower bound; default 0"),
            _query("epoch", _SEQ, "the topic instance the cursor belongs to"),
            _query(
                "node",
                {"type": "array", "items": {"type": "string"}},
                "reader node id(s): their own records are skipped",
            ),
        ),
    ),
    Operation(
        "post",
        f"{_TOPIC}/delete",
        "deleteRecords",
        "Permanently delete records by before_seq and/or tag match (silent, point-in-time)",
        ok_type=s.DeleteResponse,
        body=s.DeleteRequest,
    ),
    Operation(
        "get",
        "/v0/openapi.json",
        "openapi",
        "This document",
        errors=(),
        raw_ok=("application/json", "OpenAPI 3.1"),
    ),
    Operation(
        "get",
        "/metrics",
        "metrics",
        "Prometheus metrics",
        errors=(),
        raw_ok=("text/plain", "Prometheus text exposition format"),
    ),
)

_ERRORS = {
    400: "Invalid request",
    404: "No such topic",
    409: "Conflicts with the topic",
    422: "The topic is full (discard=reject)",
}


def document() -> dict[str, Any]:
    # Imported here: the staging routes' module builds its Operations from this one.
    from .queues import OPERATIONS as QUEUES
    from .routers import OPERATIONS as ROUTERS
    from .staging import OPERATIONS as STAGING

    operations = OPERATIONS + STAGING + QUEUES + ROUTERS
    types = sorted(
        {t for op in operations for t in (op.ok_type, op.body) if t} | {s.Error},
        key=lambda t: t.__name__,
    )
    refs, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    ref = dict(zip(types, refs, strict=True))
    error = {"description": "", "content": {"application/json": {"schema": ref[s.Error]}}}
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        spec: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
        params = list(op.query)
        if "{topic}" in op.path:
            params.insert(
                0,
                {
                    "name": "topic",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": f"^{TOPIC_NAME.pattern}$"},
                },
            )
        if params:
            spec["parameters"] = params
        if op.body is not None:
            spec["requestBody"] = {
                "required": op.body_required,
                "content": {"application/json": {"schema": ref[op.body]}},
            }
        if op.raw_ok is not None:
            media, description = op.raw_ok
            ok = {"description": description, "content": {media: {"schema": {}}}}
        else:
            ok = {"description": "OK", "content": {"application/json": {"schema": ref[op.ok_type]}}}
        responses: dict[str, Any] = {str(op.ok): ok}
        if op.method == "put":
            responses["201"] = {**ok, "description": "Created"}
        for status in op.errors:
            responses[str(status)] = {**error, "description": _ERRORS[status]}
        responses["default"] = {**error, "description": "Any other refusal"}
        paths.setdefault(op.path, {})[op.method] = spec | {"responses": responses}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "waymark topics",
            "version": waymark.__version__,
            "description": "Append-only topics with no silent loss: every involuntary gap "
            f"reaches readers as a tombstone. Diff pages hold at most {MAX_DIFF_LIMIT} records.",
        },
        "paths": paths,
        "components": {"schemas": components},
    }
