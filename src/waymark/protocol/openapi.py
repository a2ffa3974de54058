"""``GET /v0/openapi.json``: the OpenAPI 3.1 document, generated from the endpoint table.

Body schemas come from the same msgspec structs the server decodes requests into and
the client decodes answers into, so the document cannot drift from either.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

from .. import __version__
from .endpoints import ENDPOINTS, Endpoint
from .errors import STATUS, Error
from .limits import MAX_ARROW_DIFF_LIMIT, MAX_DIFF_LIMIT, TOPIC_NAME_PATTERN
from .scopes import ScopeKind

_REF = "#/components/schemas/{name}"
_PATH_PARAM = re.compile(r"{(\w+)}")


def document(auth: bool = True, endpoints: Sequence[Endpoint] = ENDPOINTS) -> dict[str, Any]:
    """The document of ``endpoints`` (a server's, when it opens a route such as
    /metrics); ``auth`` False describes a server without tokens, which asks for none
    (docs/security.md)."""
    types = [Error]
    for endpoint in endpoints:
        types += [t for t in (endpoint.request, endpoint.response) if t is not None]
    types = list(dict.fromkeys(types))
    refs, components = msgspec.json.schema_components(types, ref_template=_REF)
    renamed, components = _plain_generic_names(components)
    components = _uniform_tuples(components)
    ref = {t: _renamed(r, renamed) for t, r in zip(types, refs, strict=True)}
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        operation = _operation(endpoint, ref, auth)
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "waymark topics",
            "version": __version__,
            "description": "Append-only topics with no silent loss: every involuntary gap "
            f"reaches readers as a tombstone. Diff pages hold at most {MAX_DIFF_LIMIT} records "
            f"as JSON, {MAX_ARROW_DIFF_LIMIT} as Arrow.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            # docs/security.md: `waymark serve --tokens FILE`; without it nothing is asked.
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "A token of `waymark token new`, when the server has tokens",
            }},
        },
    }  # fmt: skip


def _operation(endpoint: Endpoint, ref: dict[Any, dict[str, str]], auth: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"operationId": endpoint.operation_id, "summary": endpoint.summary}
    # The scope it needs (docs/security.md); an open route asks for no token at all.
    secured = auth and endpoint.scope is not ScopeKind.OPEN
    spec["security"] = [{"bearer": []}] if secured else []
    if endpoint.scope not in (ScopeKind.OPEN, ScopeKind.TOKEN):
        spec["x-waymark-scope"] = endpoint.scope.value
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True,
         "schema": {"type": "string", "pattern": f"^{TOPIC_NAME_PATTERN}$"}}
        for name in _PATH_PARAM.findall(endpoint.path)
    ]  # fmt: skip
    params += [
        {"name": q.name, "in": "query", "required": q.required, "schema": q.schema,
         "description": q.description}
        for q in endpoint.query
    ]  # fmt: skip
    if params:
        spec["parameters"] = params
    if endpoint.request is not None:
        spec["requestBody"] = {
            "required": endpoint.request_required,
            "content": {"application/json": {"schema": ref[endpoint.request]}},
        }
    ok: dict[str, Any]
    if endpoint.stream is not None:
        media, description = endpoint.stream
        ok = {"description": description, "content": {media: {"schema": {}}}}
    else:
        ok = {"description": "OK",
              "content": {"application/json": {"schema": ref[endpoint.response]}}}  # fmt: skip
        if endpoint.alternate is not None:
            media, description = endpoint.alternate
            ok["content"][media] = {"schema": {"description": description}}
    responses: dict[str, Any] = {str(endpoint.status): ok}
    if endpoint.created:
        responses["201"] = {**ok, "description": "Created"}
    error = {"content": {"application/json": {"schema": ref[Error]}}}
    statuses = list(endpoint.errors)
    if secured:
        statuses += [401] if endpoint.scope is ScopeKind.TOKEN else [401, 403]
    if endpoint.request is not None:
        statuses += [413, 415]
    for status in sorted(statuses):
        codes = ", ".join(code.value for code, s in STATUS.items() if s == status)
        responses[str(status)] = {**error, "description": f"Refused: {codes}"}
    responses["default"] = {**error, "description": "Any other refusal"}
    return spec | {"responses": responses}


def _plain_generic_names(
    components: dict[str, Any],
) -> tuple[dict[str, str], dict[str, Any]]:
    """Name ``DiffResponse[Any]`` plainly ``DiffResponse``: the document uses each generic
    body with one parameter only, so the bare name is unambiguous."""
    renamed = {
        name: schema["title"].split("[", 1)[0]
        for name, schema in components.items()
        if "[" in schema.get("title", "")
    }
    if len(set(renamed.values())) != len(renamed) or set(renamed.values()) & set(components):
        raise ValueError(f"generic bodies used with several parameters: {sorted(renamed)}")
    text = msgspec.json.encode(components).decode()
    for old, new in renamed.items():
        text = text.replace(f'"{_REF.format(name=old)}"', f'"{_REF.format(name=new)}"')
    out: dict[str, Any] = {}
    for name, schema in msgspec.json.decode(text).items():
        if name in renamed:
            name = schema["title"] = renamed[name]
        out[name] = schema
    return renamed, out


def _uniform_tuples(schema: Any) -> Any:
    """A tuple of one type (``samples``' ``[t_ms, head_seq, bytes]``) as an array of that
    type with a fixed length rather than ``prefixItems``: the same values, and a schema
    that tools which translate 3.1 documents to older JSON Schema drafts read as meant
    (schemathesis turned ``prefixItems`` into draft-4 tuple ``items`` and then refused
    its own schema)."""
    if isinstance(schema, list):
        return [_uniform_tuples(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _uniform_tuples(v) for k, v in schema.items()}
    prefix = out.get("prefixItems")
    if prefix and all(p == prefix[0] for p in prefix) and out.get("items") is False:
        del out["prefixItems"]
        out["items"] = prefix[0]
    return out


def _renamed(ref: dict[str, str], renamed: dict[str, str]) -> dict[str, str]:
    name = ref["$ref"].rsplit("/", 1)[1]
    return {"$ref": _REF.format(name=renamed.get(name, name))}
