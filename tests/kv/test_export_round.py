"""The export lease and export rounds against a real nats-server, folds and object stores."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from obstore.store import LocalStore
from tests.kv.test_artifact import TailLosingCopy

from waymark.clock import ManualClock
from waymark.kv import (
    ArtifactInvalid,
    ArtifactUnavailable,
    Connection,
    ExportRequest,
    KvStore,
    KvUpdate,
    RevisionMismatch,
    StoreConfig,
    WatchCursor,
    WatchScope,
    open_store,
    watch_applied,
)
from waymark.kv.artifact import ExportInfo, stage_export
from waymark.kv.export import RoundResult, RoundState, export_via, run_export_round
from waymark.kv.lease import ExportLease, LeaseRecord
from waymark.kv.stores.protocol import SnapshotStore
from waymark.kv.transport import ObjectStoreTransport
from waymark.objstore import ObstoreObjectStore
from waymark.objstore import open_store as open_objstore

pytestmark = pytest.mark.timeout(90)

KEY = "fold"
TTL = 30.0


async def bulk_put(kv: KvStore, items: list[tuple[str, bytes]]) -> None:
    for key, value in items:
        await kv.js.publish_async(f"{kv.subject_prefix}{key}", value)
    await kv.js.publish_async_completed()


def lease_for(kv: KvStore, holder: str, clock: ManualClock, ttl: float = TTL) -> ExportLease:
    """The lease lives in its own bucket (``leases``), as with ``waymark fold``: in the
    folded bucket its writes would be folded too."""
    return ExportLease(kv.reader(), kv.writer(), "lease.fold", holder, ttl, clock)


# -- the lease ---------------------------------------------------------------


async def test_lease_create_wins_a_live_lease_is_not_yours_an_expired_one_is_taken(
    conn: Connection, bucket_name: str
) -> None:
    kv = await conn.store(bucket_name)
    clock = ManualClock()
    a, b = lease_for(kv, "a", clock), lease_for(kv, "b", clock)
    guard = await a.try_acquire()
    assert guard is not None and not guard.took_over
    assert await b.try_acquire() is None
    raw = (await kv.reader().get("lease.fold")).value  # type: ignore[union-attr]
    assert json.loads(raw) == {
        "holder_id": "a",
        "acquired_at_unix": clock.now_ms() // 1000,
        "expires_at_unix": clock.now_ms() // 1000 + 30,
        "completed_cursor_hex": None,
        "completed_at_unix": None,
    }
    clock.advance(29_000)
    assert await b.try_acquire() is None
    clock.advance(1_000)  # expiry is in the value, compared by the contender
    stolen = await b.try_acquire()
    assert stolen is not None and stolen.took_over
    with pytest.raises(RevisionMismatch):  # the old holder cannot stamp a round it lost
        await guard.complete(WatchCursor.from_u64(5))
    await stolen.complete(WatchCursor.from_u64(9))
    record = await b.current()
    assert record is not None and record.holder_id == "b"
    assert record.completed_cursor_hex == WatchCursor.from_u64(9).raw.hex()
    assert record.completed_at_unix == clock.now_ms() // 1000


async def test_a_corrupt_lease_is_taken_over_and_abandon_frees_the_round(
    conn: Connection, bucket_name: str
) -> None:
    kv = await conn.store(bucket_name)
    clock = ManualClock()
    await kv.writer().put("lease.fold", b"\x00not json")
    a, b = lease_for(kv, "a", clock), lease_for(kv, "b", clock)
    guard = await a.try_acquire()
    assert guard is not None and guard.took_over  # one bad write cannot wedge the fleet
    assert await b.try_acquire() is None
    await guard.abandon()
    assert await kv.reader().get("lease.fold") is None
    assert await b.try_acquire() is not None  # elected at once, no expiry to wait out
    assert LeaseRecord.parse(b'{"holder_id": 1}') is None


async def test_a_holder_re_acquires_its_own_lease_live_or_lapsed_and_after_a_restart(
    conn: Connection, bucket_name: str
) -> None:
    """The lease names a node, not a process: a holder whose live lease names it renews
    it (its next round, or its restart with the same node id); one whose lease lapsed
    while it was busy, unclaimed, takes it back. Found by the fault campaign: the
    node stood by for itself until its own lease expired (docs/semantics/kv.md §10.1)."""
    kv = await conn.store(bucket_name)
    clock = ManualClock()
    a, b = lease_for(kv, "a", clock), lease_for(kv, "b", clock)
    first = await a.try_acquire()
    assert first is not None
    await first.complete(WatchCursor.from_u64(5))
    clock.advance(10_000)
    again = await a.try_acquire()  # its next round, the lease still live
    assert again is not None and not again.took_over
    record = await a.current()
    assert record is not None and record.holder_id == "a"
    assert record.expires_at_unix == clock.now_ms() // 1000 + 30  # renewed, not extended once
    restarted = lease_for(kv, "a", clock)  # a new process with the same --node-id
    clock.advance(10_000)
    assert await restarted.try_acquire() is not None
    with pytest.raises(RevisionMismatch):  # the renewal fences the older guard
        await again.complete(WatchCursor.from_u64(6))
    assert await b.try_acquire() is None  # still live for everyone else
    clock.advance(45_000)  # lapsed while it was busy; nobody took it
    lapsed = await a.try_acquire()
    assert lapsed is not None
    assert await b.try_acquire() is None


# -- rounds ------------------------------------------------------------------


@dataclass
class Node:
    """A folding node: watch_applied into its store, with an export request queue."""

    store: SnapshotStore
    requests: asyncio.Queue[ExportRequest]
    task: asyncio.Task[WatchCursor]
    stop: asyncio.Event
    deliveries: list[KvUpdate]

    async def reach(self, target: int) -> None:
        while self.store.cursor.as_u64() < target:
            if self.task.done():
                self.task.result()
                raise AssertionError("watch_applied ended early")
            await asyncio.sleep(0.01)

    async def shutdown(self) -> WatchCursor:
        self.stop.set()
        cursor = await asyncio.wait_for(self.task, 10)
        self.store.close()
        return cursor


@pytest.fixture
async def nodes() -> AsyncIterator[list[Node]]:
    started: list[Node] = []
    yield started
    for n in started:
        if not n.task.done():
            await n.shutdown()


async def start_node(kv: KvStore, spec: str, nodes: list[Node], *, with_store: bool = True) -> Node:
    store = open_store(spec)
    deliveries: list[KvUpdate] = []

    def parse(u: KvUpdate) -> KvUpdate:
        deliveries.append(u)
        return u

    requests: asyncio.Queue[ExportRequest] = asyncio.Queue()
    stop = asyncio.Event()
    task = asyncio.create_task(
        watch_applied(
            kv.watcher(),
            WatchScope.all(),
            lambda batch: None,  # parse runs only for an apply
            parse=parse,
            store=store if with_store else None,
            resume=store.cursor,
            reader=kv.reader(),
            export_requests=requests,
            shutdown=stop,
        )
    )
    node = Node(store, requests, task, stop, deliveries)
    nodes.append(node)
    return node


async def test_a_round_publishes_completes_and_leaves_nothing_local(
    conn: Connection, bucket_name: str, tmp_path: Path, nodes: list[Node]
) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    leases = await conn.store(f"{bucket_name}-leases")
    await bulk_put(kv, [(f"k.{i}", b"v") for i in range(200)])
    clock = ManualClock()
    a = await start_node(kv, f"lmdb:{tmp_path / 'a'}", nodes)
    await a.reach(200)
    transport = ObjectStoreTransport(open_objstore((tmp_path / "objects").as_uri()), clock=clock)
    lease = lease_for(leases, "a", clock)
    export = export_via(a.requests, lambda: ExportInfo("a", clock.now_ms(), bucket_name))
    work = tmp_path / "work"

    report = await run_export_round(
        lease=lease, export=export, transport=transport, key=KEY, workdir=work
    )
    assert report.result is RoundResult.Published, report.error
    assert report.states == [
        RoundState.Idle,
        RoundState.Acquiring,
        RoundState.Exporting,
        RoundState.Uploading,
        RoundState.Completing,
        RoundState.Idle,
    ]
    assert report.manifest is not None and report.manifest.rank == 200
    assert transport.read_pointer(KEY).state.rank == 200
    record = await lease.current()
    assert record is not None and record.completed_cursor_hex == a.store.cursor.raw.hex()
    assert os.listdir(work) == []  # the local artifact is always deleted

    # The lease is live after a completed round: the next trigger anywhere is not its turn.
    b_lease = lease_for(leases, "b", clock)
    again = await run_export_round(
        lease=b_lease, export=export, transport=transport, key=KEY, workdir=work
    )
    assert again.result is RoundResult.NotYours
    assert again.states == [RoundState.Idle, RoundState.Acquiring, RoundState.Idle]


async def test_a_superseded_or_failed_round_abandons_the_lease(
    conn: Connection, bucket_name: str, tmp_path: Path, nodes: list[Node]
) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    leases = await conn.store(f"{bucket_name}-leases")
    await bulk_put(kv, [(f"k.{i}", b"v") for i in range(50)])
    clock = ManualClock()
    await bulk_put(kv, [(f"k.{i}", b"w") for i in range(50)])
    ahead = await start_node(kv, f"append-log:{tmp_path / 'ahead.log'}", nodes)
    await ahead.reach(100)
    transport = ObjectStoreTransport(open_objstore((tmp_path / "objects").as_uri()), clock=clock)
    work = tmp_path / "work"
    published = await run_export_round(
        lease=lease_for(leases, "ahead", clock),
        export=export_via(ahead.requests),
        transport=transport,
        key=KEY,
        workdir=work,
    )
    assert published.result is RoundResult.Published

    # A node that fell behind (its fold at 50) wins a later lease, exports an older cursor.
    clock.advance(int(TTL * 1000))
    slow_store = open_store(f"append-log:{tmp_path / 'behind.log'}")
    slow_store.apply([KvUpdate.put("k.0", b"v", 50)], WatchCursor.from_u64(50))

    async def export_frozen(dest: Path) -> Any:
        return await asyncio.to_thread(stage_export, slow_store, dest)

    lease = lease_for(leases, "behind", clock)
    superseded = await run_export_round(
        lease=lease, export=export_frozen, transport=transport, key=KEY, workdir=work
    )
    assert superseded.result is RoundResult.SupersededByNewer
    assert superseded.states[-3:] == [RoundState.Uploading, RoundState.Abandoning, RoundState.Idle]
    assert await lease.current() is None  # abandoned: the next trigger elects at once
    assert transport.read_pointer(KEY).state.rank == 100
    slow_store.close()

    # An upload that fails (a store without conditional writes fails closed) abandons too.
    no_cas = ObjectStoreTransport(
        ObstoreObjectStore(
            LocalStore(str(tmp_path / "plain"), mkdir=True),
            "file:///plain",
            conditional_put=False,
            conditional_delete=False,
        )
    )
    failed = await run_export_round(
        lease=lease, export=export_via(ahead.requests), transport=no_cas, key=KEY, workdir=work
    )
    assert failed.result is RoundResult.Failed and "fails closed" in str(failed.error)
    assert failed.states[-3:] == [RoundState.Uploading, RoundState.Abandoning, RoundState.Idle]
    assert await lease.current() is None

    # So does an export that fails: here watch_applied refuses it (no fold store wired).
    storeless = await start_node(kv, f"append-log:{tmp_path / 'x.log'}", nodes, with_store=False)
    no_export = await run_export_round(
        lease=lease, export=export_via(storeless.requests), transport=transport, key=KEY,
        workdir=work,
    )  # fmt: skip
    assert no_export.result is RoundResult.Failed and "export refused" in str(no_export.error)
    assert no_export.states[-3:] == [RoundState.Exporting, RoundState.Abandoning, RoundState.Idle]
    assert await lease.current() is None
    assert os.listdir(work) == []


async def test_a_copy_that_fails_verification_fails_the_round_and_publishes_nothing(
    conn: Connection, bucket_name: str, tmp_path: Path
) -> None:
    """The verify runs while the payload goes up (Uploading); its failure abandons the
    lease and leaves the pointer where it was, with the payload an orphan."""
    leases = await conn.store(f"{bucket_name}-leases")
    clock = ManualClock()
    transport = ObjectStoreTransport(open_objstore((tmp_path / "objects").as_uri()), clock=clock)
    torn = TailLosingCopy(tmp_path / "torn.log")
    torn.apply([KvUpdate.put(f"k.{i}", b"v", i + 1) for i in range(20)], WatchCursor.from_u64(20))

    async def export_torn(dest: Path) -> Any:
        return await asyncio.to_thread(stage_export, torn, dest)

    lease = lease_for(leases, "a", clock)
    work = tmp_path / "work"
    report = await run_export_round(
        lease=lease, export=export_torn, transport=transport, key=KEY, workdir=work
    )
    assert report.result is RoundResult.Failed and "verification" in str(report.error)
    assert report.states[-3:] == [RoundState.Uploading, RoundState.Abandoning, RoundState.Idle]
    assert await lease.current() is None
    assert not transport.read_pointer(KEY).state.present
    assert os.listdir(work) == []
    torn.close()


async def test_a_round_whose_lease_was_taken_over_meanwhile_still_publishes(
    conn: Connection, bucket_name: str, tmp_path: Path, nodes: list[Node]
) -> None:
    """A failed complete is not fatal: the lease is dedup, the pointer is the gate."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    leases = await conn.store(f"{bucket_name}-leases")
    await bulk_put(kv, [(f"k.{i}", b"v") for i in range(20)])
    clock = ManualClock()
    a = await start_node(kv, f"lmdb:{tmp_path / 'a'}", nodes)
    await a.reach(20)
    transport = ObjectStoreTransport(open_objstore((tmp_path / "objects").as_uri()), clock=clock)
    thief = lease_for(leases, "thief", clock)
    stolen: list[object] = []

    async def export_outliving_its_lease(dest: Path) -> Any:
        manifest = await export_via(a.requests)(dest)
        clock.advance(int(TTL * 1000))  # the export took longer than the TTL ...
        stolen.append(await thief.try_acquire())  # ... and another node took the lease over
        return manifest

    lease = lease_for(leases, "a", clock)
    report = await run_export_round(
        lease=lease,
        export=export_outliving_its_lease,
        transport=transport,
        key=KEY,
        workdir=tmp_path / "work",
    )
    assert stolen[0] is not None
    assert report.result is RoundResult.Published and report.states[-2] is RoundState.Completing
    record = await lease.current()
    assert record is not None and record.holder_id == "thief"  # complete lost its CAS
    assert transport.read_pointer(KEY).state.rank == 20


async def test_two_nodes_a_bootstrapped_node_fetches_only_the_tail(
    conn: Connection, bucket_name: str, tmp_path: Path, nodes: list[Node], store_url: str
) -> None:
    """Delta-only resume, by delivery count: a full replay would converge just as well."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    leases = await conn.store(f"{bucket_name}-leases")
    await bulk_put(kv, [(f"k.{i:04}", b"v%d" % i) for i in range(600)])
    await bulk_put(kv, [(f"k.{i:04}", b"" if i % 3 else b"w") for i in range(0, 600, 7)])
    for i in range(0, 600, 11):
        await kv.writer().delete(f"k.{i:04}")
    _, exported_at = await kv.stream_bounds()
    clock = ManualClock()
    a = await start_node(kv, f"rocksdb:{tmp_path / 'a'}", nodes)
    await a.reach(exported_at)
    transport = ObjectStoreTransport(open_objstore(store_url, clock=clock), clock=clock)
    report = await run_export_round(
        lease=lease_for(leases, "a", clock),
        export=export_via(a.requests),
        transport=transport,
        key=KEY,
        workdir=tmp_path / "work",
    )
    assert report.result is RoundResult.Published and report.manifest is not None
    assert report.manifest.rank == exported_at

    tail = [(f"k.{i:04}", b"tail") for i in range(0, 600, 13)] + [("new.key", b"n")]
    await bulk_put(kv, tail)
    await kv.writer().delete("k.0001")
    _, last = await kv.stream_bounds()

    spec = f"rocksdb:{tmp_path / 'b'}"
    assert transport.bootstrap(KEY, spec, bucket=None, scope=()).rank == exported_at
    b = await start_node(kv, spec, nodes)
    await b.reach(last)
    assert len(b.deliveries) == len(tail) + 1 == last - exported_at
    assert all((u.revision or 0) > exported_at for u in b.deliveries)
    await a.reach(last)
    assert {e.key: e.value for e in b.store.range()} == {e.key: e.value for e in a.store.range()}
    assert {e.key: e.value for e in b.store.range()} == {
        e.key: e.value for e in await kv.reader().scan()
    }


def test_an_export_request_is_built_outside_a_running_loop() -> None:
    """It used to raise RuntimeError: no running event loop."""
    request = ExportRequest(lambda store, cursor: cursor)

    async def answered() -> object:
        request.reply.set_result("ok")
        return await request.reply

    assert asyncio.run(answered()) == "ok"


async def test_an_export_round_after_the_fold_stopped_fails_instead_of_hanging(
    conn: Connection, bucket_name: str, tmp_path: Path
) -> None:
    kv = await conn.store(bucket_name)
    leases = await conn.store(f"{bucket_name}-export")
    last = (await kv.writer().put("k", b"v")).as_u64()
    store = open_store(f"append-log:{tmp_path / 'fold.log'}")
    requests: asyncio.Queue[ExportRequest] = asyncio.Queue()
    stop = asyncio.Event()

    def caught_up(cursor: WatchCursor) -> None:
        if cursor.as_u64() >= last:
            stop.set()

    await asyncio.wait_for(
        watch_applied(kv.watcher(), WatchScope.all(), store=store, export_requests=requests,
                      on_applied=caught_up, shutdown=stop),
        10,
    )  # fmt: skip
    transport = ObjectStoreTransport(open_objstore((tmp_path / "objects").as_uri()))
    report = await asyncio.wait_for(
        run_export_round(
            lease=lease_for(leases, "a", ManualClock()),
            export=export_via(requests),
            transport=transport,
            key=KEY,
            workdir=tmp_path / "work",
        ),
        10,
    )
    assert report.result is RoundResult.Failed and "fold stopped" in str(report.error)
    assert await leases.reader().get("lease.fold") is None  # abandoned: the next node may go
    store.close()


def artifact_id(manifest_key: str) -> str:
    return manifest_key.rsplit("/", 1)[1].removesuffix(".tar")


async def test_keep_n_spares_the_newest_artifacts_and_restore_fetches_any_of_them(
    conn: Connection, bucket_name: str, tmp_path: Path, nodes: list[Node], store_url: str
) -> None:
    """``keep=2`` over four rounds: the newest two are never retired, the others are, and
    pruned once aged. ``restore_open`` by id restores a kept older
    one exactly as the fold was at its cursor, reports its progress, and refuses a
    pruned id, another bucket generation and a tampered payload, writing nothing."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    leases = await conn.store(f"{bucket_name}-leases")
    clock = ManualClock(time.time_ns() // 1_000_000)  # S3 stamps with the wall clock
    transport = ObjectStoreTransport(open_objstore(store_url, clock=clock), clock=clock)
    a = await start_node(kv, f"lmdb:{tmp_path / 'a'}", nodes)
    lease = lease_for(leases, "a", clock, ttl=1.0)
    generation = await kv.generation()
    export = export_via(a.requests, lambda: ExportInfo("a", clock.now_ms(), bucket_name, (),
                                                       generation))  # fmt: skip
    ids, states = [], []
    for r in range(4):
        await bulk_put(kv, [(f"k.{i:03}", b"round-%d" % r) for i in range(r * 10, r * 10 + 50)])
        _, last = await kv.stream_bounds()
        await a.reach(last)
        report = await run_export_round(lease=lease, export=export, transport=transport,
                                        key=KEY, workdir=tmp_path / "work", keep=2)  # fmt: skip
        assert report.result is RoundResult.Published, report.error
        ids.append(artifact_id(transport.pointed(KEY)[1]))  # type: ignore[index]
        states.append({e.key: e.value for e in a.store.range()})
        clock.advance(1_100)  # past the lease
    retired = {m.key.rsplit("/", 1)[1].removesuffix(".tar")
               for m in transport.store.list(f"{KEY}.retired/")}  # fmt: skip
    assert ids[1] in retired and not retired & set(ids[2:])  # the newest two never retired
    # However long it waits, a kept artifact is never pruned; the others go.
    clock.advance(3_600_000)
    transport.prune(KEY, 0, keep=2)
    assert {artifact_id(m.key) for m in transport.store.list(f"{KEY}.payloads/")} == set(ids[2:])

    steps: list[tuple[str, int, int]] = []
    spec = f"lmdb:{tmp_path / 'restored'}"
    manifest, store = transport.restore_open(
        KEY, ids[2], spec, generation=generation, bucket=bucket_name, scope=(),
        progress=lambda phase, done, total: steps.append((phase, done, total)),
    )  # fmt: skip
    assert {e.key: e.value for e in store.range()} == states[2] != states[3]
    assert store.cursor == manifest.cursor
    store.close()
    size = transport.store.head(f"{KEY}.payloads/{ids[2]}.tar").size
    phases = [p for p, _, _ in steps]
    assert phases == sorted(phases, key=["download", "verify", "open", "done"].index)
    assert ("download", size, size) in steps and steps[-1][0] == "done"
    assert (
        "verify",
        sum(f.size for f in manifest.files),
        sum(f.size for f in manifest.files),
    ) in steps

    for bad, refused in [(ids[0], "unknown, or pruned"), ("0" * 16, "unknown, or pruned"),
                         ("nothex", "is not an artifact id")]:  # fmt: skip
        with pytest.raises(ArtifactUnavailable, match=refused):
            transport.restore_open(KEY, bad, f"lmdb:{tmp_path / 'no'}", generation=generation)
    with pytest.raises(ArtifactUnavailable, match="generation"):
        transport.restore_open(KEY, ids[2], f"lmdb:{tmp_path / 'no'}", generation=generation + 1)
    payload = f"{KEY}.payloads/{ids[3]}.tar"
    data = bytearray(transport.store.get(payload).data)
    data[-3000] ^= 0xFF  # inside data.mdb
    transport.store.put(payload, bytes(data))
    with pytest.raises(ArtifactInvalid, match="BLAKE3"):
        transport.restore_open(KEY, ids[3], f"lmdb:{tmp_path / 'no'}", generation=generation)
    assert not (tmp_path / "no").exists()


async def test_a_round_whose_cursor_the_pointer_already_names_is_skipped(
    conn: Connection, bucket_name: str, tmp_path: Path, nodes: list[Node]
) -> None:
    """``fold_at``: a node at the pointer's cursor (it restarted, or bootstrapped from
    it), or behind it, neither contends for the lease nor uploads a copy of the same
    state; one past it runs its round."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    leases = await conn.store(f"{bucket_name}-leases")
    await bulk_put(kv, [(f"k.{i}", b"v") for i in range(50)])
    clock = ManualClock()
    a = await start_node(kv, f"lmdb:{tmp_path / 'a'}", nodes)
    await a.reach(50)
    transport = ObjectStoreTransport(open_objstore((tmp_path / "objects").as_uri()), clock=clock)
    generation = await kv.generation()
    lease = lease_for(leases, "a", clock)
    export = export_via(a.requests, lambda: ExportInfo("a", clock.now_ms(), bucket_name, (),
                                                       generation))  # fmt: skip

    async def round_at(cursor: int) -> Any:
        return await run_export_round(lease=lease, export=export, transport=transport, key=KEY,
                                      workdir=tmp_path / "work",
                                      fold_at=(generation << 64) | cursor)  # fmt: skip

    assert (await round_at(50)).result is RoundResult.Published
    clock.advance(int(TTL * 1000) + 1000)  # the lease expired: the next round could take it
    held = await leases.reader().entry("lease.fold")
    for cursor in (50, 49):
        skipped = await round_at(cursor)
        assert skipped.result is RoundResult.AlreadyPublished
        assert skipped.states == [RoundState.Idle, RoundState.Idle]
        assert skipped.manifest is not None and skipped.manifest.rank == 50
    assert len(list(transport.store.list(f"{KEY}.payloads/"))) == 1  # no second copy
    assert await leases.reader().entry("lease.fold") == held  # not contended for
    await bulk_put(kv, [("k.more", b"w")])
    await a.reach(51)
    assert (await round_at(51)).result is RoundResult.Published
