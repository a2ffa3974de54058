"""The asyncio client's types say what a user gets: ``await client.append(...)`` is an
``AppendResponse`` for a type checker, not an awaitable typed as the response."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .aio_stub import STUB, render

USER_CODE = """
from typing import assert_type

from waymark.client import AsyncClient, Client
from waymark.protocol import AppendResponse, Checkpoint, DiffResponse, RecordIn, TopicState


async def user(aclient: AsyncClient, client: Client) -> None:
    assert_type(await aclient.append("t", [RecordIn.of(1)]), AppendResponse)
    assert_type(await aclient.diff("t", 0), DiffResponse)
    assert_type(await aclient.list_topics(), list[TopicState])
    async for event in aclient.watch("t"):
        print(event)
    async for checkpoint in aclient.checkpoints():
        assert_type(checkpoint, Checkpoint)
    async with aclient:
        pass
    assert_type(client.append("t", [RecordIn.of(1)]), AppendResponse)
    assert_type(client.list_topics(), list[TopicState])
"""


def test_the_committed_stub_is_generated_from_the_sources() -> None:
    assert STUB.read_text() == render(), (
        "src/waymark/client/aio.pyi is stale: run .venv/bin/python tests/client/aio_stub.py"
    )


def mypy(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "user.py").write_text(textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-error-summary",
         "--cache-dir", str(tmp_path / ".mypy_cache"), str(tmp_path / "user.py")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_a_type_checker_sees_awaited_calls_as_their_responses(tmp_path: Path) -> None:
    checked = mypy(tmp_path, USER_CODE)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # and it can fail: a sync call on the async client is an awaitable, not the response
    wrong = USER_CODE + "    assert_type(aclient.list_topics(), list[TopicState])\n"
    refused = mypy(tmp_path, wrong)
    assert refused.returncode == 1 and "[assert-type]" in refused.stdout, refused.stdout
