"""The code stays as ``ruff`` wants it: lint rules and formatting (pyproject.toml)."""

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
