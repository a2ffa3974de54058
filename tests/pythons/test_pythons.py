"""waymark on every Python it supports (README.md, "Install"): for each interpreter the
machine has besides the suite's own, a fresh environment gets waymark built as a wheel
with every extra, from uv.lock, and runs the client, the server and a Spark query on it
(tests/pythons/smoke.py). A supported interpreter the machine lacks fails the test: a
skip would read as a pass."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The suite itself runs on the oldest; these are the others pyproject.toml promises.
OTHERS = ("3.12", "3.13")
SMOKE = Path(__file__).with_name("smoke.py")


def uv() -> str:
    found = ROOT / ".tools" / "bin" / "uv"
    path = str(found) if found.exists() else shutil.which("uv")
    assert path is not None, "uv is not installed (./run installs it into .tools/)"
    return path


def interpreter(version: str) -> str:
    """The machine's Python ``version``: pyenv's, else one on PATH."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))
    path = found[-1] if found else shutil.which(f"python{version}")
    assert path is not None, f"no Python {version} on this machine (pyenv install {version})"
    return path


def smoke(version: str, where: Path) -> dict[str, object]:
    """Install waymark[all] for ``version`` into a venv under ``where``, run the smoke."""
    venv = where / f"venv-{version}"
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run(
        [uv(), "sync", "--quiet", "--frozen", "--no-dev", "--no-editable", "--all-extras",
         "--reinstall-package", "waymark", "--python", interpreter(version)],
        cwd=ROOT, env=env, check=True, timeout=900,
    )  # fmt: skip
    python = venv / "bin" / "python"
    assert f"Python {version}." in subprocess.run([python, "--version"], capture_output=True,
                                                  text=True, check=True).stdout  # fmt: skip
    path = f"{venv / 'bin'}:{env['PATH']}"
    done = subprocess.run([python, str(SMOKE)], capture_output=True, text=True, timeout=600,
                          cwd=where, env={**env, "PATH": path})  # fmt: skip
    assert done.returncode == 0, f"Python {version}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_wheel_runs_the_client_the_server_and_spark_on_every_python(
    tmp_path: Path,
) -> None:
    assert sys.version_info[:2] == (3, 11), "the suite runs on the oldest supported Python"
    with ThreadPoolExecutor(len(OTHERS)) as pool:
        results = list(pool.map(lambda v: smoke(v, tmp_path), OTHERS))
    assert [r["python"].rsplit(".", 1)[0] for r in results] == list(OTHERS)  # type: ignore[union-attr]
    assert all(r["read"] == r["spark"] == 10 for r in results), results
