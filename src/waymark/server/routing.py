"""Path routing by segments: ``/v0/topics/{topic}/records`` and friends.

Topic names never contain ``/`` (docs/semantics/topics.md §2.1), so splitting the path on
``/`` and comparing literal segments is exact and needs no regular expressions. Routing
uses the raw (still percent-encoded) path so that an encoded ``%2F`` stays inside its
segment and reaches the name check, rather than silently changing the route.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote

from .http import Handler

RECENT_PATHS = 4096


@dataclass(frozen=True)
class Route:
    """One path template and the handler for each method it accepts."""

    template: str
    methods: dict[str, Handler]
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


class Router:
    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        self._by_length: dict[int, list[Route]] = {}
        self._recent: dict[str | bytes, tuple[Route, dict[str, str]]] = {}
        for route in routes:
            self._by_length.setdefault(len(route.segments), []).append(route)

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
