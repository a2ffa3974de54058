"""Path routing by segments: ``/v0/topics/{topic}/records`` and friends.

The routes come from the protocol's endpoint table (:data:`waymark.protocol.ENDPOINTS`):
:meth:`PathTable.build` pairs each endpoint with its handler by operation id.

Topic names never contain ``/`` (docs/semantics/topics.md §2.1), so splitting the path on
``/`` and comparing literal segments is exact and needs no regular expressions. Routing
uses the raw (still percent-encoded) path so that an encoded ``%2F`` stays inside its
segment and reaches the name check, rather than silently changing the route.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from ..protocol import Endpoint
from .http import Handler

RECENT_PATHS = 4096


@dataclass(frozen=True)
class Route:
    """One path template and the handler for each method it accepts."""

    template: str
    methods: dict[str, Handler]
    # The endpoint of each method: its scope and whether it streams (docs/security.md).
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    # Segments of the template; a "{name}" segment captures a parameter.
    segments: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.template.strip("/").split("/")))

    def match(self, parts: list[str]) -> dict[str, str] | None:
        params: dict[str, str] = {}
        for want, got in zip(self.segments, parts, strict=True):
            if want[0] == "{":
                if not got:
                    return None
                params[want[1:-1]] = unquote(got) if "%" in got else got
            elif want != got:
                return None
        return params


class PathTable:
    """Finds the route of a request path (the HTTP layer's matcher, not a router of
    docs/semantics/topics.md §8)."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        self._by_length: dict[int, list[Route]] = {}
        self._recent: dict[str | bytes, tuple[Route, dict[str, str]]] = {}
        for route in routes:
            self._by_length.setdefault(len(route.segments), []).append(route)

    @classmethod
    def build(cls, endpoints: Iterable[Endpoint], handlers: Mapping[str, Handler]) -> PathTable:
        """One route per path template; a path's methods in the table's order (which is
        the order its ``Allow`` header lists them in). Every endpoint needs exactly one
        handler and every handler an endpoint: anything else is a ValueError."""
        endpoints = list(endpoints)
        ids = [e.operation_id for e in endpoints]
        duplicated = {i for i in ids if ids.count(i) > 1}
        missing, extra = set(ids) - set(handlers), set(handlers) - set(ids)
        if duplicated or missing or extra:
            raise ValueError(f"endpoints without exactly one handler: duplicated ids "
                             f"{sorted(duplicated)}, no handler {sorted(missing)}, "
                             f"handlers without an endpoint {sorted(extra)}")  # fmt: skip
        methods: dict[str, dict[str, Handler]] = {}
        declared: dict[str, dict[str, Endpoint]] = {}
        for endpoint in endpoints:
            route = methods.setdefault(endpoint.path, {})
            if endpoint.method in route:
                raise ValueError(f"{endpoint.method} {endpoint.path} is declared twice")
            route[endpoint.method] = handlers[endpoint.operation_id]
            declared.setdefault(endpoint.path, {})[endpoint.method] = endpoint
        return cls([Route(path, by_method, declared[path])
                    for path, by_method in methods.items()])  # fmt: skip

    def resolve(self, path: str | bytes) -> tuple[Route, dict[str, str]] | None:
        """The route and path parameters for ``path``, a raw (latin-1) path as bytes or a
        str (callers must not mutate the answer)."""
        # Producers hit the same few paths over and over: remember recent answers, keyed
        # by the path as given, so a hit decodes nothing.
        found = self._recent.get(path)
        if found is None:
            found = self._resolve(path.decode("latin-1") if isinstance(path, bytes) else path)
            if found is not None:
                if len(self._recent) >= RECENT_PATHS:
                    self._recent.clear()
                self._recent[path] = found
        return found

    def _resolve(self, path: str) -> tuple[Route, dict[str, str]] | None:
        parts = path.strip("/").split("/")
        for route in self._by_length.get(len(parts), ()):
            params = route.match(parts)
            if params is not None:
                return route, params
        return None
