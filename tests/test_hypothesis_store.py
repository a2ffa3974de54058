"""The committed store of hypothesis failures (tests/hypothesis_store.py): a failure a
developer's run found and promoted fails a fresh clone's run (CI's), which never saw it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase
from tests import hypothesis_store

TESTS = Path(__file__).parent

# A property with a bug its plain search misses (one value in 10**9, 30 examples); the
# developer's run (TOY_NEAR set) draws near it, as a run with another seed, a longer
# search or a changed strategy may. The source is the same in both, so is the test's key.
TOY = """
import os
from hypothesis import given, settings, strategies as st

NEAR = st.integers(424_240, 424_244)
WIDE = st.integers(0, 10**9)


@settings(max_examples=30)
@given(NEAR if os.environ.get("TOY_NEAR") else WIDE)
def test_toy(n):
    assert n != 424_242
"""


def checkout(root: Path) -> Path:
    """A checkout with the suite's conftest, its store module and the toy property."""
    (root / "tests").mkdir(parents=True)
    for name in ("conftest.py", "hypothesis_store.py"):
        shutil.copy(TESTS / name, root / "tests" / name)
    (root / "tests" / "test_toy.py").write_text(TOY)
    return root


def pytest(
    root: Path, *args: str, near: bool = False, ci: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(root)}
    if near:
        env["TOY_NEAR"] = "1"
    if ci:  # hypothesis then loads its CI profile first: derandomized, no database
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests/test_toy.py",
         *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def stored(store: Path) -> list[tuple[bytes, bytes]]:
    """The examples in a store, by key (it keeps the keys it holds under this one)."""
    db = DirectoryBasedExampleDatabase(store)
    return sorted((key, value) for key in db.fetch(b".hypothesis-keys") for value in db.fetch(key))


def test_the_suite_replays_the_committed_store_read_only() -> None:
    assert settings().database == hypothesis_store.database()


def test_a_promoted_failure_fails_a_fresh_clone(tmp_path: Path) -> None:
    dev = checkout(tmp_path / "dev")
    store = dev / "tests" / "hypothesis-examples"
    # CI's plain search misses the bug.
    assert pytest(dev, ci=True).returncode == 0
    # The developer's run finds it: saved locally only, nothing promoted unasked.
    found = pytest(dev, near=True)
    assert found.returncode == 1 and "424242 != 424242" in found.stdout, found.stdout
    assert stored(store) == []
    # Promoted by a plain re-run: the failure replays from .hypothesis/ and is stored.
    promoted = pytest(dev, "--promote-examples")
    assert promoted.returncode == 1 and "424242 != 424242" in promoted.stdout, promoted.stdout
    assert len(stored(store)) == 1
    # A fresh clone (no .hypothesis/) fails on it with CI's plain search; the store is
    # only read.
    fresh = tmp_path / "fresh"
    shutil.copytree(dev / "tests", fresh / "tests")
    replayed = pytest(fresh, ci=True)
    assert replayed.returncode == 1 and "424242 != 424242" in replayed.stdout, replayed.stdout
    assert stored(fresh / "tests" / "hypothesis-examples") == stored(store)
