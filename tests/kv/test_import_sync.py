"""The import writes the staged files to disk while it hashes and opens them (a thread
fsyncs them); what it refuses it still refuses, and nothing it cannot sync stalls it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from waymark.kv import ArtifactInvalid, KvUpdate, WatchCursor
from waymark.kv.artifact import import_artifact
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
