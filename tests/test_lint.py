"""The code stays as ``ruff`` and ``mypy`` want it: lint rules, formatting and types
(pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).parent / "ruff"


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=" ".join)
def test_ruff_is_clean(args: list[str]) -> None:
    done = subprocess.run([str(RUFF), *args, "src", "tests", "bench"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def mypy(cache: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    """``mypy`` with the project's configuration and a fresh cache (a clean clone has none)."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), *targets],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_mypy_is_clean(tmp_path: Path) -> None:
    done = mypy(tmp_path / "cache", "src/waymark")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout


def test_mypy_check_catches_a_type_error(tmp_path: Path) -> None:
    """The check above can fail: the same call reports a wrong annotation."""
    bad = tmp_path / "bad.py"
    bad.write_text("def seq() -> int:\n    return 'one'\n")
    done = mypy(tmp_path / "cache", str(bad))
    assert done.returncode == 1
    assert "Incompatible return value type" in done.stdout
