"""``waymark fold --report-to``: a real fold process against a real nats-server reports
its cursor, lag and last export to a real waymark server (docs/reports.md), read back
through the shipped client and ``waymark fold reports``."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.conftest import ServerProcess
from typer.testing import CliRunner

from waymark.cli import app
from waymark.client import ApiError, Client
from waymark.kv import Connection, StoreConfig
from waymark.kv.server import EmbeddedNats
from waymark.kv.transport import ObjectStoreTransport
from waymark.objstore import open_store as open_objstore
from waymark.protocol import FoldStatus

from .test_fold_replicas import bulk_put, until, waymark

pytestmark = pytest.mark.timeout(120)


async def test_a_fold_reports_cursor_lag_and_export(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path,
    spawn_server: Callable[..., ServerProcess],
) -> None:  # fmt: skip
    server = spawn_server(tmp_path / "server")
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k.{i:04}", b"v%d" % i) for i in range(300)])
    exports = f"file://{tmp_path / 'exports'}"
    proc = waymark("fold", "--nats", nats_server.url, "--bucket", bucket_name,
                   "--store", f"lmdb:{tmp_path / 'fold'}", "--node-id", "node-a",
                   "--export-to", exports, "--export-every-s", "0.2",
                   "--report-to", server.url, "--report-every-s", "0.2")  # fmt: skip
    http = Client(server.url)
    try:
        _, last = await kv.stream_bounds()

        def reported(where: Callable[[FoldStatus], bool]) -> FoldStatus | None:
            try:
                [status] = http.get_fold(bucket_name)
            except ApiError:
                return None  # not reported yet: 404
            return status if where(status) else None

        await until(lambda: reported(lambda s: s.cursor == last and s.export is not None),
                    proc, "a report at the bucket's end with an export")  # fmt: skip
        status = reported(lambda s: True)
        assert status is not None
        assert (status.node, status.backend, status.bucket) == ("node-a", "lmdb", bucket_name)
        assert (status.bucket_seq, status.lag, status.stale) == (last, 0, False)
        pointed = ObjectStoreTransport(open_objstore(exports)).pointed(bucket_name)
        assert pointed is not None and status.export is not None
        assert status.export.payload == pointed[1]
        assert status.export.cursor <= status.cursor
        # The fold moves on: so does its report.
        await bulk_put(kv, [(f"k.{i:04}", b"w%d" % i) for i in range(100)])
        _, newer = await kv.stream_bounds()
        await until(lambda: reported(lambda s: s.cursor == newer), proc, "the new cursor")
        result = CliRunner().invoke(app, ["fold", "reports", server.url, "--json"])
        assert result.exit_code == 0, result.output
        [shown] = [f for f in json.loads(result.output)["folds"] if f["fold"] == bucket_name]
        assert (shown["node"], shown["bucket_seq"] >= newer) == ("node-a", True)
        table = CliRunner().invoke(app, ["fold", "reports", server.url, "--fold", bucket_name])
        assert table.exit_code == 0 and "node-a" in table.output and "lmdb" in table.output
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.to_thread(proc.wait), 20)
        finally:
            proc.kill()
            http.close()
