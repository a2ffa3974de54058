"""Artifacts on an object store: ``file://`` and S3 (moto's server over HTTP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from obstore.store import LocalStore

from waymark.clock import ManualClock
from waymark.kv import ArtifactInvalid, KvUpdate, NothingPublished, WatchCursor, open_store
from waymark.kv.artifact import ExportInfo, content_address
from waymark.kv.stores.protocol import SnapshotStore
from waymark.kv.transport import ObjectStoreTransport, PublishOutcome, UploadedPayload
from waymark.objstore import (
    ConditionalWriteUnsupported,
    ObjectNotFound,
    ObjectStore,
    ObstoreObjectStore,
)
from waymark.objstore import open_store as open_objstore

pytestmark = pytest.mark.timeout(120)

KEY = "routes"


def exported(
    tmp_path: Path,
    name: str,
    cursor: int,
    *,
    node: str = "a",
    backend: str = "append-log",
    generation: int = 0,
) -> Path:
    """An artifact of a store holding keys 1..cursor, exported at ``cursor``."""
    path = tmp_path / "stores" / name / ("fold.log" if backend == "append-log" else "db")
    store = open_store(f"{backend}:{path}")
    store.apply(
        [KvUpdate.put(f"k.{i:05}", b"value-%d" % i, i) for i in range(1, cursor + 1)],
        WatchCursor.from_u64(cursor),
    )
    art = tmp_path / "artifacts" / name
    store.export_to(art, ExportInfo(exporter=node, generation=generation))
    store.close()
    return art


def state(store: SnapshotStore) -> dict[str, bytes]:
    return {e.key: e.value for e in store.range()}


def age_payloads(transport: ObjectStoreTransport, clock: ManualClock, ms: int) -> None:
    """Move the transport's clock to ``ms`` past the newest payload's or retirement's stamp.

    The stamps are not this clock's: the writing process (file://) or the S3
    server stamps with the wall clock, S3 to the whole second. A clock frozen
    when the test began can be behind them (a second boundary crossed on a
    loaded machine): a payload would then not have aged even with zero grace.
    """
    stamps = [*transport.store.list(f"{KEY}.payloads/"), *transport.store.list(f"{KEY}.retired/")]
    newest = max(m.last_modified_ms for m in stamps)
    clock.set(max(clock.now_ms(), newest + ms))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(time.time_ns() // 1_000_000)  # S3 stamps objects with the wall clock


@pytest.fixture
def objstore(store_url: str, clock: ManualClock) -> ObjectStore:
    return open_objstore(store_url, clock=clock)


@pytest.fixture
def transport(objstore: ObjectStore, clock: ManualClock) -> ObjectStoreTransport:
    return ObjectStoreTransport(objstore, clock=clock)


def test_publish_then_bootstrap_a_new_node(transport: ObjectStoreTransport, tmp_path: Path) -> None:
    art = exported(tmp_path, "a", 40, backend="lmdb")
    manifest, outcome = transport.upload(KEY, art)
    assert outcome is PublishOutcome.Published
    pointer = transport.store.get(f"{KEY}.manifest.json").data
    assert pointer == (art / "MANIFEST.json").read_bytes()  # the pointer IS the manifest
    payload = f"{KEY}.payloads/{content_address(pointer)}.tar"
    assert [m.key for m in transport.store.list(f"{KEY}.payloads/")] == [payload]

    spec = f"lmdb:{tmp_path / 'node-b'}"
    assert transport.bootstrap(KEY, spec) == manifest
    store = open_store(spec)
    assert store.cursor == WatchCursor.from_u64(40) and len(state(store)) == 40
    store.close()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no download left


def test_the_pointer_never_moves_to_an_older_cursor(
    transport: ObjectStoreTransport, tmp_path: Path
) -> None:
    assert transport.upload(KEY, exported(tmp_path, "new", 20))[1] is PublishOutcome.Published
    slow = transport.upload(KEY, exported(tmp_path, "old", 10, node="slow"))
    assert slow[1] is PublishOutcome.SupersededByNewer
    assert transport.read_pointer(KEY).state.rank == 20
    same = transport.upload(KEY, exported(tmp_path, "same", 20, node="b"))  # equal: allowed
    assert same[1] is PublishOutcome.Published
    assert transport.read_pointer(KEY).manifest.exporter == "b"  # type: ignore[union-attr]


def test_a_swap_against_a_stale_read_loses_the_race_and_rereads(
    transport: ObjectStoreTransport, tmp_path: Path
) -> None:
    """Interleaved publishers, step by step: the CAS, not luck, decides (on S3: If-Match)."""
    a = transport.upload_payload(KEY, exported(tmp_path, "a", 30))
    b = transport.upload_payload(KEY, exported(tmp_path, "b", 25, node="b"))
    seen_by_a = transport.read_pointer(KEY)
    seen_by_b = transport.read_pointer(KEY)
    assert transport.try_swap(seen_by_b, b) is PublishOutcome.Published  # create-only wins
    assert transport.try_swap(seen_by_a, a) is None  # create-only refused: re-read
    assert transport.try_swap(transport.read_pointer(KEY), a) is PublishOutcome.Published
    stale_b = transport.read_pointer(KEY)
    c = transport.upload_payload(KEY, exported(tmp_path, "c", 35, node="c"))
    assert transport.swap_pointer(c) is PublishOutcome.Published
    assert transport.try_swap(stale_b, a) is None  # If-Match on a replaced ETag refused
    assert transport.swap_pointer(b) is PublishOutcome.SupersededByNewer
    assert transport.read_pointer(KEY).state.rank == 35


def test_a_corrupt_pointer_is_replaced_not_a_wedge(
    transport: ObjectStoreTransport, tmp_path: Path
) -> None:
    transport.upload(KEY, exported(tmp_path, "a", 50))
    transport.store.put(f"{KEY}.manifest.json", b"{not a manifest")
    observed = transport.read_pointer(KEY)
    assert observed.state.present and observed.state.rank is None
    with pytest.raises(ArtifactInvalid, match="not a valid manifest"):
        transport.download(KEY, tmp_path / "dl")
    assert transport.prune(KEY, grace_ms=0).deleted == []  # nothing is provably older
    assert transport.upload(KEY, exported(tmp_path, "b", 5))[1] is PublishOutcome.Published
    assert transport.read_pointer(KEY).state.rank == 5


def test_a_tampered_payload_is_refused_and_leaves_no_store(
    transport: ObjectStoreTransport, tmp_path: Path
) -> None:
    transport.upload(KEY, exported(tmp_path, "a", 30))
    payload = next(transport.store.list(f"{KEY}.payloads/")).key
    data = bytearray(transport.store.get(payload).data)
    data[-2048] ^= 0x01  # a byte of the fold log, past the manifest
    transport.store.put(payload, bytes(data))
    spec = f"append-log:{tmp_path / 'new' / 'fold.log'}"
    with pytest.raises(ArtifactInvalid, match="BLAKE3"):
        transport.bootstrap(KEY, spec)
    assert not (tmp_path / "new" / "fold.log").exists()
    assert os.listdir(tmp_path / "new") == []


def test_a_tampered_manifest_is_refused(transport: ObjectStoreTransport, tmp_path: Path) -> None:
    transport.upload(KEY, exported(tmp_path, "a", 30))
    pointer = transport.store.get(f"{KEY}.manifest.json").data
    payload = f"{KEY}.payloads/{content_address(pointer)}.tar"
    spec = f"append-log:{tmp_path / 'new' / 'fold.log'}"

    # The pointer edited (a later cursor claimed): it now addresses a payload that does not
    # exist. The prune guard never deletes the pointer's target, so that is not "pruned".
    doc = json.loads(pointer)
    doc["cursor_hex"] = WatchCursor.from_u64(99).raw.hex()
    transport.store.put(f"{KEY}.manifest.json", json.dumps(doc).encode())
    with pytest.raises(ArtifactInvalid, match="does not exist: the pointer was edited"):
        transport.bootstrap(KEY, spec)

    # The payload's embedded manifest edited under the genuine pointer.
    transport.store.put(f"{KEY}.manifest.json", pointer)
    tar = bytearray(transport.store.get(payload).data)
    at = tar.find(b'"cursor_hex":"') + len(b'"cursor_hex":"')
    tar[at : at + 16] = WatchCursor.from_u64(99).raw.hex().encode()
    transport.store.put(payload, bytes(tar))
    with pytest.raises(ArtifactInvalid, match="embedded manifest is not the pointer"):
        transport.bootstrap(KEY, spec)
    assert not (tmp_path / "new" / "fold.log").exists()


CRASH_AFTER_UPLOAD = """
import os, signal, sys
from waymark.kv.transport import ObjectStoreTransport
from waymark.objstore import open_store
transport = ObjectStoreTransport(open_store(sys.argv[1]))
uploaded = transport.upload_payload(sys.argv[2], sys.argv[3])
print(uploaded.payload_key, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # dies between the payload upload and the pointer swap
transport.swap_pointer(uploaded)
"""


def test_a_crash_between_upload_and_swap_leaves_the_old_pointer_valid(
    transport: ObjectStoreTransport, clock: ManualClock, tmp_path: Path
) -> None:
    transport.upload(KEY, exported(tmp_path, "old", 10))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CRASH_AFTER_UPLOAD,
            transport.store.url,
            KEY,
            str(exported(tmp_path, "new", 20)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    orphan = proc.stdout.strip()
    assert orphan in {m.key for m in transport.store.list(f"{KEY}.payloads/")}
    assert transport.read_pointer(KEY).state.rank == 10  # the old pointer, still whole
    spec = f"append-log:{tmp_path / 'node-b' / 'fold.log'}"
    assert transport.bootstrap(KEY, spec).rank == 10

    # The next round publishes past both; the orphan (rank 20) goes only once it is
    # aged out and strictly below the new pointer.
    transport.upload(KEY, exported(tmp_path, "next", 30))
    grace = 60_000
    assert orphan in transport.prune(KEY, grace).kept
    age_payloads(transport, clock, grace)
    report = transport.prune(KEY, grace)
    assert orphan in report.deleted and len(report.deleted) == 2  # and the old one
    assert [m.key for m in transport.store.list(f"{KEY}.payloads/")] == report.kept


def test_prune_spares_the_target_equal_ranks_newer_ranks_and_young_payloads(
    transport: ObjectStoreTransport, clock: ManualClock, tmp_path: Path
) -> None:
    old = transport.upload_payload(KEY, exported(tmp_path, "old", 10))
    transport.swap_pointer(old)
    equal = transport.upload_payload(KEY, exported(tmp_path, "equal", 20, node="x"))
    target = transport.upload_payload(KEY, exported(tmp_path, "target", 20, node="y"))
    transport.swap_pointer(target)
    newer = transport.upload_payload(KEY, exported(tmp_path, "newer", 25))  # still in flight
    transport.store.put(f"{KEY}.payloads/0000000000000000.tar", b"not a tar")  # rank unknown
    assert transport.prune(KEY, grace_ms=3_600_000).deleted == []  # all too young
    age_payloads(transport, clock, 3_600_000)
    report = transport.prune(KEY, grace_ms=3_600_000)
    assert report.deleted == [old.payload_key]
    assert {equal.payload_key, target.payload_key, newer.payload_key} <= set(report.kept)
    # ... so the in-flight newer round still publishes a fetchable payload.
    assert transport.swap_pointer(newer) is PublishOutcome.Published
    manifest, _ = transport.download(KEY, tmp_path / "dl")
    assert manifest.rank == 25


def test_a_store_without_conditional_writes_fails_closed(tmp_path: Path) -> None:
    plain = ObstoreObjectStore(
        LocalStore(str(tmp_path / "o"), mkdir=True),
        (tmp_path / "o").as_uri(),
        conditional_put=False,
        conditional_delete=False,
    )
    art = exported(tmp_path, "a", 5)
    with pytest.raises(ConditionalWriteUnsupported):
        ObjectStoreTransport(plain).upload(KEY, art)
    assert list(plain.list()) == []  # refused before anything was written
    dev = ObjectStoreTransport(plain, allow_non_atomic_pointer=True)
    assert dev.upload(KEY, art)[1] is PublishOutcome.Published
    assert dev.upload(KEY, exported(tmp_path, "b", 3))[1] is PublishOutcome.SupersededByNewer


def test_a_payload_over_one_part_goes_up_in_8_mib_parts(
    transport: ObjectStoreTransport, tmp_path: Path
) -> None:
    store = open_store(f"append-log:{tmp_path / 's' / 'fold.log'}")
    store.apply(
        [KvUpdate.put(f"k{i}", os.urandom(64 * 1024), i + 1) for i in range(150)],  # ~9.4 MiB
        WatchCursor.from_u64(150),
    )
    store.export_to(tmp_path / "art")
    store.close()
    transport.upload(KEY, tmp_path / "art")
    meta = next(transport.store.list(f"{KEY}.payloads/"))
    assert meta.size > 8 * 1024 * 1024
    if transport.store.url.startswith("s3://"):
        assert (meta.etag or "").strip('"').endswith("-2")  # two parts of 8 MiB at most
    spec = f"append-log:{tmp_path / 'b' / 'fold.log'}"
    assert transport.bootstrap(KEY, spec).rank == 150


def test_the_payload_is_a_plain_tar_with_the_manifest_first(
    transport: ObjectStoreTransport, tmp_path: Path
) -> None:
    art = exported(tmp_path, "a", 3, backend="rocksdb")
    transport.upload(KEY, art)
    tar_path = tmp_path / "p.tar"
    tar_path.write_bytes(
        transport.store.get(next(transport.store.list(f"{KEY}.payloads/")).key).data
    )
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
    assert names[0] == "MANIFEST.json" and all(n.startswith("data/") for n in names[1:])
    assert sorted(names[1:]) == names[1:] and len(names) > 3


PUBLISHER = """
import json, sys
from waymark.kv import KvUpdate, WatchCursor, open_store
from waymark.kv.artifact import ExportInfo
from waymark.kv.transport import ObjectStoreTransport
from waymark.objstore import open_store as open_objstore
url, key, workdir, node, ranks = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
transport = ObjectStoreTransport(open_objstore(url))
out = []
for rank in map(int, ranks.split(",")):
    store = open_store(f"append-log:{workdir}/{node}-{rank}.log")
    store.apply([KvUpdate.put("k", b"%d" % rank, rank)], WatchCursor.from_u64(rank))
    store.export_to(f"{workdir}/{node}-{rank}", ExportInfo(exporter=node))
    store.close()
    _, outcome = transport.upload(key, f"{workdir}/{node}-{rank}")
    out.append([rank, outcome.value])
print(json.dumps(out))
"""


def test_concurrent_publishers_never_regress_the_pointer(tmp_path: Path) -> None:
    """Four processes publish interleaved ranks on file:// while the pointer is watched."""
    url = (tmp_path / "objects").as_uri()
    transport = ObjectStoreTransport(open_objstore(url))
    ranks = {f"n{i}": [r for r in range(1, 41) if r % 4 == i] for i in range(4)}
    seen: list[int] = []
    dangling: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            observed = transport.read_pointer(KEY)
            if observed.state.rank is not None:
                seen.append(observed.state.rank)
                target = transport.payload_key(KEY, content_address(observed.body or b""))
                try:
                    transport.store.head(target)
                except ObjectNotFound:
                    dangling.append(target)

    watcher = threading.Thread(target=watch)
    watcher.start()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                PUBLISHER,
                url,
                KEY,
                str(tmp_path),
                node,
                ",".join(map(str, rs)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for node, rs in ranks.items()
    ]
    results = [json.loads(p.communicate(timeout=100)[0]) for p in procs]
    stop.set()
    watcher.join(10)
    assert all(p.returncode == 0 for p in procs)
    assert seen == sorted(seen) and seen, "the pointer moved backwards"
    assert dangling == []
    published = [r for out in results for r, o in out if o == "published"]
    superseded = [r for out in results for r, o in out if o == "superseded-by-newer"]
    assert len(published) + len(superseded) == 40
    # The highest rank usually publishes; losing 1 + 8 races in a row gives up (superseded).
    assert transport.read_pointer(KEY).state.rank == max(published)
    manifest, _ = transport.download(KEY, tmp_path / "dl")
    assert manifest.rank == max(published)


def test_swap_gives_up_as_superseded_after_losing_every_race(
    transport: ObjectStoreTransport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publisher that loses 1 + 8 races in a row returns SupersededByNewer, not an error."""
    transport.upload(KEY, exported(tmp_path, "a", 1))
    up = transport.upload_payload(KEY, exported(tmp_path, "b", 2))
    attempts = []

    def always_lost(observed: object, uploaded: UploadedPayload) -> None:
        attempts.append(1)

    monkeypatch.setattr(transport, "try_swap", always_lost)
    assert transport.swap_pointer(up) is PublishOutcome.SupersededByNewer
    assert len(attempts) == 9


def test_a_pruner_whose_clock_is_behind_the_stamps_keeps_everything(
    objstore: ObjectStore, clock: ManualClock, tmp_path: Path
) -> None:
    """Payload ages come from the store's stamps (S3: the server's clock, to the second),
    not the pruner's clock: one behind them sees no payload aged out, the safe direction
    of a skew (docs/semantics/kv.md §11.4). Once it passes them, zero grace prunes."""
    behind = ObjectStoreTransport(objstore, clock=ManualClock(1_000))
    behind.upload(KEY, exported(tmp_path, "p3", 3))
    behind.upload(KEY, exported(tmp_path, "p10", 10))
    assert behind.prune(KEY, grace_ms=0).deleted == []
    transport = ObjectStoreTransport(objstore, clock=clock)
    age_payloads(transport, clock, 0)
    assert len(transport.prune(KEY, grace_ms=0).deleted) == 1  # p3, below the pointer


def stalled_round_pruned_under_a_corrupt_pointer(
    transport: ObjectStoreTransport, clock: ManualClock, tmp_path: Path
) -> UploadedPayload:
    """A round of rank 5 uploaded and stalled before its swap, its payload pruned under
    the pointer a round of rank 10 published, that pointer then corrupted."""
    slow = transport.upload_payload(KEY, exported(tmp_path, "p5", 5, node="slow"))
    transport.upload(KEY, exported(tmp_path, "p10", 10))
    # Was flaky on S3 (once a second boundary passed after the clock fixture): see age_payloads.
    transport.prune(KEY, grace_ms=3_600_000)  # stamps the retired payloads, deletes none
    age_payloads(transport, clock, 0)
    assert slow.payload_key in transport.prune(KEY, grace_ms=0).deleted  # 5 < 10
    transport.store.put(f"{KEY}.manifest.json", b"garbage")
    return slow


def test_a_corrupt_pointer_is_never_replaced_by_a_pruned_payload(
    transport: ObjectStoreTransport, clock: ManualClock, tmp_path: Path
) -> None:
    """Found by the model: corruption breaks the order prune relies on, so a publisher
    that replaces a corrupt (or vanished) pointer first confirms its payload still exists."""
    transport.upload(KEY, exported(tmp_path, "p3", 3))
    slow = stalled_round_pruned_under_a_corrupt_pointer(transport, clock, tmp_path)
    assert transport.swap_pointer(slow) is PublishOutcome.SupersededByNewer
    assert transport.read_pointer(KEY).body == b"garbage"


def test_a_pointer_restarted_after_corruption_is_never_swapped_to_a_pruned_payload(
    transport: ObjectStoreTransport, clock: ManualClock, tmp_path: Path
) -> None:
    """Found by the model (a saved example): after a corrupt pointer the order starts
    over, so a pointer published over it (rank 3) may rank below a payload a prune under
    the earlier pointer (rank 10) removed; a stalled round of rank 5 passes the guard
    against it and must still find its payload gone."""
    slow = stalled_round_pruned_under_a_corrupt_pointer(transport, clock, tmp_path)
    assert transport.upload(KEY, exported(tmp_path, "p3", 3))[1] is PublishOutcome.Published
    assert transport.swap_pointer(slow) is PublishOutcome.SupersededByNewer
    assert transport.read_pointer(KEY).state.rank == 3


def test_a_recreated_buckets_generation_outranks_the_dead_ones_artifacts(
    transport: ObjectStoreTransport, clock: ManualClock, tmp_path: Path
) -> None:
    """Deleting and recreating the bucket starts its revisions over. Its exporters must
    publish over the dead bucket's pointer (not be superseded by its higher cursor every
    round), and its nodes must never be offered the dead bucket's artifact."""
    dead, live = 1_700_000_000_000_000, 1_700_000_900_000_000  # stream creation times, µs
    transport.upload(KEY, exported(tmp_path, "dead", 1000, generation=dead))
    spec = f"append-log:{tmp_path / 'node' / 'fold.log'}"
    with pytest.raises(NothingPublished, match="deleted and recreated"):
        transport.bootstrap(KEY, spec, generation=live)  # not offered: a replay follows
    assert not (tmp_path / "node" / "fold.log").exists()

    manifest, outcome = transport.upload(KEY, exported(tmp_path, "live", 5, generation=live))
    assert outcome is PublishOutcome.Published and manifest.generation == live
    assert transport.bootstrap(KEY, spec, generation=live).rank == 5
    # A slow exporter of the dead bucket, at a far higher cursor, is the one superseded.
    _, late = transport.upload(KEY, exported(tmp_path, "late", 2000, generation=dead))
    assert late is PublishOutcome.SupersededByNewer
    transport.prune(KEY, grace_ms=3_600_000)  # stamps the dead generation's payloads
    age_payloads(transport, clock, 3_600_000)
    assert len(transport.prune(KEY, grace_ms=3_600_000).deleted) == 2
