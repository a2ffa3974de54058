"""The layers hold: each package imports only what the table allows.

The contracts are ``[tool.importlinter]`` in pyproject.toml (docs/architecture.md,
"Enforcing the layers"): one ``layers`` contract (the order), one ``protected``
allow-list of importers per package and an ``independence`` contract.
``lint-imports`` checks every import, including those under ``TYPE_CHECKING`` and
inside functions. The table in docs/architecture.md must say what the contracts say,
and no module may import itself back at run time (a cycle).
"""

from __future__ import annotations

import ast
import itertools
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = sorted(
    p.stem for p in (ROOT / "src" / "waymark").iterdir()
    if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")
)  # fmt: skip


def lint_imports(src: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the contracts of pyproject.toml over ``waymark`` as found under ``src``
    (default: the installed one, which is this repository's src/)."""
    env = dict(os.environ)
    if src is not None:
        # PYTHONPATH comes before the editable install's path entry, so grimp reads this copy.
        env["PYTHONPATH"] = str(src)
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_the_layer_contracts_are_kept() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


# Each probe adds one import nobody decided on; the contracts that must turn red.
PROBES = [
    # The client reaching into the engine, even for a type.
    ("client/calls.py", "from waymark.log.errors import TopicError",
     ["layers", "log (the engine) is imported by the server only"],
     "waymark.client.calls -> waymark.log.errors"),
    # The engine reaching up into a client-side package (issue 28: the deny-lists
    # stayed green for this one).
    ("log/kernel.py", "import waymark.recovery",
     ["layers", "recovery is imported by the CLI and the fault campaign's consumer"],
     "waymark.log.kernel -> waymark.recovery"),
    # waymark.recovery is client-side: the engine's types are out of its reach.
    ("recovery/ledger.py", "from waymark.log.changes import Changes",
     ["layers", "log (the engine) is imported by the server only"],
     "waymark.recovery.ledger -> waymark.log.changes"),
    # waymark.pipeline reaches edges through the client only.
    ("pipeline/edge.py", "from waymark.server.app import App",
     ["layers", "server is imported by the CLI only"],
     "waymark.pipeline.edge -> waymark.server.app"),
    # The shipper is the CLI's alone; Spark must not reach it even through a pipeline
    # module it uses (the patient store).
    ("pipeline/patience.py", "from waymark.checkpoint.verdict import Verdict",
     ["checkpoint is imported by the CLI only", "spark and checkpoint are independent"],
     "waymark.pipeline.patience -> waymark.checkpoint.verdict"),
    # objstore has its contract: it sits below the client.
    ("objstore/local.py", "from waymark.client import Client",
     ["layers", "client is imported by the client-side packages"],
     "waymark.objstore.local -> waymark.client"),
    # The client keeps no time of its own (no waymark.clock).
    ("client/sync.py", "from waymark.clock import Clock",
     ["clock is imported by the layers that keep time"], "waymark.client.sync -> waymark.clock"),
]  # fmt: skip


@pytest.mark.parametrize(("module", "line", "broken", "chain"), PROBES, ids=[p[0] for p in PROBES])
def test_an_import_nobody_decided_on_breaks_the_contracts(
    tmp_path: Path, module: str, line: str, broken: list[str], chain: str
) -> None:
    shutil.copytree(ROOT / "src" / "waymark", tmp_path / "waymark")
    path = tmp_path / "waymark" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    for name in broken:
        assert f"{name} BROKEN" in result.stdout, result.stdout
    assert chain in result.stdout


def contract_relation() -> dict[str, set[str]]:
    """Which waymark package the contracts let each import: every other one, less what
    the layers, the independence and the protected (allow-list) contracts forbid."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    short = lambda module: module.removeprefix("waymark.")  # noqa: E731
    allowed = {a: set(PACKAGES) - {a} for a in PACKAGES}
    for contract in config["contracts"]:
        kind = contract["type"]
        if kind == "layers":
            layers = []  # top first
            for layer in contract["layers"]:
                independent = ":" not in layer
                names = [short(m.strip()) for m in re.split(r"[|:]", layer)]
                layers.append((names, independent))
            placed = [name for names, _ in layers for name in names]
            assert sorted(placed) == PACKAGES, "every package has its layer"
            for (i, (above, _)), (j, (below, independent)) in itertools.product(
                enumerate(layers), repeat=2
            ):
                for a, b in itertools.product(below, above):
                    if i < j or (i == j and independent and a != b):
                        allowed[a].discard(b)  # upward, or a sibling
        elif kind == "independence":
            for a, b in itertools.permutations([short(m) for m in contract["modules"]], 2):
                allowed[a].discard(b)
        elif kind == "protected":
            importers = {short(m) for m in contract["allowed_importers"]}
            for protected in contract["protected_modules"]:
                for a in set(PACKAGES) - importers - {short(protected)}:
                    allowed[a].discard(short(protected))
        else:
            pytest.fail(f"a contract of a kind this test does not read: {kind}")
    return allowed


def table() -> dict[str, tuple[set[str], dict[str, set[str]]]]:
    """docs/architecture.md's table: per package, what it may import and, for an entry
    ``pkg (only `a`, `b`)``, the only modules of ``pkg`` it may import."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Enforcing the layers", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[set[str], dict[str, set[str]]]] = {}
    for package, imports in re.findall(r"^\| `waymark\.(\w+)` \| (.+?) \|$", section, re.M):
        if imports == "nothing":
            rows[package] = (set(), {})
        elif imports == "anything":
            rows[package] = (set(PACKAGES) - {package}, {})
        else:
            may: set[str] = set()
            only: dict[str, set[str]] = {}
            for entry in re.split(r",\s*(?![^()]*\))", imports):
                match = re.fullmatch(r"(\w+)(?: \(only (.+)\))?", entry.strip())
                assert match, f"cannot read {entry!r} in the row of waymark.{package}"
                may.add(match[1])
                if match[2]:
                    only[match[1]] = set(re.findall(r"`(\w+)`", match[2]))
            rows[package] = (may, only)
    return rows


def test_the_table_in_the_architecture_page_is_the_contracts() -> None:
    rows = table()
    assert sorted(rows) == PACKAGES
    assert {package: may for package, (may, _) in rows.items()} == contract_relation()


def test_the_only_modules_the_table_names_are_the_only_ones_imported() -> None:
    # Narrower than the contracts: kv and objstore take only the exception root of the
    # protocol, Spark only three modules of the pipeline.
    graph = grimp.build_graph("waymark", cache_dir=None)
    narrowed = [(a, b, only) for a, (_, rows) in table().items() for b, only in rows.items()]
    assert narrowed, "the table narrows some entries"
    for importer, imported, only in narrowed:
        used = {
            module.removeprefix(f"waymark.{imported}.")
            for module in graph.modules
            if module.startswith(f"waymark.{imported}.")
            and any(graph.direct_import_exists(importer=m, imported=module)
                    for m in graph.find_descendants(f"waymark.{importer}"))
        }  # fmt: skip
        assert used <= only, (importer, imported, used - only)


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected sets of two or more
    modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    cycles.append(sorted(members))
    return cycles


def test_no_module_imports_itself_back_at_run_time() -> None:
    # Imports inside functions count (a cycle hidden in one is still a cycle); those
    # under TYPE_CHECKING do not run. The engine's TYPE_CHECKING cycle is issue 28's
    # Engine/Topic item.
    graph = grimp.build_graph("waymark", exclude_type_checking_imports=True, cache_dir=None)
    assert strongly_connected(graph) == []


def test_the_cycle_finder_reports_a_cycle() -> None:
    # The check is live: the kv connection importing the bucket (as it did inside a
    # function) while the bucket's deadline imports the connection is a cycle again.
    graph = grimp.build_graph("waymark", exclude_type_checking_imports=True, cache_dir=None)
    graph.add_import(importer="waymark.kv.deadline", imported="waymark.kv.connection")
    assert any({"waymark.kv.connection", "waymark.kv.deadline"} <= set(cycle)
               for cycle in strongly_connected(graph))  # fmt: skip


def test_spark_does_not_load_checkpoint_at_run_time() -> None:
    # The contracts read import statements; a package's __init__ runs on every import of
    # one of its modules. Spark reaches nothing of checkpoint (its patient store's Backoff
    # is waymark.clock's; docs/architecture.md, "Enforcing the layers").
    probe = (
        "import sys, waymark.spark.edge, waymark.spark.edge_source, waymark.spark.source\n"
        "print(sorted(m for m in sys.modules if m.startswith('waymark.checkpoint')))\n"
        "print(sorted(m for m in sys.modules if m.startswith('waymark.pipeline.')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    checkpoint, pipeline = out.stdout.strip().splitlines()
    assert checkpoint == str([])
    allowed = {"locator", "state", "report", "patience", "placement", "identity", "errors", "fence"}
    assert {m.split(".")[2] for m in ast.literal_eval(pipeline)} <= allowed
