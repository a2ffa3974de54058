"""A pipeline's spec: a TOML file naming the rendezvous store, the edges with their
candidate servers, and the stages with their functions (docs/pipeline.md)."""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class SpecError(ValueError):
    """The pipeline file is not a valid pipeline."""


@dataclass(frozen=True)
class EdgeSpec:
    name: str
    candidates: list[str]
    capacity: int = 1_000_000


@dataclass(frozen=True)
class SinkSpec:
    url: str
    topic: str


@dataclass(frozen=True)
class StageSpec:
    name: str
    function: str
    input: str | None = None
    output: str | None = None
    sink: SinkSpec | None = None
    events: int | None = None
    batch: int = 500
    external: bool = False  # run outside the runner, e.g. a Spark query (docs/spark.md)

    def load(self) -> Callable[..., Any]:
        """The stage's function, from ``module:function``."""
        module, _, attr = self.function.partition(":")
        if not module or not attr:
            raise SpecError(f"stage {self.name!r}: function must be 'module:function'")
        try:
            return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
        except (ImportError, AttributeError) as error:
            raise SpecError(f"stage {self.name!r}: cannot load {self.function}: {error}") from error


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    handoff: str
    edges: dict[str, EdgeSpec]
    stages: dict[str, StageSpec]
    metrics_port: int | None = None
    consumers: dict[str, str] = field(default_factory=dict)  # edge -> its reading stage

    @classmethod
    def load(cls, path: Path) -> PipelineSpec:
        try:
            doc = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise SpecError(f"{path}: {error}") from error
        return cls.parse(doc)

    @classmethod
    def parse(cls, doc: dict[str, Any]) -> PipelineSpec:
        top = doc.get("pipeline", {})
        if "handoff" not in top:
            raise SpecError("[pipeline] needs handoff = 'file:///dir' or 's3://bucket/prefix'")
        servers = list(top.get("servers", []))
        edges: dict[str, EdgeSpec] = {}
        for raw in doc.get("edge", []):
            candidates = list(raw.get("candidates", servers))
            if not candidates:
                raise SpecError(f"edge {raw.get('name')!r} has no candidate servers")
            edges[raw["name"]] = EdgeSpec(raw["name"], candidates,
                                          int(raw.get("capacity", 1_000_000)))  # fmt: skip
        stages: dict[str, StageSpec] = {}
        consumers: dict[str, str] = {}
        for raw in doc.get("stage", []):
            sink = raw.get("sink")
            external = bool(raw.get("external", False))
            stage = StageSpec(
                name=raw["name"], function=raw.get("function", ""), input=raw.get("input"),
                output=raw.get("output"),
                sink=SinkSpec(sink["url"], sink["topic"]) if sink else None,
                events=raw.get("events"), batch=int(raw.get("batch", 500)), external=external,
            )  # fmt: skip
            if external:
                # Only its input matters here: the producers of that edge keep what
                # it has not acknowledged (docs/pipeline.md, "A Spark stage").
                if stage.input is None or stage.output is not None or stage.events is not None:
                    raise SpecError(f"stage {stage.name!r}: an external stage has input = EDGE "
                                    "only")  # fmt: skip
            else:
                if not stage.function:
                    raise SpecError(f"stage {stage.name!r}: function = 'module:function'")
                if (stage.input is None) == (stage.events is None):
                    raise SpecError(f"stage {stage.name!r}: give input = EDGE or events = N")
                if (stage.output is None) == (stage.sink is None):
                    raise SpecError(f"stage {stage.name!r}: give output = EDGE or a sink")
            for edge in (stage.input, stage.output):
                if edge is not None and edge not in edges:
                    raise SpecError(f"stage {stage.name!r}: no [[edge]] named {edge!r}")
            if stage.input is not None:
                if stage.input in consumers:
                    raise SpecError(f"edge {stage.input!r} has two consuming stages")
                consumers[stage.input] = stage.name
            stages[stage.name] = stage
        for edge in edges:
            if edge not in consumers:
                raise SpecError(f"edge {edge!r} has no consuming stage")
        port = top.get("metrics_port")
        return cls(top.get("name", "pipeline"), top["handoff"], edges, stages,
                   None if port is None else int(port), consumers)  # fmt: skip
