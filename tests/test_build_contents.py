"""A build takes the package and nothing else (pyproject.toml, ``[tool.hatch.build]``):
the sdist and the wheel built in a checkout that has been used — ``./run``'s
``.tools/`` and ``.venv/``, a tour's ``waymark-data/``, ``__pycache__``, a user's stray
files — hold exactly the tracked files of src/waymark (and, in the sdist, docs/ but
its committed fault report, README.md and pyproject.toml). Before, the sdist packed
``.tools/`` and stray files."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from tests.test_packaging import uv

ROOT = Path(__file__).resolve().parents[1]
# What a used checkout has beside the tracked files.
LITTER = {
    ".tools/bin/uv": "not a package file",
    ".venv/lib/python3.11/site-packages/x.py": "x = 1",
    "waymark-data/wal/shard-0/0.wal": "a user's records",
    "src/waymark/__pycache__/cli.cpython-311.pyc": "bytecode",
    "scratch/notes.md": "notes",
    "stray.txt": "stray",
    ".env": "WAYMARK_TOKEN=secret",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """(sdist, wheel, tracked files) built in a littered copy of the checkout."""
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    tracked = [path for path in tracked if path and (ROOT / path).is_file()]
    checkout = tmp_path_factory.mktemp("checkout")
    for path in tracked:
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, checkout / path)
    for path, text in LITTER.items():
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text(text)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([uv(), "build", "--offline", "--quiet", "--out-dir", str(out)],
                   cwd=checkout, check=True)  # fmt: skip
    [sdist] = out.glob("waymark-*.tar.gz")
    [wheel] = out.glob("waymark-*.whl")
    return sdist, wheel, tracked


def test_the_sdist_holds_the_package_docs_readme_and_pyproject_only(
    built: tuple[Path, Path, list[str]],
) -> None:
    sdist, _, tracked = built
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    files = {n for n in names if not any(other.startswith(n + "/") for other in names)}
    wanted = {
        p
        for p in tracked
        if p.startswith(("src/waymark/", "docs/")) and not p.startswith("docs/faults-30min/")
    }  # report data: the repo's alone
    wanted |= {"README.md", "pyproject.toml", "PKG-INFO", ".gitignore"}
    assert files == wanted, f"extra: {sorted(files - wanted)}, missing: {sorted(wanted - files)}"


def test_the_wheel_holds_the_package_only(built: tuple[Path, Path, list[str]]) -> None:
    _, wheel, tracked = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    package = {n for n in names if not n.startswith("waymark-0.1.0.dist-info/")}
    wanted = {p.removeprefix("src/") for p in tracked if p.startswith("src/waymark/")}
    assert package == wanted, (
        f"extra: {sorted(package - wanted)}, missing: {sorted(wanted - package)}"
    )
