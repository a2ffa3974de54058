"""The docs' examples run: every fenced ``python``, ``sh``, ``bash`` and ``console`` block
of README.md and docs/ is executed against real processes, as a reader pastes it.

One ``waymark serve`` on a free port (and one nats-server for the pages that need it)
serves the whole module; each page runs in a fresh temporary directory (its cwd), its
blocks in order, so a block may use what an earlier one of the same page made. Between
pages every topic and router is dropped. The environment is a reader's shell after
``export WAYMARK_URL=...``: ``waymark`` on PATH, and the docs' default addresses
(``localhost:8080``, ``127.0.0.1:8080``, ``nats://127.0.0.1:4222``) stand for the
servers started here.

A block is not run only when the comment on the line before it says so, with why
(docs/cli.md, "Examples that run"):

- ``<!-- fragment: REASON -->``: an excerpt or a long-running command; REASON names
  what runs it instead (a ``tests/...`` file it names must exist);
- ``<!-- until-interrupted -->``: a command that follows forever (``curl -N``,
  ``--follow``); it runs until its first line of output, then gets SIGINT.

A ``console`` block runs its ``$ `` lines; the other lines show output. A block fails
on a non-zero exit (``sh`` blocks run under ``set -e -o pipefail``) or a traceback.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from tests.conftest import ServerProcess, readable, start_server

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN_LANGS = {"python", "sh", "bash", "console"}
OPEN = re.compile(r"^```(\w+)\s*$")
MARK = re.compile(r"^<!--\s*(fragment|until-interrupted)\s*(?::\s*(.*?))?\s*-->\s*$")
TEST_PATH = re.compile(r"\btests/[\w/.-]+\.py\b")
BLOCK_TIMEOUT_S = 300  # a loaded 2-core machine takes seconds per command


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    mark: str | None  # "fragment", "until-interrupted" or None
    reason: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The runnable-language blocks of ``page``, with the mark on the line before each."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = OPEN.match(lines[i])
        if not m and not lines[i].startswith("```"):
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if m and m.group(1) in RUN_LANGS:
            before = lines[i - 1] if i else ""
            mark = MARK.match(before)
            found.append(
                Block(page, i + 1, m.group(1), "\n".join(lines[i + 1 : end]) + "\n",
                      mark.group(1) if mark else None, (mark.group(2) or "") if mark else "")
            )  # fmt: skip
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]
RUN_PAGES = sorted({b.page for b in ALL if b.mark != "fragment"})


def test_every_fragment_says_why() -> None:
    """A block left out names its reason, and a test it points to exists."""
    bad = []
    for b in ALL:
        if b.mark != "fragment":
            continue
        if len(b.reason) < 10:
            bad.append(f"{b.where}: a fragment without a reason")
        for path in TEST_PATH.findall(b.reason):
            if not (ROOT / path).is_file():
                bad.append(f"{b.where}: {path} does not exist")
    assert not bad, "\n".join(bad)


def test_marks_are_recognised() -> None:
    """A comment that looks like a mark but is misspelt would leave a block unmarked
    silently (and fail elsewhere); this says which."""
    bad = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if re.match(r"^<!--\s*(fragment|until|interrupt)", line) and not MARK.match(line):
                bad.append(f"{page.relative_to(ROOT)}:{n}: {line}")
    assert not bad, "\n".join(bad)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    started = start_server(tmp_path_factory.mktemp("docs-server"))
    yield started
    started.process.kill()
    started.process.wait()


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from waymark.kv.server import EmbeddedNats

    with EmbeddedNats(tmp_path_factory.mktemp("docs-nats")) as nats:
        yield nats.url


def _reset(url: str) -> None:
    """Drop every topic and router a page made, so the next page starts empty."""
    with httpx.Client(base_url=url, timeout=30) as http:
        for router in http.get("/v0/routers").json()["routers"]:
            http.delete(f"/v0/routers/{router['name']}")
        for topic in http.get("/v0/topics").json()["topics"]:
            http.delete(f"/v0/topics/{topic['name']}")


def _substitute(code: str, url: str, nats: str | None) -> str:
    hostport = url.removeprefix("http://")
    code = code.replace("localhost:8080", hostport).replace("127.0.0.1:8080", hostport)
    if nats is not None:
        code = code.replace("nats://127.0.0.1:4222", nats)
    return code


def _command(block: Block, code: str, cwd: Path) -> list[str]:
    if block.lang == "python":
        script = cwd / f"block_{block.line}.py"
        script.write_text(code)
        return [sys.executable, str(script)]
    if block.lang == "console":
        code = "".join(line[2:] + "\n" for line in code.splitlines() if line.startswith("$ "))
    return ["bash", "-e", "-o", "pipefail", "-c", code]


def _run(block: Block, code: str, cwd: Path, env: dict[str, str]) -> str | None:
    """Run one block; None when it passed, else what went wrong."""
    command = _command(block, code, cwd)
    if block.mark == "until-interrupted":
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        assert process.stdout is not None and process.stderr is not None
        try:
            got = readable(process.stdout, BLOCK_TIMEOUT_S) and process.stdout.readline()
            early = process.poll()
        finally:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if not got or early is not None:
            return f"printed {got!r}, exit {early}\n{process.stderr.read()}"
        return None
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
        check=False,
    )  # fmt: skip
    if done.returncode != 0 or "Traceback (most recent call last)" in done.stderr:
        out, err = done.stdout[-3000:], done.stderr[-3000:]
        return f"exit {done.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return None


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(
    page: Path, server: ServerProcess, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    page_blocks = [b for b in blocks(page) if b.mark != "fragment"]
    needs_nats = any("nats://" in b.code for b in page_blocks)
    nats = request.getfixturevalue("nats_url") if needs_nats else None
    _reset(server.url)
    env = {**os.environ, "WAYMARK_URL": server.url, "NO_COLOR": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.pop("WAYMARK_TOKEN", None)
    for block in page_blocks:
        failed = _run(block, _substitute(block.code, server.url, nats), tmp_path, env)
        assert failed is None, f"{block.where} ({block.lang}) failed:\n{block.code}\n{failed}"
