"""The conditional-write object store on ``file://`` and on S3 (moto's server over HTTP)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import obstore
import pytest
from obstore.exceptions import AlreadyExistsError, PreconditionError
from obstore.store import LocalStore, S3Store
from tests.objstore.s3 import MotoS3

from waymark.clock import ManualClock
from waymark.objstore import (
    CREATE,
    ConditionalWriteUnsupported,
    IfMatch,
    InvalidKey,
    LocalObjectStore,
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
    ObjectVersion,
    ObstoreObjectStore,
    PreconditionFailed,
    open_store,
)

pytestmark = pytest.mark.timeout(120)

Factory = Callable[[], ObjectStore]


def test_moto_honours_if_none_match_and_if_match(s3_url: str) -> None:
    """Probe of the S3 server itself, through obstore alone: the CAS tests below rest on it."""
    s3 = S3Store.from_url(s3_url)
    first = obstore.put(s3, "probe", b"1", mode="create")
    with pytest.raises(AlreadyExistsError):  # If-None-Match: * refused with 412
        obstore.put(s3, "probe", b"2", mode="create")
    second = obstore.put(s3, "probe", b"2", mode={"e_tag": first["e_tag"]})
    with pytest.raises(PreconditionError):  # If-Match on a stale ETag refused with 412
        obstore.put(s3, "probe", b"3", mode={"e_tag": first["e_tag"]})
    assert bytes(obstore.get(s3, "probe").bytes()) == b"2"
    # If-Match on DELETE (obstore has no conditional delete: the store presigns one).
    store = open_store(s3_url)
    with pytest.raises(PreconditionFailed):
        store.delete("probe", if_match=ObjectVersion(first["e_tag"]))
    assert store.get("probe").data == b"2"
    store.delete("probe", if_match=ObjectVersion(second["e_tag"]))
    with pytest.raises(ObjectNotFound):
        store.head("probe")


def test_put_get_head_agree_on_the_version(make_objstore: Factory) -> None:
    store = make_objstore()
    v = store.put("a/b.json", b"hello")
    got = store.get("a/b.json")
    assert got.data == b"hello" and got.meta.etag == v.etag == store.head("a/b.json").etag
    assert got.meta.size == 5 and got.meta.key == "a/b.json"
    assert store.get_range("a/b.json", 1, 4) == b"ell"


def test_create_only_put_refuses_an_existing_object(make_objstore: Factory) -> None:
    store = make_objstore()
    store.put("k", b"first", mode=CREATE)
    with pytest.raises(ObjectExists):
        store.put("k", b"second", mode=CREATE)
    assert store.get("k").data == b"first"


def test_if_match_put_swaps_only_the_version_read(make_objstore: Factory) -> None:
    store = make_objstore()
    with pytest.raises(PreconditionFailed):  # nothing there to match
        store.put("k", b"x", mode=IfMatch(ObjectVersion("nope")))
    v1 = store.put("k", b"one", mode=CREATE)
    v2 = store.put("k", b"two", mode=IfMatch(v1))
    assert v2.etag != v1.etag
    with pytest.raises(PreconditionFailed):
        store.put("k", b"three", mode=IfMatch(v1))
    assert store.get("k").data == b"two"


def test_if_match_delete_deletes_only_the_version_read(make_objstore: Factory) -> None:
    store = make_objstore()
    v1 = store.put("k", b"one")
    v2 = store.put("k", b"two", mode=IfMatch(v1))
    with pytest.raises(PreconditionFailed):
        store.delete("k", if_match=v1)
    store.delete("k", if_match=v2)
    with pytest.raises(ObjectNotFound):
        store.get("k")
    with pytest.raises(PreconditionFailed):
        store.delete("k", if_match=v2)
    store.delete("k")  # without a condition deleting nothing is fine


def test_missing_objects_raise_object_not_found(make_objstore: Factory) -> None:
    store = make_objstore()
    for call in (store.get, store.head, store.stream):
        with pytest.raises(ObjectNotFound):
            call("nothing/here")


def test_list_matches_the_prefix_as_a_string_in_key_order(make_objstore: Factory) -> None:
    store = make_objstore()
    for key in ("k.payloads/b.tar", "k.payloads/a.tar", "k.manifest.json", "kx.manifest.json"):
        store.put(key, key.encode())
    assert [m.key for m in store.list("k.payloads/")] == ["k.payloads/a.tar", "k.payloads/b.tar"]
    assert [m.key for m in store.list("k.")] == [
        "k.manifest.json",
        "k.payloads/a.tar",
        "k.payloads/b.tar",
    ]
    assert [m.size for m in store.list("kx")] == [len("kx.manifest.json")]
    assert len(list(store.list())) == 4


def test_multipart_upload_and_streaming_download(make_objstore: Factory) -> None:
    store = make_objstore()
    part = 5 * 1024 * 1024  # S3's smallest part
    chunks = [bytes([i]) * (2 * 1024 * 1024 + 7) for i in range(6)]  # ~12 MiB, odd sizes
    v = store.upload("big.tar", iter(chunks), part_size=part, concurrency=4)
    if store.url.startswith("s3://"):
        assert v.etag is not None and v.etag.strip('"').endswith("-3")  # three parts
    with store.stream("big.tar", chunk_size=1024 * 1024) as stream:
        assert stream.meta.size == sum(map(len, chunks))
        assert b"".join(stream) == b"".join(chunks)
    with store.stream("big.tar") as stream:  # also a readable file
        head = stream.read(3)
        rest = stream.read()
    assert head + rest == b"".join(chunks)


# -- file:// -----------------------------------------------------------------


def test_local_versions_never_repeat_even_for_same_bytes_in_one_tick(tmp_path: Path) -> None:
    """ABA: an inode reused within one clock tick must not make a stale ETag match again."""
    store = LocalObjectStore(tmp_path, clock=ManualClock())  # the clock never moves
    seen = {store.put("k", b"same").etag}
    for _ in range(50):
        v = store.put("k", b"same")
        assert v.etag not in seen
        seen.add(v.etag)
    stale = store.head("k").object_version
    store.put("k", b"same")
    with pytest.raises(PreconditionFailed):
        store.put("k", b"other", mode=IfMatch(stale))


def test_local_store_keeps_its_own_files_out_of_sight(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.put("x", b"1")
    with pytest.raises(ObjectExists):
        store.put("x", b"2", mode=CREATE)
    assert [m.key for m in store.list()] == ["x"]
    assert os.listdir(tmp_path / ".objstore" / "tmp") == []  # the refused write left nothing
    for bad in ("", "/abs", "a//b", "a/../b", ".objstore/lock", "a/./b"):
        with pytest.raises(InvalidKey):
            store.put(bad, b"")


def test_obstore_local_store_has_no_update_cas_and_fails_closed(tmp_path: Path) -> None:
    """Why file:// has its own store: obstore's LocalStore cannot put If-Match."""
    plain = ObstoreObjectStore(
        LocalStore(str(tmp_path)), tmp_path.as_uri(), conditional_put=True, conditional_delete=False
    )
    v = plain.put("k", b"1", mode=CREATE)
    with pytest.raises(ConditionalWriteUnsupported):
        plain.put("k", b"2", mode=IfMatch(v))
    declared = ObstoreObjectStore(
        LocalStore(str(tmp_path)),
        tmp_path.as_uri(),
        conditional_put=False,
        conditional_delete=False,
    )
    with pytest.raises(ConditionalWriteUnsupported):
        declared.delete("k", if_match=v)
    assert declared.get("k").data == b"1"


def _cas_increment(store: LocalObjectStore, key: str, times: int) -> int:
    """Add 1 to the counter ``times`` times by read + If-Match put; returns conflicts."""
    conflicts = 0
    done = 0
    while done < times:
        got = store.get(key)
        try:
            store.put(key, b"%d" % (int(got.data) + 1), mode=IfMatch(got.meta.object_version))
            done += 1
        except PreconditionFailed:
            conflicts += 1
    return conflicts


WORKER = """
import os, sys, time
from waymark.objstore import LocalObjectStore, IfMatch, PreconditionFailed
store = LocalObjectStore(sys.argv[1])
done = conflicts = 0
print("ready", flush=True)
while not os.path.exists(sys.argv[3]):  # all start together, so they race
    time.sleep(0.001)
while done < int(sys.argv[2]):
    got = store.get("counter")
    try:
        store.put("counter", b"%d" % (int(got.data) + 1), mode=IfMatch(got.meta.object_version))
        done += 1
    except PreconditionFailed:
        conflicts += 1
print(conflicts)
"""


def test_local_cas_loses_no_update_under_concurrent_processes(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    LocalObjectStore(root).put("counter", b"0")
    workers, times, go = 4, 150, tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), str(times), str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    for p in procs:  # every worker is started and waiting (a process start takes long
        assert p.stdout is not None and p.stdout.readline() == "ready\n"  # under load)
    go.touch()
    conflicts = [int(p.communicate(timeout=90)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert LocalObjectStore(root).get("counter").data == b"%d" % (workers * times)
    assert sum(conflicts) > 0  # they did race: some compares were lost and retried


def test_local_cas_loses_no_update_under_concurrent_threads(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path, fsync=False)
    store.put("counter", b"0")
    threads = [
        threading.Thread(target=_cas_increment, args=(LocalObjectStore(tmp_path), "counter", 100))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert store.get("counter").data == b"400"


def test_open_store_urls(tmp_path: Path) -> None:
    store = open_store((tmp_path / "d").as_uri())
    assert isinstance(store, LocalObjectStore) and store.root == tmp_path / "d"
    assert store.capabilities.conditional_put and store.capabilities.conditional_delete
    for bad in ("http://example.com/x", "file://host/x", "gs://b"):
        with pytest.raises(ValueError):
            open_store(bad)


KILLED_MID_UPLOAD = """
import os, signal, sys
from waymark.objstore import open_store
store = open_store(sys.argv[1])
def chunks():
    yield b"x" * 1_000_000
    print("writing", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # dies mid-upload: its temp file stays behind
    yield b""
store.upload("big", chunks())
"""


def test_a_killed_uploads_temp_file_is_cleaned_a_live_ones_is_not(tmp_path: Path) -> None:
    url = (tmp_path / "objects").as_uri()
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_MID_UPLOAD, url], capture_output=True, text=True, timeout=60
    )
    assert killed.returncode == -signal.SIGKILL and "writing" in killed.stdout
    clock = ManualClock(time.time_ns() // 1_000_000)
    store = LocalObjectStore(tmp_path / "objects", clock=clock)
    temp = tmp_path / "objects" / ".objstore" / "tmp"
    [left] = list(temp.iterdir())

    started, release = threading.Event(), threading.Event()

    def slow() -> Iterator[bytes]:
        yield b"y" * 1000
        started.set()
        release.wait(30)
        yield b"z"

    live = threading.Thread(target=store.upload, args=("other", slow()))
    live.start()
    assert started.wait(30)
    assert store.clean_abandoned_temp() == []  # too young: it might still be being created
    clock.advance(120_000)
    assert store.clean_abandoned_temp() == [(left.name, 1_000_000)]  # the live one is flocked
    release.set()
    live.join()
    assert store.get("other").data == b"y" * 1000 + b"z"
    assert list(temp.iterdir()) == []


def test_file_cas_is_trusted_on_a_local_disk_and_fails_closed_on_nfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from waymark.kv.artifact import ExportManifest
    from waymark.kv.transport import ObjectStoreTransport
    from waymark.objstore import local

    manifest = ExportManifest(1, "append-log", 1, "00", ())

    store = LocalObjectStore(tmp_path / "here")
    assert store.file_system not in (None, *local.NETWORK_FILE_SYSTEMS)  # the real mount
    assert store.capabilities.conditional_put and store.capabilities.conditional_delete
    # Fault injector: an NFS (or FUSE) mount cannot be made here; its type can be reported.
    for fs_type in ("nfs4", "fuse.sshfs"):
        monkeypatch.setattr(local, "file_system_type", lambda path, t=fs_type: t)
        remote = LocalObjectStore(tmp_path / fs_type)
        assert not remote.capabilities.conditional_put
        with pytest.raises(ConditionalWriteUnsupported, match="fails closed"):
            ObjectStoreTransport(remote).upload_files("k", tmp_path, manifest.encode(), manifest)
        assert list(remote.list()) == []  # refused before anything was uploaded


SLOW_UPLOAD = """
import sys, time
from waymark.objstore import open_store
def chunks():
    yield b"x" * (8 * 1024 * 1024)
    yield b"y" * (8 * 1024 * 1024)
    time.sleep(3600)  # killed before the rest: its multipart upload stays open
    yield b""
open_store(sys.argv[1]).upload("payloads/big", chunks())
"""


def test_a_killed_writers_multipart_upload_is_aborted_on_s3(moto_s3: MotoS3, s3_url: str) -> None:
    """An upload killed midway leaves an incomplete multipart upload on S3 whose parts
    are kept (and billed) until someone aborts it: startup housekeeping aborts those
    older than its threshold, and says which and how large (docs/kv.md, "Crash
    leftovers")."""
    import boto3

    bucket = s3_url.removeprefix("s3://").partition("/")[0]
    s3 = boto3.client("s3", endpoint_url=moto_s3.endpoint, region_name="us-east-1")
    writer = subprocess.Popen([sys.executable, "-c", SLOW_UPLOAD, s3_url])

    def parts() -> int:
        uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        return sum(len(s3.list_parts(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
                       .get("Parts", [])) for u in uploads)  # fmt: skip

    deadline = time.monotonic() + 60
    while parts() == 0:  # until a part of it is on S3
        assert writer.poll() is None and time.monotonic() < deadline, "no part was sent"
        time.sleep(0.05)
    writer.kill()
    writer.wait()
    # (moto stamps every upload 2010-11-10T20:48:33Z: the clock is set a minute later)
    [upload] = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    clock = ManualClock(int(upload["Initiated"].timestamp() * 1000) + 60_000)
    store = open_store(s3_url, clock=clock)
    assert store.clean_abandoned_temp() == []  # young: it might be a live writer's
    assert open_store(f"s3://{bucket}/elsewhere").clean_abandoned_temp(min_age_s=0) == []
    [(key, size)] = store.clean_abandoned_temp(min_age_s=0)
    assert key == "replicas/payloads/big" and size >= 8 * 1024 * 1024
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
