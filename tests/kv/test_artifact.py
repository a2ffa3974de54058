"""Fold artifacts: export with verify-by-reopen, import that trusts nothing, on every backend."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from waymark.kv import ArtifactInvalid, KvUpdate, SnapshotError, WatchCursor, open_store
from waymark.kv.artifact import (
    MANIFEST_NAME,
    ExportInfo,
    ExportManifest,
    content_address,
    read_manifest,
)
from waymark.kv.artifact_import import import_and_open, import_artifact
from waymark.kv.stores import append_log
from waymark.kv.stores.append_log import AppendLogStore, _write_log
from waymark.kv.stores.protocol import SnapshotStore

Factory = Callable[[], SnapshotStore]


def fill(store: SnapshotStore, n: int = 300) -> None:
    store.apply(
        [KvUpdate.put(f"k.{i:04}", b"v%d" % i, i + 1) for i in range(n)], WatchCursor.from_u64(n)
    )
    store.apply([KvUpdate.delete("k.0007", n + 1)], WatchCursor.from_u64(n + 1))


def contents(store: SnapshotStore) -> dict[str, tuple[bytes, bytes]]:
    return {e.key: (e.value, e.version.raw) for e in store.range()}


def spec_for(backend: str, path: Path) -> str:
    return f"{backend}:{path / ('fold.log' if backend == 'append-log' else 'fold')}"


def test_export_then_import_gives_the_same_fold_at_the_same_cursor(
    make_store: Factory, backend: str, tmp_path: Path
) -> None:
    store = make_store()
    fill(store)
    info = ExportInfo(exporter="node-a", exported_at_ms=1234, bucket="b", scope=("k.",))
    manifest = store.export_to(tmp_path / "art", info)
    assert manifest.backend == backend and manifest.format_generation == store.format_generation
    assert manifest.cursor == store.cursor == WatchCursor.from_u64(301)
    assert manifest.rank == 301 and manifest.exporter == "node-a" and manifest.scope == ("k.",)
    assert all(f.path.startswith("data/") and f.size >= 0 for f in manifest.files)
    raw, again = read_manifest(tmp_path / "art")
    assert again == manifest and raw == manifest.encode()
    assert not [n for n in os.listdir(tmp_path) if ".stage-" in n]

    dest = spec_for(backend, tmp_path / "node-b")
    imported = import_artifact(tmp_path / "art", dest, bucket="b", scope=("k.",))
    assert imported == manifest
    copy = open_store(dest)
    assert copy.cursor == store.cursor and contents(copy) == contents(store)
    copy.close()
    store.close()
    assert not [n for n in os.listdir(tmp_path / "node-b") if n.startswith(".")]  # no stage left


def test_import_and_open_hands_over_a_store_that_lives_at_the_destination(
    make_store: Factory, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store the import verified is the one returned (an append log is replayed once,
    not twice), and it is the store at PATH: what it applies and compacts lands there."""
    store = make_store()
    fill(store)
    store.export_to(tmp_path / "art")
    replays = []
    real_replay = append_log.replay_log
    monkeypatch.setattr(
        append_log, "replay_log", lambda data, **kw: replays.append(1) or real_replay(data, **kw)
    )
    dest = spec_for(backend, tmp_path / "node-b")
    manifest, copy = import_and_open(tmp_path / "art", dest)
    assert copy.cursor == manifest.cursor == store.cursor
    assert contents(copy) == contents(store)
    assert len(replays) == (1 if backend == "append-log" else 0)
    copy.apply([KvUpdate.put("k.after", b"x", 302)], WatchCursor.from_u64(302))
    if isinstance(copy, AppendLogStore):
        copy.compact()  # writes beside the placed log and renames onto it
    copy.close()
    assert not [n for n in os.listdir(tmp_path / "node-b") if n.startswith(".")]
    again = open_store(dest)
    assert again.cursor == WatchCursor.from_u64(302) and again.get("k.after") is not None
    assert len(contents(again)) == len(contents(store)) + 1
    again.close()
    store.close()


def test_an_append_log_exports_its_own_bytes_and_a_bootstrap_keeps_them(
    tmp_path: Path,
) -> None:
    """The export is the live log's committed bytes (no re-encoding), superseded records
    and all while they stay within a compaction threshold, and the import's open keeps
    them as they are; once failing compactions let more pile up, the export is the
    compacted fold. Each imports to the same fold."""
    store = AppendLogStore(tmp_path / "live.log", compact_threshold=4096)
    for i in range(0, 200, 50):
        batch = [KvUpdate.put(f"k.{j:04}", b"v%d" % j, j + 1) for j in range(i, i + 50)]
        store.apply(batch, WatchCursor.from_u64(i + 50))
    store.compact()
    store.apply([KvUpdate.put("k.0003", b"again", 201)], WatchCursor.from_u64(201))
    store.apply([KvUpdate.delete("k.0004", 202)], WatchCursor.from_u64(202))
    store.export_to(tmp_path / "copied")
    live = (tmp_path / "live.log").read_bytes()
    assert (tmp_path / "copied/data/fold.log").read_bytes() == live
    _, copy = import_and_open(tmp_path / "copied", f"append-log:{tmp_path / 'b.log'}")
    assert (tmp_path / "b.log").read_bytes() == live  # opened as it is, not rewritten
    assert copy.cursor == store.cursor and contents(copy) == contents(store)
    copy.close()

    blocker = tmp_path / "live.log.compact.tmp"
    blocker.mkdir()  # fault injector: every compaction of the live log fails
    for n in range(203, 263):
        store.apply([KvUpdate.put("k.0005", b"x" * 100, n)], WatchCursor.from_u64(n))
    assert store.compaction_failures and store.bytes_since_compact > 4096
    blocker.rmdir()
    store.export_to(tmp_path / "rewritten")
    rewritten = (tmp_path / "rewritten/data/fold.log").read_bytes()
    assert len(rewritten) < (tmp_path / "live.log").stat().st_size
    _, copy = import_and_open(tmp_path / "rewritten", f"append-log:{tmp_path / 'c.log'}")
    assert copy.cursor == store.cursor and contents(copy) == contents(store)
    copy.close()
    store.close()


def test_manifest_bytes_are_deterministic_and_address_the_artifact() -> None:
    m = ExportManifest(1, "lmdb", 1, "00000000000000ff", (), exporter="n", exported_at_ms=5)
    raw = m.encode()
    assert raw == m.encode() and ExportManifest.decode(raw) == m
    keys = list(json.loads(raw))
    assert keys == sorted(keys) and b" " not in raw
    assert len(content_address(raw)) == 16 and content_address(raw) != content_address(raw + b" ")


class TailLosingCopy(AppendLogStore):
    """Fault injector: an export copy that misses the last batch (a torn copy), which only
    the verify-by-reopen gate can notice."""

    def write_copy(self, data_dir: Path) -> None:
        super().write_copy(data_dir)
        stale = WatchCursor.from_u64(self.cursor.as_u64() - 1).raw
        _write_log(data_dir / "fold.log", dict(self._fold), stale)


def test_export_refuses_a_copy_whose_recovered_cursor_differs(tmp_path: Path) -> None:
    store = TailLosingCopy(tmp_path / "fold.log")
    fill(store, 10)
    with pytest.raises(SnapshotError, match="verification"):
        store.export_to(tmp_path / "art")
    assert sorted(os.listdir(tmp_path)) == ["fold.log"]  # no artifact, no stage
    store.close()


@pytest.fixture
def artifact(make_store: Factory, tmp_path: Path) -> Path:
    store = make_store()
    fill(store, 50)
    store.export_to(tmp_path / "art")
    store.close()
    return tmp_path / "art"


def _rewrite_manifest(artifact: Path, **changes: object) -> None:
    doc = json.loads((artifact / MANIFEST_NAME).read_bytes())
    doc.update(changes)
    (artifact / MANIFEST_NAME).write_text(json.dumps(doc))


def _refused(artifact: Path, spec: str, match: str) -> None:
    dest = Path(spec.partition(":")[2])
    with pytest.raises(ArtifactInvalid, match=match):
        import_artifact(artifact, spec)
    assert not dest.exists()
    if dest.parent.exists():
        assert not [n for n in os.listdir(dest.parent) if n.startswith(f".{dest.name}")]


def test_a_tampered_file_is_refused_and_nothing_is_written(
    artifact: Path, backend: str, tmp_path: Path
) -> None:
    _, m = read_manifest(artifact)
    victim = artifact / max(m.files, key=lambda f: f.size).path
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    _refused(artifact, spec_for(backend, tmp_path / "new"), "BLAKE3")


def test_a_wrong_backend_or_generation_is_refused_before_opening(
    artifact: Path, backend: str, tmp_path: Path
) -> None:
    _, m = read_manifest(artifact)
    for f in m.files:  # garbage that would fail an open: the manifest check must come first
        (artifact / f.path).write_bytes(b"garbage")
    other = "lmdb" if backend != "lmdb" else "rocksdb"
    _refused(artifact, spec_for(other, tmp_path / "new"), f"artifact is a {backend} fold")
    _rewrite_manifest(artifact, format_generation=99)
    _refused(artifact, spec_for(backend, tmp_path / "new"), "format generation 99")


def test_extra_and_missing_files_are_refused(artifact: Path, backend: str, tmp_path: Path) -> None:
    (artifact / "data" / "planted").write_bytes(b"x")
    _refused(artifact, spec_for(backend, tmp_path / "new"), "not in the manifest: data/planted")
    (artifact / "data" / "planted").unlink()
    _, m = read_manifest(artifact)
    (artifact / m.files[0].path).unlink()
    _refused(artifact, spec_for(backend, tmp_path / "new"), "missing")


def test_a_manifest_cursor_the_copy_does_not_recover_is_refused(
    artifact: Path, backend: str, tmp_path: Path
) -> None:
    _rewrite_manifest(artifact, cursor_hex=WatchCursor.from_u64(999).raw.hex())
    _refused(artifact, spec_for(backend, tmp_path / "new"), "recovers cursor 51")


def test_garbage_manifests_are_refused(artifact: Path, backend: str, tmp_path: Path) -> None:
    spec = spec_for(backend, tmp_path / "new")
    for bad, why in [
        (b"{", "not JSON"),
        (b"[]", "does not parse"),
        (json.dumps({"schema_version": 7}).encode(), "does not parse"),
    ]:
        (artifact / MANIFEST_NAME).write_bytes(bad)
        _refused(artifact, spec, why)
    unsafe = {"path": "data/../x", "size": 1, "blake3": "0" * 64}
    doc = {"schema_version": 1, "backend": backend, "format_generation": 1, "cursor_hex": ""}
    (artifact / MANIFEST_NAME).write_text(json.dumps({**doc, "files": [unsafe]}))
    _refused(artifact, spec, "unsafe path")


def test_import_never_replaces_an_existing_store(
    artifact: Path, backend: str, tmp_path: Path
) -> None:
    spec = spec_for(backend, tmp_path / "existing")
    existing = open_store(spec)
    existing.apply([KvUpdate.put("mine", b"keep", 1)], WatchCursor.from_u64(1))
    existing.close()
    with pytest.raises(FileExistsError):
        import_artifact(artifact, spec)
    reopened = open_store(spec)
    assert contents(reopened) == {"mine": (b"keep", WatchCursor.from_u64(1).raw)}
    reopened.close()
