"""``waymark.spark.register`` checks the Python that Spark runs its workers with."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

HERE = Path(__file__).parent


def test_register_fails_at_once_if_the_worker_python_cannot_import_waymark(
    tmp_path: Path,
) -> None:
    """A fresh venv without waymark stands for the system Python: named by
    ``PYSPARK_PYTHON``, or found as ``python3`` on PATH with ``PYSPARK_PYTHON`` unset,
    register() refuses with a message that says what to set; with the venv's Python
    it registers. Real sessions, in a driver process of their own."""
    venv.create(tmp_path / "bare", with_pip=False)
    bare = tmp_path / "bare" / "bin" / "python3"
    done = subprocess.run(
        [sys.executable, str(HERE / "worker_python_driver.py"), str(bare)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Picked up" not in done.stderr  # the class archive's options (tests/jvm_archive.py)
    results = {r["case"]: r for r in map(json.loads, done.stdout.splitlines())}

    named = results["PYSPARK_PYTHON without waymark"]
    assert named["python"] == str(bare)
    assert named["error"].startswith(
        f"Spark's Python workers run '{bare}' (PYSPARK_PYTHON), which cannot import waymark "
        "(ModuleNotFoundError: No module named 'waymark'): set PYSPARK_PYTHON to a Python "
        f"that has waymark, e.g. PYSPARK_PYTHON={sys.executable}"
    )
    default = results["default python3 without waymark"]
    assert default["python"] == "python3"
    assert "run 'python3' (the default: PYSPARK_PYTHON is unset)" in default["error"]
    assert "No module named 'waymark'" in default["error"]
    assert results["PYSPARK_PYTHON is the venv's"]["error"] is None
