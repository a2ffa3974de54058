"""Keep pydantic out of a ``waymark`` start (docs/cli.md, "Start-up").

typer (0.29) checks every parameter value of the invoked command with a pydantic
TypeAdapter, built on first use, even for an option not given (``--help``'s None):
importing pydantic and building adapters is 0.3 to 1 s of every start here, more than
everything else together. :func:`install` gives typer a lazy adapter instead: a value
that already is what the parameter wants (None, a ``str`` for a ``str`` option, a
default ``int`` within its bounds) is taken as typer would take it, and anything else
(a number to parse, a path, a choice, a list) goes to typer's own pydantic adapter,
built then. If typer's internals are not the ones expected, nothing is changed.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union, get_args, get_origin

_Build = Callable[[Any], Any]


class _LazyRuntimeParam:
    """typer's RuntimeParam for one parameter, built only when a value needs it."""

    def __init__(self, descriptor: Any, build: _Build) -> None:
        self.descriptor, self._build = descriptor, build
        self._real: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:  # as typer's RuntimeParam.coerce
            return () if multi else None
        descriptor = self.descriptor
        if not multi and _already(value, descriptor.annotation, descriptor):
            return value
        if multi and _all_already(value, descriptor):
            return list(value)  # typer's list adapter gives a list
        if not multi and isinstance(value, str) and (path_type := _path_type(descriptor)):
            # typer's path checks, given the Path its adapter would make of the text
            return _paths[0](path_type(value), descriptor.parameter_info,
                             path_type=path_type, param=param, ctx=ctx)  # fmt: skip
        if self._real is None:
            self._real = self._build(self.descriptor)
        return self._real.coerce(value, param=param, ctx=ctx)


def _optional_of(annotation: Any) -> Any:
    """``X`` for ``X | None``; any other annotation as it is."""
    if get_origin(annotation) in (Union, types.UnionType):
        others = [a for a in get_args(annotation) if a is not type(None)]
        if len(others) == 1:
            return others[0]
    return annotation


def _already(value: Any, annotation: Any, descriptor: Any) -> bool:
    """Whether typer's adapter for ``annotation`` would hand ``value`` back unchanged."""
    if descriptor.is_choice or descriptor.is_file or descriptor.is_path:
        return False
    annotation = _optional_of(annotation)
    if annotation not in (str, int, float, bool) or type(value) is not annotation:
        return False
    info = descriptor.parameter_info
    low, high = getattr(info, "min", None), getattr(info, "max", None)
    return (low is None or value >= low) and (high is None or value <= high)


def _all_already(values: Any, descriptor: Any) -> bool:
    """Whether ``values`` of a ``list[X]`` option are each what typer's adapter for
    ``X`` hands back unchanged."""
    annotation = _optional_of(descriptor.annotation)
    if get_origin(annotation) is not list or not isinstance(values, (list, tuple)):
        return False
    (item,) = get_args(annotation)
    return all(_already(value, item, descriptor) for value in values)


def _path_type(descriptor: Any) -> type[Path] | None:
    """The Path type typer's path adapter makes of a text value (as it finds it), or
    None when its path is not a plain ``Path`` parameter."""
    if descriptor.is_file or descriptor.is_choice or not descriptor.is_path or not _paths[0]:
        return None
    path_type = descriptor.parameter_info.path_type or descriptor.annotation
    return path_type if isinstance(path_type, type) and issubclass(path_type, Path) else None


def install() -> None:
    """Give typer the lazy adapter (once; a no-op on a typer without these internals)."""
    try:
        import typer.core as core
    except ImportError:  # pragma: no cover - typer is a dependency
        return
    build = getattr(core, "build_runtime_param", None)
    if build is None or build is _lazy:
        return
    try:  # typer's checks of a path value, free of pydantic once given a Path
        from typer._param_types import coerce_cli_path

        _paths.append(coerce_cli_path)
    except ImportError:  # pragma: no cover - a typer without it: paths go to its adapter
        _paths.append(None)
    _built.append(build)
    core.build_runtime_param = _lazy


_built: list[_Build] = []  # typer's own builder, once install() replaced it
_paths: list[Any] = []  # typer's path checks, once install() found them


def _lazy(descriptor: Any) -> Any:
    return _LazyRuntimeParam(descriptor, _built[0])
