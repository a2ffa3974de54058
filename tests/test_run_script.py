"""``./run`` asks for Java only where Spark runs (README.md, "Set-up"): on a machine
without Java, ``./run serve`` serves, while ``./run demo`` and ``./run test`` of Spark
tests stop at once with the Java message. The script itself runs, with a PATH that has
every command of this machine but ``java`` and no JAVA_HOME."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.conftest import readable

ROOT = Path(__file__).resolve().parents[1]
JAVA_MESSAGE = b"Java 17 is required for Spark"


@pytest.fixture(scope="module")
def no_java_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a machine without Java: PATH is a directory of links to
    every command on this one's PATH except java (and the rest of the JDK's)."""
    bin_dir = tmp_path_factory.mktemp("no-java-bin")
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            target = os.path.realpath(entry.path)
            if "/jvm/" in target or entry.name.startswith("java"):
                continue
            link = bin_dir / entry.name
            if not link.exists() and os.access(entry.path, os.X_OK):
                link.symlink_to(entry.path)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(bin_dir)
    assert shutil.which("java", path=env["PATH"]) is None
    assert shutil.which("bash", path=env["PATH"]) is not None
    return env


def test_serve_starts_without_java(no_java_env: dict[str, str], tmp_path: Path) -> None:
    server = subprocess.Popen(
        [str(ROOT / "run"), "serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=no_java_env,
    )  # fmt: skip
    assert server.stdout is not None and server.stderr is not None
    try:
        assert readable(server.stdout, 120), server.stderr.read1()  # type: ignore[attr-defined]
        assert server.stdout.readline().startswith(b"waymark listening on ")
    finally:
        server.kill()
        server.wait()
    assert JAVA_MESSAGE not in server.stderr.read()


@pytest.mark.parametrize(
    "args", [["demo", "--help"], ["test", "tests/spark/test_units.py"], ["test"]]
)
def test_spark_commands_still_ask_for_java(no_java_env: dict[str, str], args: list[str]) -> None:
    done = subprocess.run(
        [str(ROOT / "run"), *args], capture_output=True, env=no_java_env, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert JAVA_MESSAGE in done.stderr
