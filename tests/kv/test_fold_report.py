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


@pytest.fixture(scope="module")
def server(
    spawn_module_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> ServerProcess:
    """One waymark server for the module: each test's fold is named by its own bucket."""
    return spawn_module_server(tmp_path_factory.mktemp("reports-server"))


async def test_a_fold_reports_cursor_lag_and_export(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path,
    server: ServerProcess,
) -> None:  # fmt: skip
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


async def test_a_bootstrapping_node_reports_its_restore_and_each_node_its_export_role(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path,
    spawn_server: Callable[..., ServerProcess],
) -> None:  # fmt: skip
    """Node a exports and says so in its reports; node b bootstraps from a's artifact
    with a progress bar, reports where it started from, finds the pointer already at its
    cursor (no round), and reports standing by for a."""
    server = spawn_server(tmp_path / "server")
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k.{i:04}", b"v%d" % i) for i in range(300)])
    _, last = await kv.stream_bounds()
    exports = f"file://{tmp_path / 'exports'}"
    node = ("fold", "--nats", nats_server.url, "--bucket", bucket_name, "--export-to", exports,
            "--export-every-s", "0.1", "--lease-ttl-s", "60", "--report-to", server.url,
            "--report-every-s", "0.2")  # fmt: skip
    a = waymark(*node, "--store", f"lmdb:{tmp_path / 'a'}", "--node-id", "node-a")
    http = Client(server.url)

    def reported(name: str, where: Callable[[FoldStatus], bool]) -> FoldStatus | None:
        try:
            found = [s for s in http.get_fold(bucket_name) if s.node == name]
        except ApiError:
            return None  # not reported yet: 404
        return found[0] if found and where(found[0]) else None

    b = None
    try:
        await until(lambda: reported("node-a", lambda s: s.role == "exporter"
                                     and s.export is not None and s.export.cursor == last),
                    a, "a to report exporting")  # fmt: skip
        status_a = reported("node-a", lambda s: True)
        assert status_a is not None and status_a.restore is None  # it did not bootstrap
        b = waymark(*node, "--store", f"lmdb:{tmp_path / 'b'}", "--node-id", "node-b",
                    "--bootstrap-from", exports, stderr_to=tmp_path / "b.err")  # fmt: skip
        await until(lambda: reported("node-b", lambda s: s.role == "standby"
                                     and s.restore is not None and s.restore.phase == "done"),
                    b, "b to report its bootstrap and standing by")  # fmt: skip
        status_b = reported("node-b", lambda s: True)
        assert status_b is not None and status_b.restore is not None
        pointed = ObjectStoreTransport(open_objstore(exports)).pointed(bucket_name)
        assert pointed is not None
        assert status_b.restore.artifact == pointed[1].rsplit("/", 1)[1].removesuffix(".tar")
        assert status_b.restore.cursor == last and status_b.lease_holder == "node-a"
        size = sum(f.size for f in pointed[0].files)
        assert status_b.restore.done_bytes == status_b.restore.total_bytes == size
        table = CliRunner().invoke(app, ["fold", "reports", server.url, "--fold", bucket_name])
        out = " ".join(table.output.split())
        assert "exporter" in out and "standby" in out, out
    finally:
        for proc in (b, a):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(asyncio.to_thread(proc.wait), 20)
                finally:
                    proc.kill()
        http.close()
    err_b = " ".join((tmp_path / "b.err").read_text().split())
    assert f"bootstrapped from {exports} ({bucket_name}): cursor {last}" in err_b
    assert "download" in err_b and "verify (BLAKE3)" in err_b  # the progress bars
    assert (
        f"export: skipped; the pointer already names cursor {last} (this fold is at {last})"
        in err_b
    )
    assert "export: standing by; node-a holds the lease" in err_b
    assert "holds the lease lease." not in err_b.replace("standing by; node-a holds", "")
