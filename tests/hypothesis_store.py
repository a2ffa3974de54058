"""The committed store of hypothesis failures, ``tests/hypothesis-examples/``.

Hypothesis keeps the failures a run finds in ``.hypothesis/examples/`` (git-ignored) and
replays them first in the next run on the same checkout; a fresh clone (CI) starts
without them, so a failure a developer's random search found once is never run there.
The suite's profile (tests/conftest.py) reads the committed store next to the local one,
read-only: every run, CI's too, replays its examples before generating new ones. A
developer promotes a failure into it with ``./run test PATH --promote-examples``, which
re-runs the failing tests with the store writable: the replayed failure fails again, is
shrunk, and its smallest form is saved here for review (docs: README.md, "Set-up").

Tests whose own settings say ``derandomize=True`` use no database at all (hypothesis
sets it to None): their search is the same in every run, so what fails on a developer's
machine fails in CI too.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from hypothesis import settings
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

STORE = Path(__file__).with_name("hypothesis-examples")

# The keys hypothesis derives from a test's key for examples that only guide a search
# (non-minimal failures, a target's front): they stay local, the store takes failures.
_GUIDES = (b".secondary", b".pareto")


class Promotion(ExampleDatabase):
    """The store, writable for a ``--promote-examples`` run: it takes the failures this
    run saves (each shrink step replaces the last) and never removes an example it held
    before the run (one that passes now is a regression check; dropping it is a commit)."""

    def __init__(self, store: ExampleDatabase) -> None:
        super().__init__()
        self._store = store
        self._saved: set[tuple[bytes, bytes]] = set()

    def fetch(self, key: bytes) -> Iterable[bytes]:
        yield from self._store.fetch(key)

    def save(self, key: bytes, value: bytes) -> None:
        if not key.endswith(_GUIDES):
            self._store.save(key, value)
            self._saved.add((key, value))

    def delete(self, key: bytes, value: bytes) -> None:
        if (key, value) in self._saved:
            self._store.delete(key, value)
            self._saved.discard((key, value))

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.delete(src, value)
        self.save(dest, value)


def database(*, promote: bool = False, store: Path = STORE) -> ExampleDatabase:
    """The suite's example database: the local one (hypothesis' default place) and the
    committed ``store``, read-only unless ``promote``."""
    local = settings.get_profile("default").database  # hypothesis' own, .hypothesis/examples
    assert local is not None
    committed = DirectoryBasedExampleDatabase(store)
    return MultiplexedDatabase(
        local, Promotion(committed) if promote else ReadOnlyDatabase(committed)
    )
