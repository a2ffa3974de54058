"""A pipeline's spec: a TOML file naming the rendezvous store, the edges with their
candidate servers, and the stages with their functions (docs/pipeline.md, "A pipeline
file").

Validated whole before anything runs: the file's shape and types with msgspec
(unknown keys refused, with the closest known key offered), ranges, names, the
topology (every edge produced and consumed once, no duplicate names), each output
edge's capacity against its producers' batch, and every function imported (the
file's directory on the import path). Each problem is one line naming where it is.
"""

from __future__ import annotations

import difflib
import importlib
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from waymark.pipeline.identity import NAME_PATTERN
from waymark.pipeline.restart import RestartPolicy
from waymark.pipeline.shard import MAX_INSTANCES, part_name
from waymark.protocol.limits import MAX_DIFF_LIMIT, TOPIC_NAME_PATTERN

from .errors import PipelineError


class SpecError(PipelineError, ValueError):
    """The pipeline file is not a valid pipeline."""


# --- the file's shape ----------------------------------------------------------------
Name = Annotated[str, Meta(pattern=f"^{NAME_PATTERN}$")]
Url = Annotated[str, Meta(pattern=r"^https?://[^\s/]+(/\S*)?$")]
Store = Annotated[str, Meta(pattern=r"^(file|s3)://\S+$")]
Topic = Annotated[str, Meta(pattern=f"^{TOPIC_NAME_PATTERN}$")]
# A stage's batch is what one pop reads: a JSON page's limit (docs/semantics/topics.md).
Batch = Annotated[int, Meta(ge=1, le=MAX_DIFF_LIMIT)]


class _Restart(msgspec.Struct, forbid_unknown_fields=True):
    delay_s: Annotated[float, Meta(gt=0, le=3600)] = 0.5
    max_delay_s: Annotated[float, Meta(gt=0, le=3600)] = 30.0
    max_restarts: Annotated[int, Meta(ge=0)] = 10
    window_s: Annotated[float, Meta(gt=0)] = 60.0
    max_attempts: Annotated[int, Meta(ge=1)] = 3


class _Sink(msgspec.Struct, forbid_unknown_fields=True):
    url: Url
    topic: Topic


class _Pipeline(msgspec.Struct, forbid_unknown_fields=True):
    handoff: Store
    name: Name = "pipeline"
    servers: list[Url] = msgspec.field(default_factory=list)
    metrics_port: Annotated[int, Meta(ge=0, le=65535)] | None = None
    restart: _Restart = msgspec.field(default_factory=_Restart)
    dead_letter: _Sink | None = None
    checkpoint_interval_ms: Annotated[int, Meta(ge=0, le=3_600_000)] = 200
    store_budget_s: Annotated[float, Meta(gt=0, le=86_400)] = 60.0
    report_to: Url | None = None  # a server the status goes to, for its console
    report_every_s: Annotated[float, Meta(ge=0.1, le=3600)] = 2.0


class _Edge(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    candidates: list[Url] | None = None
    capacity: Annotated[int, Meta(ge=1, le=2**62)] = 1_000_000


class _Stage(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    function: str = ""
    input: Name | None = None
    output: Name | list[Name] | None = None  # several: each gets every output
    sink: _Sink | None = None
    events: Annotated[int, Meta(ge=0)] | None = None
    batch: Batch = 500
    external: bool = False
    # Instances, each owning a shard of the key space (docs/pipeline.md, "Sharded stages").
    instances: Annotated[int, Meta(ge=1, le=MAX_INSTANCES)] = 1
    lease_s: Annotated[float, Meta(ge=0.2, le=3600)] = 3.0


class _File(msgspec.Struct, forbid_unknown_fields=True):
    pipeline: _Pipeline
    edge: list[_Edge] = msgspec.field(default_factory=list)
    stage: list[_Stage] = msgspec.field(default_factory=list)


# The table a path's last key names, for close matches of an unknown key.
_TABLES: dict[str, type[msgspec.Struct]] = {
    "$": _File, "pipeline": _Pipeline, "edge": _Edge, "stage": _Stage, "sink": _Sink,
    "dead_letter": _Sink, "restart": _Restart,
}  # fmt: skip
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def _where(path: str, doc: dict[str, Any]) -> str:
    """``$.stage[1].sink`` as the file says it: ``[[stage]] 'sink': sink``."""
    steps = _STEP.findall(path.removeprefix("$"))
    if not steps:
        return "the file"
    table, index = steps[0][0], steps[1][1] if len(steps) > 1 else ""
    where = f"[{table}]"
    rest = steps[1:]
    if table == "pipeline" and rest and rest[0][0] in ("restart", "dead_letter"):
        where, rest = f"[pipeline.{rest[0][0]}]", rest[1:]
    if index:
        rows = doc.get(table)
        name = rows[int(index)].get("name") if isinstance(rows, list) else None
        label = repr(name) if isinstance(name, str) else f"#{int(index) + 1}"
        where = f"[[{table}]] {label}"
        rest = steps[2:]
    keys = ".".join(key or f"[{i}]" for key, i in rest)
    return f"{where}: {keys}" if keys else where


def _explain(error: msgspec.ValidationError, doc: dict[str, Any]) -> str:
    text = str(error)
    message, _, path = text.partition(" - at `")
    path = path.rstrip("`") or "$"
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", message)
    if unknown:
        key = unknown.group(1)
        last = [k for k, _ in _STEP.findall(path) if k]
        table = _TABLES[last[-1] if last else "$"]
        known = [f.encode_name for f in msgspec.structs.fields(table)]
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
        return f"{_where(path, doc)}: unknown key {key!r}{hint}"
    missing = re.fullmatch(r"Object missing required field `(.+)`", message)
    if missing:
        return f"{_where(path, doc)}: {missing.group(1)} is required"
    message = message.replace("Expected `str` matching regex", "expected a string matching")
    return f"{_where(path, doc)}: {message[:1].lower()}{message[1:]}"


# --- the validated pipeline ------------------------------------------------------------
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
    outputs: tuple[str, ...] = ()  # several: a broadcast (docs/pipeline.md, "Fan-out")
    sink: SinkSpec | None = None
    events: int | None = None
    batch: int = 500
    external: bool = False  # run outside the runner, e.g. a Spark query (docs/spark.md)
    instances: int = 1  # each owns a shard of the key space (docs/pipeline.md)
    lease_s: float = 3.0  # a shard whose owner did not renew this long is taken over

    @property
    def sharded(self) -> bool:
        return self.instances > 1

    def state_keys(self) -> list[str]:
        """Where the stage keeps its state and report: its name, or one per shard
        (``<stage>.<k>``, docs/semantics/pipeline.md §11)."""
        if not self.sharded:
            return [self.name]
        return [part_name(self.name, k) for k in range(self.instances)]

    @property
    def output(self) -> str | None:
        """The first output edge, or None."""
        return self.outputs[0] if self.outputs else None

    def load(self) -> Callable[..., Any]:
        """The stage's function, from ``module:function``."""
        module, _, attr = self.function.partition(":")
        if not module or not attr:
            raise SpecError(f"[[stage]] {self.name!r}: function must be 'module:function', "
                            f"not {self.function!r}")  # fmt: skip
        try:
            loaded = importlib.import_module(module)
        except ImportError as error:
            raise SpecError(f"[[stage]] {self.name!r}: cannot load {self.function}: "
                            f"{type(error).__name__}: {error}") from error  # fmt: skip
        except Exception as error:  # the module itself failed on import
            raise SpecError(f"[[stage]] {self.name!r}: importing {module} failed: "
                            f"{type(error).__name__}: {error}") from error  # fmt: skip
        try:
            function = getattr(loaded, attr)
        except AttributeError as error:
            close = difflib.get_close_matches(attr, dir(loaded), n=1, cutoff=0.6)
            hint = f"; did you mean {module}:{close[0]}?" if close else ""
            raise SpecError(f"[[stage]] {self.name!r}: cannot load {self.function}: "
                            f"{type(error).__name__}: {error}{hint}") from error  # fmt: skip
        if not callable(function):
            raise SpecError(f"[[stage]] {self.name!r}: {self.function} is not callable")
        from waymark.pipeline.functions import is_batch  # numpy: not at the CLI's start

        if self.events is not None and is_batch(function):
            raise SpecError(f"[[stage]] {self.name!r}: {self.function} is a batch function; "
                            "a source's function takes an event number")  # fmt: skip
        return function  # type: ignore[no-any-return]


@dataclass(frozen=True)
class EdgePart:
    """An edge as placed: ``name`` (``<edge>`` or, for a sharded consumer,
    ``<edge>.<k>``) has its own handoff record and topic; ``consumer`` is the state
    key of the stage or shard reading it."""

    name: str
    edge: str
    consumer: str
    shard: int | None


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    handoff: str
    edges: dict[str, EdgeSpec]
    stages: dict[str, StageSpec]
    metrics_port: int | None = None
    consumers: dict[str, str] = field(default_factory=dict)  # edge -> its reading stage
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    dead_letter: SinkSpec | None = None  # where poison events go (docs/pipeline.md)
    checkpoint_interval_ms: int = 200  # a busy stage saves its state at most this often
    store_budget_s: float = 60.0  # how long one store call waits out an outage
    report_to: str | None = None  # where the runner sends the status (docs/console.md)
    report_every_s: float = 2.0

    def parts(self, edge: str) -> list[EdgePart]:
        """The edges ``edge`` is made of: itself, or one per shard of its consumer,
        each read by that shard (docs/semantics/pipeline.md §11.1)."""
        consumer = self.stages[self.consumers[edge]]
        if not consumer.sharded:
            return [EdgePart(edge, edge, consumer.name, None)]
        return [EdgePart(part_name(edge, k), edge, part_name(consumer.name, k), k)
                for k in range(consumer.instances)]  # fmt: skip

    def all_parts(self) -> list[EdgePart]:
        """Every edge as it is placed: the handoff records and topics there are."""
        return [part for edge in self.edges for part in self.parts(edge)]

    def producer_keys(self, edge: str) -> list[str]:
        """The states and reports of every stage (or shard) writing ``edge``."""
        return [key for s in self.stages.values() if edge in s.outputs for key in s.state_keys()]

    @classmethod
    def load(cls, path: Path) -> PipelineSpec:
        """The pipeline in ``path``, validated, every function imported. The file's
        directory goes on the import path first, so ``myapp.stages:produce`` next to
        it imports without ``PYTHONPATH``."""
        try:
            doc = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise SpecError(str(error)) from error
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        spec = cls.parse(doc)
        for stage in spec.stages.values():
            if not stage.external:
                stage.load()
        return spec

    @classmethod
    def parse(cls, doc: dict[str, Any]) -> PipelineSpec:
        """Validate a parsed spec file (functions are not imported: :meth:`load` does)."""
        try:
            raw = msgspec.convert(doc, _File)
        except msgspec.ValidationError as error:
            raise SpecError(_explain(error, doc)) from error
        top = raw.pipeline
        edges: dict[str, EdgeSpec] = {}
        for e in raw.edge:
            if e.name in edges:
                raise SpecError(f"[[edge]] {e.name!r} is declared twice")
            candidates = e.candidates if e.candidates is not None else top.servers
            if not candidates:
                raise SpecError(f"[[edge]] {e.name!r}: no candidates, and [pipeline] has no "
                                "servers")  # fmt: skip
            edges[e.name] = EdgeSpec(e.name, list(candidates), e.capacity)
        stages: dict[str, StageSpec] = {}
        consumers: dict[str, str] = {}
        for s in raw.stage:
            if s.name in stages:
                raise SpecError(f"[[stage]] {s.name!r} is declared twice")
            stage = StageSpec(
                name=s.name, function=s.function, input=s.input,
                outputs=(s.output,) if isinstance(s.output, str) else tuple(s.output or ()),
                sink=SinkSpec(s.sink.url, s.sink.topic) if s.sink else None,
                events=s.events, batch=s.batch, external=s.external,
                instances=s.instances, lease_s=s.lease_s,
            )  # fmt: skip
            _check_stage(stage, edges)
            if stage.input is not None:
                if stage.input in consumers:
                    raise SpecError(f"[[edge]] {stage.input!r} has two consuming stages: "
                                    f"{consumers[stage.input]!r} and {stage.name!r}")  # fmt: skip
                consumers[stage.input] = stage.name
            stages[stage.name] = stage
        for edge in edges.values():
            if edge.name not in consumers:
                raise SpecError(f"[[edge]] {edge.name!r} has no consuming stage")
            producers = [s for s in stages.values() if edge.name in s.outputs]
            if not producers:
                raise SpecError(f"[[edge]] {edge.name!r} has no producing stage")
            for producer in producers:
                # A batch that never fits the bounded topic is refused forever.
                if producer.batch > edge.capacity:
                    raise SpecError(
                        f"[[edge]] {edge.name!r}: capacity {edge.capacity} is below the batch "
                        f"{producer.batch} of its producer {producer.name!r}"
                    )
        r = top.restart
        if r.max_delay_s < r.delay_s:
            raise SpecError(f"[pipeline.restart]: max_delay_s {r.max_delay_s} is below "
                            f"delay_s {r.delay_s}")  # fmt: skip
        restart = RestartPolicy(r.delay_s, r.max_delay_s, r.max_restarts, r.window_s,
                                r.max_attempts)  # fmt: skip
        dead = top.dead_letter
        return cls(top.name, top.handoff, edges, stages, top.metrics_port, consumers, restart,
                   SinkSpec(dead.url, dead.topic) if dead else None,
                   top.checkpoint_interval_ms, top.store_budget_s, top.report_to,
                   top.report_every_s)  # fmt: skip


def _check_stage(stage: StageSpec, edges: dict[str, EdgeSpec]) -> None:
    where = f"[[stage]] {stage.name!r}"
    if stage.external:
        # Only its input matters here: the producers of that edge keep what it has not
        # acknowledged (docs/pipeline.md, "A Spark stage").
        if stage.input is None or stage.outputs or stage.events is not None:
            raise SpecError(f"{where}: an external stage has input = EDGE only")
    else:
        if not stage.function:
            raise SpecError(f"{where}: function = 'module:function' is required")
        if (stage.input is None) == (stage.events is None):
            raise SpecError(f"{where}: give input = EDGE or events = N (one of them)")
        if (not stage.outputs) == (stage.sink is None):
            raise SpecError(f"{where}: give output = EDGE (or a list of edges) or a sink "
                            "(one of them)")  # fmt: skip
    if stage.sharded and (stage.input is None or stage.external):
        # A source's events are numbered, not keyed: shard what reads an edge.
        raise SpecError(f"{where}: instances = {stage.instances} needs input = EDGE "
                        "(a source or an external stage runs as one instance)")  # fmt: skip
    if len(set(stage.outputs)) < len(stage.outputs):
        raise SpecError(f"{where}: output names an edge twice")
    for key, edge in (("input", stage.input), *(("output", o) for o in stage.outputs)):
        if edge is not None and edge not in edges:
            close = difflib.get_close_matches(edge, list(edges), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SpecError(f"{where}: {key}: no [[edge]] named {edge!r}{hint}")
    if stage.input is not None and stage.input in stage.outputs:
        raise SpecError(f"{where}: reads and writes the same edge {stage.input!r}")
