"""``waymark fold`` against a 3-node JetStream cluster with a replicated (R3) bucket.

A writer keeps writing while the node the fold is connected to, then the bucket's
stream leader, are SIGKILLed and started again: the fold ends equal to the bucket
with every written revision in it, and the exporter keeps publishing through each
kill (docs/kv.md, "On a NATS cluster").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.kv.cluster import NatsCluster, wait_for

from waymark.kv import Connection, NatsConnectionConfig, StoreConfig
from waymark.kv.stores.lmdb_store import LmdbStore
from waymark.kv.transport import ObjectStoreTransport
from waymark.objstore import open_store as open_objstore

pytestmark = pytest.mark.timeout(120)

FOLD_CLIENT = "waymark-kv"  # the connection name `waymark fold` gives its NATS client


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("nats-cluster")) as c:
        yield c


class Writer:
    """Writes key k.<i> once each, retrying a write whose ack did not come; keeps every
    acknowledged (key, revision)."""

    def __init__(self, kv_prefix: str, js: object) -> None:
        self.prefix = kv_prefix
        self.js = js
        self.acked: dict[str, int] = {}
        self.stop = asyncio.Event()

    async def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            key = f"k.{i:06}"
            try:
                ack = await self.js.publish(  # type: ignore[attr-defined]
                    self.prefix + key, b"v%d" % i, timeout=2.0
                )
            except Exception:  # a node died under the write: write it again
                await asyncio.sleep(0.05)
                continue
            self.acked[key] = ack.seq
            i += 1


async def test_fold_survives_killing_its_node_and_the_stream_leader(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    bucket, artifacts = "clustered", tmp_path / "artifacts"
    config = NatsConnectionConfig(url=cluster.urls, timeout=10.0, name="writer")
    async with Connection(config) as conn:
        kv = await conn.store(bucket, StoreConfig(max_bytes=None, num_replicas=3))
        writer = Writer(kv.subject_prefix, kv.js)
        writing = asyncio.create_task(writer.run())
        path = tmp_path / "fold"
        fold = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "waymark"),
                "fold",
                "--nats",
                cluster.urls,
                "--bucket",
                bucket,
                "--store",
                f"lmdb:{path}",
                "--batch-max",
                "50",
                "--nats-timeout-s",
                "2",
                "--export-to",
                artifacts.as_uri(),
                "--export-every-s",
                "0.2",
                "--lease-ttl-s",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "fold.log").open("wb"),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        transport = ObjectStoreTransport(open_objstore(artifacts.as_uri()))

        def published() -> int:
            """The fold cursor of the artifact the pointer names."""
            manifest = transport.read_pointer(bucket).manifest
            return manifest.rank if manifest is not None else 0

        async def published_beyond(rank: int) -> int:
            def moved() -> int:
                assert fold.poll() is None, "the fold process died"
                return max(published() - rank, 0)

            try:
                await asyncio.to_thread(wait_for, f"the pointer moving past {rank}", moved, 60)
            except TimeoutError:
                print((tmp_path / "fold.log").read_text()[-6000:])
                raise
            return published()

        try:
            # Past the start-up state-sync listing: the kills hit the live watch.
            await published_beyond(1000)
            # The export lease is as replicated as the bucket: with it on one node, that
            # node's loss would stop every export round.
            lease = await conn.client.jetstream().stream_info(f"KV_{bucket}-export")
            assert lease.config.num_replicas == 3

            victims = []
            for pick in ("fold's node", "stream leader"):
                if pick == "fold's node":
                    node = wait_for("the fold connected", lambda: cluster.connected_to(FOLD_CLIENT))
                else:
                    name = wait_for("a stream leader", lambda: cluster.stream_leader(kv.stream))
                    node = cluster.node(name)
                before = published()
                cluster.kill(node)
                killed = time.monotonic()
                # The exporter keeps publishing with the node down (two of three remain).
                await published_beyond(before)
                victims.append((pick, node.name, round(time.monotonic() - killed, 1)))
                cluster.start_node(node)
                cluster.wait_for_meta_leader()
                await asyncio.to_thread(wait_for, "a stream leader",
                                        lambda: cluster.stream_leader(kv.stream))  # fmt: skip
            writer.stop.set()
            await writing
            # A replica that restarted may lag; a read served by it would be stale.
            await asyncio.to_thread(wait_for, "every replica current",
                                    lambda: cluster.replicas_current(kv.stream))  # fmt: skip
            _, last = await kv.stream_bounds()
            await published_beyond(last - 1)  # the fold and its export reached the head
        finally:
            fold.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                fold.wait(10)
            fold.kill()
            fold.wait()
            writer.stop.set()
            await writing

        bucket_now = {e.key: (e.value, e.version.as_u64()) for e in await kv.reader().scan()}
    store = LmdbStore(path)
    try:
        folded = {e.key: (e.value, e.version.as_u64()) for e in store.range()}
        assert store.cursor.as_u64() == last
    finally:
        store.close()
    assert folded == bucket_now
    # Each key is written once (again only when its ack was lost), so each acknowledged
    # revision is in the fold unless a later write of the same key superseded it: a
    # revision the fold skipped would show as a missing or older key.
    assert all(folded[key][1] >= rev for key, rev in writer.acked.items())
    assert len(writer.acked) > 300
    print("killed (what, node, seconds until the next export):", victims)
