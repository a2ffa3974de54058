"""Data written before the engine kernel refactor still opens, unchanged.

The fixtures were captured from the code before journal frames and catalog entries
became typed Structs: ``fixtures/frames_v1.json`` holds the bytes the old encoders
produced for every frame type, ``fixtures/datadir_v1`` a data directory (a catalog
with segments plus a WAL tail, left as by a crash), and ``fixtures/expected_v1.json``
what an engine recovered from it showed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import orjson

from waymark.clock import ManualClock
from waymark.log.storage.recovery import open_engine

FIXTURES = Path(__file__).parent / "fixtures"


def observe(data_dir: Path, work: Path) -> dict[str, Any]:
    """Every topic's state and records, and the routers, of the engine recovered from a
    copy of ``data_dir`` (recovery trims and cleans the directory it opens)."""
    shutil.copytree(data_dir, work)
    engine, store, _ = open_engine(work, clock=ManualClock(1_700_000_100_000))
    if engine.recovering is not None:
        engine.recovering.finish_all()
    states = engine.list_topics()
    seen: dict[str, Any] = {"topics": orjson.loads(msgspec.json.encode(states)), "diffs": {}}
    for state in states:
        seen["diffs"][state.name] = orjson.loads(engine.diff(state.name, 0, limit=10_000).to_json())
    seen["routers"] = orjson.loads(msgspec.json.encode(engine.list_routers()))
    seen["writer_epoch"] = engine.staging.open_writer("w1")
    store.close()
    return seen


def test_a_v1_data_dir_recovers_as_before(tmp_path: Path) -> None:
    expected = json.loads((FIXTURES / "expected_v1.json").read_text())
    assert observe(FIXTURES / "datadir_v1", tmp_path / "data") == expected
