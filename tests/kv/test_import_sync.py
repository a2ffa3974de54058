"""The import writes the staged files to disk while it hashes and opens them (a thread
fsyncs them); what it refuses it still refuses, and nothing it cannot sync stalls it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from waymark.kv import ArtifactInvalid, KvUpdate, WatchCursor, artifact_import
from waymark.kv.artifact import _fsync_files
from waymark.kv.artifact_import import _place, import_artifact
from waymark.kv.stores.append_log import AppendLogStore


@pytest.mark.timeout(30)
def test_a_fifo_in_a_consumed_artifact_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO moved into the stage: opening it to sync must not block on a writer that
    never comes; the file check then refuses it (nothing at the destination)."""
    store = AppendLogStore(tmp_path / "live.log")
    store.apply([KvUpdate.put("k", b"v", 1)], WatchCursor.from_u64(1))
    store.export_to(tmp_path / "art")
    store.close()
    os.mkfifo(tmp_path / "art" / "data" / "pipe")
    with pytest.raises(ArtifactInvalid, match="pipe"):
        import_artifact(
            tmp_path / "art", f"append-log:{tmp_path / 'node' / 'fold.log'}", consume=True
        )
    assert not (tmp_path / "node" / "fold.log").exists()


def test_the_rename_waits_for_the_staged_files_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is renamed into place while the sync of the staged files runs
    (docs/semantics/kv.md §9.3 step 4): the sync is held until a rename happens or a
    deadline passes."""
    store = AppendLogStore(tmp_path / "live.log")
    store.apply([KvUpdate.put("k", b"v", 1)], WatchCursor.from_u64(1))
    store.export_to(tmp_path / "art")
    store.close()
    placed = threading.Event()
    seen: list[bool] = []

    def held_sync(root: Path) -> None:
        seen.append(placed.wait(timeout=0.5))  # True: renamed before the sync ended
        _fsync_files(root)

    def place(staged: Path, dest: Path) -> None:
        placed.set()
        _place(staged, dest)

    monkeypatch.setattr(artifact_import, "_fsync_files", held_sync)
    monkeypatch.setattr(artifact_import, "_place", place)
    import_artifact(tmp_path / "art", f"append-log:{tmp_path / 'node' / 'fold.log'}")
    assert seen == [False] and placed.is_set()
