"""Each engine invariant has one owner (docs/architecture.md, "The engine kernel").

A topic's state — watermarks, seq ceiling, holes, counts — is written by
``waymark/log/topic.py`` alone: everything else asks a :class:`Topic` method. These
tests read the source with ``ast``; each is shown to catch a planted violation.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "waymark"
TOPIC_MODULE = SRC / "log" / "topic.py"
# Calls that change the container they are called on.
MUTATORS = frozenset({
    "append", "appendleft", "extend", "insert", "remove", "pop", "popleft", "clear",
    "update", "setdefault", "sort", "discard", "add",
})  # fmt: skip
# Writes to an attribute a Topic has too, on objects that are not topics (checked by
# hand): a gradual replay's backlog keeps the config it recovers to, a writer's staged
# part its chunks.
NOT_TOPICS = {"log/gradual.py": {"backlog.config"}, "log/writers.py": {"staged.chunks"}}


def topic_attrs() -> set[str]:
    """The attributes :class:`Topic` assigns on ``self``."""
    for node in ast.walk(ast.parse(TOPIC_MODULE.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "Topic":
            return {
                n.attr for n in ast.walk(node)
                if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                and isinstance(n.value, ast.Name) and n.value.id == "self"
            }  # fmt: skip
    raise AssertionError("no class Topic in topic.py")


def _written(node: ast.AST) -> list[ast.expr]:
    """The expressions ``node`` stores into or mutates in place."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign | ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in MUTATORS):  # fmt: skip
        targets = [node.func.value]
    flat: list[ast.expr] = []
    for target in targets:
        flat.extend(target.elts if isinstance(target, ast.Tuple) else [target])
    out = []
    for target in flat:
        while isinstance(target, ast.Subscript):
            target = target.value
        out.append(target)
    return out


def topic_writes(source: str, attrs: set[str]) -> list[str]:
    """Writes in ``source`` to an attribute a Topic has, on anything but ``self``
    (outside topic.py, ``self`` is never a Topic)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        for target in _written(node):
            if not isinstance(target, ast.Attribute) or target.attr not in attrs:
                continue
            if isinstance(target.value, ast.Name) and target.value.id == "self":
                continue
            hits.append(ast.unparse(target))
    return hits


def test_only_topic_py_writes_a_topics_state() -> None:
    attrs = topic_attrs()
    assert {"next_seq", "ceiling", "durable_ceiling", "holes", "front"} <= attrs
    found = {}
    # Only these packages may import waymark.log (the layers, tests/test_layers.py), so
    # only they can hold a Topic.
    paths = [p for part in ("log", "server", "cli") for p in (SRC / part).rglob("*.py")]
    for path in sorted(paths):
        module = str(path.relative_to(SRC))
        if path != TOPIC_MODULE:
            hits = set(topic_writes(path.read_text(), attrs)) - NOT_TOPICS.get(module, set())
            if hits:
                found[module] = sorted(hits)
    assert found == {}


def test_the_walk_catches_a_planted_write() -> None:
    # The mutants: each line is a write the rule forbids.
    attrs = topic_attrs()
    planted = [
        "topic.next_seq = 5",
        "t.ceiling += 1",
        "engine.kernel.get('a').holes.append(h)",
        "topic.ceiling, topic.lead = 1, 2",
        "topic.config = c",
        "src.chunks[0] = c",
        "del topic.tag_index[k]",
    ]
    for line in planted:
        assert topic_writes(line, attrs), line
    assert not topic_writes("self.next_seq = 1\nn = topic.next_seq\nf(topic.holes)", attrs)


# The parts, the change tracker and gradual replay: the server asks the engine instead
# (tracks_changes, unsynced_change_topics, replay_pending, replay_step, replay_backlog).
ENGINE_PARTS = frozenset({"queues", "routers", "writers", "kernel", "changes", "replaying"})


def reaches_past_the_facade(source: str) -> list[str]:
    """``engine.queues``, ``self.api.engine.kernel`` and the like in ``source``: an
    engine part used past the :class:`Engine` façade."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ENGINE_PARTS:
            base = node.value
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            if name.lstrip("_") == "engine":
                hits.append(ast.unparse(node))
    return hits


def test_the_server_uses_the_engine_through_its_facade() -> None:
    found = {
        str(path.relative_to(SRC)): hits
        for path in sorted((SRC / "server").rglob("*.py"))
        if (hits := reaches_past_the_facade(path.read_text()))
    }
    assert found == {}
    planted = ["self.engine.queues.holds(a)", "engine.kernel", "x = self.api.engine.routers",
               "self._engine.writers.stage()", "self.engine.changes.unsynced_topics()",
               "engine.replaying.step_topic(name)"]  # fmt: skip
    for line in planted:
        assert reaches_past_the_facade(line), line
    assert not reaches_past_the_facade("self.engine.claim(a)\nself.queues.x")


# What composes or rebuilds the whole engine may name it: the engine itself, the
# package's exports, replay (frames in, the whole engine's state out), gradual replay,
# and storage (restore builds the engine, a seal snapshots all of it).
COMPOSITION = frozenset({
    "log/__init__.py", "log/engine.py", "log/replay.py", "log/gradual.py",
    "log/storage/restore.py", "log/storage/store.py", "log/storage/seal.py",
})  # fmt: skip


def imports_engine(source: str) -> list[str]:
    """Imports of the engine module or of ``Engine`` in ``source`` (``TYPE_CHECKING``
    ones too: they are what made queues, routers and writers a cycle with it)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[-1] == "engine" or any(a.name == "Engine" for a in node.names):
                hits.append(ast.unparse(node))
        elif isinstance(node, ast.Import):
            hits += [a.name for a in node.names if a.name == "waymark.log.engine"]
    return hits


def test_the_engines_parts_see_a_topic_log_never_the_engine() -> None:
    found = {}
    for path in sorted((SRC / "log").rglob("*.py")):
        module = str(path.relative_to(SRC))
        if module not in COMPOSITION and (hits := imports_engine(path.read_text())):
            found[module] = hits
    assert found == {}
    planted = ["from .engine import Engine", "from ..engine import SEQ",
               "import waymark.log.engine", "from waymark.log import Engine"]  # fmt: skip
    for line in planted:
        assert imports_engine(line), line
    assert not imports_engine("from .topiclog import TopicLog")
