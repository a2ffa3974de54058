"""Fixtures for the data commands: one real server per module, the shipped ``waymark``
command run as a subprocess, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import ServerProcess

WAYMARK = str(Path(sys.executable).parent / "waymark")


def run(
    url: str, *args: str, stdin: bytes | None = None, token: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``waymark ARGS`` against the server at ``url`` (through WAYMARK_URL, as a user's
    shell would set it, and ``token`` as WAYMARK_TOKEN); stdout and stderr captured,
    stdout a pipe."""
    env = {**os.environ, "WAYMARK_URL": url}
    env.pop("WAYMARK_TOKEN", None)
    if token is not None:
        env["WAYMARK_TOKEN"] = token
    return subprocess.run(
        [WAYMARK, *args], input=stdin, capture_output=True, env=env, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, spawn_module_server: Callable[..., ServerProcess]
) -> ServerProcess:
    return spawn_module_server(tmp_path_factory.mktemp("cli-data"))


def said(result: subprocess.CompletedProcess[bytes]) -> str:
    """What a command wrote to stderr as one line of words: rich wraps a usage error's
    message inside a box on the terminal's width."""
    return " ".join(result.stderr.decode().replace("│", " ").split())
