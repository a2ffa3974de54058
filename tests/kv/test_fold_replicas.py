"""``waymark fold --export-to / --bootstrap-from`` and ``fold inspect`` as real processes."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from waymark.cli import app
from waymark.kv import Connection, KvStore, KvUpdate, StoreConfig, WatchCursor
from waymark.kv.leftovers import generation_path
from waymark.kv.server import EmbeddedNats
from waymark.kv.stores.lmdb_store import LmdbStore
from waymark.kv.transport import ObjectStoreTransport
from waymark.objstore import open_store as open_objstore

pytestmark = pytest.mark.timeout(120)


def waymark(*args: str, stderr_to: Path | None = None) -> subprocess.Popen[str]:
    """A ``waymark`` process; its stderr piped, or written to ``stderr_to`` to be read
    while it runs."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "waymark"), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE if stderr_to is None else stderr_to.open("w"),
        text=True,
    )


def ran(*args: str) -> subprocess.CompletedProcess[str]:
    """A ``waymark`` command run to its end, as a user runs it."""
    return subprocess.run([str(Path(sys.executable).parent / "waymark"), *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


async def bulk_put(kv: KvStore, items: list[tuple[str, bytes]]) -> None:
    for key, value in items:
        await kv.js.publish_async(f"{kv.subject_prefix}{key}", value)
    await kv.js.publish_async_completed()


def lmdb_cursor(path: Path) -> int:
    if not (path / "data.mdb").exists():
        return 0
    store = LmdbStore(path)  # LMDB readers may share the fold with its writer
    try:
        return store.cursor.as_u64()
    finally:
        store.close()


def published_cursor(transport: ObjectStoreTransport, key: str) -> int | None:
    """The cursor of the published artifact (the pointer's rank also orders generations)."""
    manifest = transport.read_pointer(key).manifest
    return None if manifest is None else manifest.rank


async def until(condition: object, proc: subprocess.Popen[str], what: str) -> None:
    for _ in range(1500):
        if condition():  # type: ignore[operator]
            return
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else "(stderr went to a file)"
            raise AssertionError(f"{what}: the process exited: {err}")
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc: subprocess.Popen[str], stderr_to: Path | None = None) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    if stderr_to is not None:
        err = stderr_to.read_text()
    assert proc.returncode == 0, err
    return " ".join(err.split())  # rich wraps lines at 80 columns without a terminal


async def test_an_exporting_node_and_a_bootstrapped_node_that_fetches_only_the_tail(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path
) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k.{i:05}", b"first-%d" % i) for i in range(3000)])
    _, exported_at = await kv.stream_bounds()
    url = (tmp_path / "artifacts").as_uri()
    transport = ObjectStoreTransport(open_objstore(url))

    a = waymark("fold", "--nats", nats_server.url, "--bucket", bucket_name,
                "--store", f"lmdb:{tmp_path / 'a'}", "--export-to", url,
                "--export-every-s", "0.2", "--lease-ttl-s", "1", "--node-id", "node-a",
                stderr_to=tmp_path / "a.err")  # fmt: skip
    published = f"export: published cursor {exported_at}"
    err = tmp_path / "a.err"
    try:
        # The pointer moves before the round completes its lease, prunes and says so.
        await until(lambda: published_cursor(transport, bucket_name) == exported_at
                    and published in " ".join(err.read_text().split()), a, "a publish")  # fmt: skip
    finally:
        err_a = stop(a, err)
    assert published in err_a

    tail = [(f"k.{i:05}", b"second-%d" % i) for i in range(0, 3000, 10)]
    await bulk_put(kv, tail)
    _, last = await kv.stream_bounds()
    b = waymark("fold", "--nats", nats_server.url, "--bucket", bucket_name,
                "--store", f"lmdb:{tmp_path / 'b'}", "--bootstrap-from", url)  # fmt: skip
    try:
        await until(lambda: lmdb_cursor(tmp_path / "b") == last, b, "node b to catch up")
    finally:
        err_b = stop(b)
    assert f"bootstrapped from {url} ({bucket_name}): cursor {exported_at}" in err_b
    applied = re.search(r"stopped at cursor (\d+) \(([\d,]+) updates applied\)", err_b)
    assert applied is not None, err_b
    # Delta only, by delivery count: a full replay would reach the same state with 3000 more.
    assert int(applied[1]) == last and int(applied[2].replace(",", "")) == len(tail)
    store = LmdbStore(tmp_path / "b")
    assert {e.key: e.value for e in store.range()} == {
        e.key: e.value for e in await kv.reader().scan()
    }
    store.close()

    # fold inspect: the pointer, its manifest and the payloads.
    result = CliRunner().invoke(app, ["fold", "inspect", url, "--json"])
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.output)
    assert doc["key"] == bucket_name and doc["pointer"]["manifest"]["cursor"] == exported_at
    assert doc["pointer"]["manifest"]["exporter"] == "node-a"
    assert doc["pointer"]["manifest"]["bucket"] == bucket_name
    assert [p["target"] for p in doc["payloads"]] == [True]
    table = CliRunner().invoke(app, ["fold", "inspect", url, "--key", bucket_name])
    assert table.exit_code == 0 and str(exported_at) in table.output and "lmdb" in table.output


def test_a_refused_artifact_exits_non_zero_and_leaves_no_store(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "src")
    store.apply(
        [KvUpdate.put(f"k{i}", b"v" * 100, i + 1) for i in range(50)], WatchCursor.from_u64(50)
    )
    store.export_to(tmp_path / "art")
    store.close()
    url = (tmp_path / "objects").as_uri()
    transport = ObjectStoreTransport(open_objstore(url))
    transport.upload("routes", tmp_path / "art")
    payload = next(transport.store.list("routes.payloads/")).key
    data = bytearray(transport.store.get(payload).data)
    data[-5000] ^= 0xFF  # inside data.mdb
    transport.store.put(payload, bytes(data))

    dest = tmp_path / "new"
    result = CliRunner().invoke(
        app,
        [
            "fold",
            "--bucket",
            "routes",
            "--store",
            f"lmdb:{dest}",
            "--bootstrap-from",
            url,
            "--nats",
            "nats://127.0.0.1:1",
        ],
    )
    assert result.exit_code == 3, result.output
    assert "ArtifactInvalid" in result.output and "BLAKE3" in result.output
    assert not dest.exists()

    # A backend that does not match is refused from the pointer alone, before the payload
    # is fetched (here it is gone: fetching it would be ArtifactUnavailable, exit 4).
    transport.store.delete(payload)
    result = CliRunner().invoke(
        app,
        [
            "fold",
            "--bucket",
            "routes",
            "--store",
            f"rocksdb:{dest}",
            "--bootstrap-from",
            url,
            "--nats",
            "nats://127.0.0.1:1",
        ],
    )
    assert result.exit_code == 3 and "artifact is a lmdb fold" in result.output
    assert not dest.exists()

    # Nothing published at all.
    empty = (tmp_path / "empty").as_uri()
    result = CliRunner().invoke(
        app,
        [
            "fold",
            "--bucket",
            "routes",
            "--store",
            f"lmdb:{dest}",
            "--bootstrap-from",
            empty,
            "--nats",
            "nats://127.0.0.1:1",
        ],
    )
    assert result.exit_code == 4 and "ArtifactUnavailable" in result.output
    assert not dest.exists()


async def test_a_fleets_first_node_replays_with_if_exists_and_the_next_bootstraps(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path
) -> None:
    """``--bootstrap-from URL --if-exists``: nothing published yet is a cold replay (the
    first node, which then publishes); once something is, the next node bootstraps."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k.{i:04}", b"v%d" % i) for i in range(300)])
    _, last = await kv.stream_bounds()
    url = (tmp_path / "artifacts").as_uri()
    transport = ObjectStoreTransport(open_objstore(url))
    node = ("fold", "--nats", nats_server.url, "--bucket", bucket_name,
            "--bootstrap-from", url, "--if-exists")  # fmt: skip
    first = waymark(*node, "--store", f"lmdb:{tmp_path / 'a'}", "--export-to", url,
                    "--export-every-s", "0.2", "--lease-ttl-s", "1")  # fmt: skip
    try:
        await until(lambda: published_cursor(transport, bucket_name) == last, first, "a")
    finally:
        err = stop(first)
    assert f"nothing published at {url} ({bucket_name}) yet for this bucket" in err
    assert "replaying the bucket from the start" in err
    second = waymark(*node, "--store", f"lmdb:{tmp_path / 'b'}")
    after = (await kv.writer().put("k.after", b"tail")).as_u64()
    try:
        await until(lambda: lmdb_cursor(tmp_path / "b") == after, second, "b to fold the tail")
    finally:
        err = stop(second)
    assert f"bootstrapped from {url} ({bucket_name}): cursor {last}" in err


def test_if_exists_still_refuses_a_pointer_whose_payload_is_gone(tmp_path: Path) -> None:
    """Only an absent pointer means "nothing published yet"; a published artifact that
    cannot be fetched is reported, not silently replaced by a cold replay. Here the
    pointer's own target was removed by hand, which pruning never does: invalid, exit 3."""
    store = LmdbStore(tmp_path / "src")
    store.apply([KvUpdate.put("k", b"v", 1)], WatchCursor.from_u64(1))
    store.export_to(tmp_path / "art")
    store.close()
    url = (tmp_path / "objects").as_uri()
    transport = ObjectStoreTransport(open_objstore(url))
    transport.upload("routes", tmp_path / "art")
    transport.store.delete(next(transport.store.list("routes.payloads/")).key)
    dest = tmp_path / "new"
    args = ["fold", "--bucket", "routes", "--store", f"lmdb:{dest}", "--bootstrap-from", url,
            "--nats", "nats://127.0.0.1:1"]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--if-exists"])
    assert result.exit_code == 3 and "does not exist" in result.output, result.output
    assert not dest.exists()
    result = CliRunner().invoke(app, ["fold", "--bucket", "routes", "--store", f"lmdb:{dest}",
                                      "--if-exists"])  # fmt: skip
    assert result.exit_code == 2 and "--bootstrap-from" in result.output
    result = CliRunner().invoke(app, ["fold", "--bucket", "routes", "--store", f"lmdb:{dest}",
                                      "--keep", "3"])  # fmt: skip
    assert result.exit_code == 2 and "--export-to" in result.output


async def test_a_restart_removes_what_a_killed_export_round_left_and_one_store_has_one_node(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path
) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k.{i:05}", b"v" * 200) for i in range(20_000)])
    url = (tmp_path / "artifacts").as_uri()
    store = tmp_path / "node" / "a"
    work = tmp_path / "node" / ".a.exports"
    node = ("fold", "--nats", nats_server.url, "--bucket", bucket_name, "--store", f"lmdb:{store}")
    a = waymark(*node, "--export-to", url, "--export-every-s", "0.05", "--lease-ttl-s", "1")
    writes = 0
    try:
        for _ in range(3000):  # the fold keeps moving, so rounds keep coming; kill one mid-way
            if work.is_dir() and any(work.iterdir()):
                a.kill()
                break
            assert a.poll() is None, a.stderr.read() if a.stderr else ""
            await kv.writer().put(f"more.{writes}", b"x")
            writes += 1
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("never saw an export round in progress")
    finally:
        a.kill()
        a.wait()
    left = list(work.iterdir())
    assert left, "the killed round left its working copy"

    b = waymark(*node)
    after = (await kv.writer().put("after", b"x")).as_u64()
    try:
        await until(lambda: lmdb_cursor(store) >= after, b, "b to fold on")
        # A second node on the same store is refused while b holds it.
        second = subprocess.run(
            [str(Path(sys.executable).parent / "waymark"), *node],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 5 and "StoreInUse" in second.stderr, second.stderr
    finally:
        err = stop(b)
    assert f"removed {len(left)} leftover(s) of a killed run" in err
    assert not work.exists() or list(work.iterdir()) == []


async def test_the_lease_holder_and_a_standby_each_say_what_they_do(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path
) -> None:
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k.{i:03}", b"v") for i in range(100)])
    url = (tmp_path / "artifacts").as_uri()
    transport = ObjectStoreTransport(open_objstore(url))
    node = ("fold", "--nats", nats_server.url, "--bucket", bucket_name, "--export-to", url,
            "--export-every-s", "0.1", "--lease-ttl-s", "60")  # fmt: skip
    a = waymark(*node, "--store", f"lmdb:{tmp_path / 'a'}", "--node-id", "node-a",
                stderr_to=tmp_path / "a.err")  # fmt: skip
    try:
        await until(lambda: published_cursor(transport, bucket_name) == 100, a, "a")
        b = waymark(*node, "--store", f"lmdb:{tmp_path / 'b'}", "--node-id", "node-b",
                    stderr_to=tmp_path / "b.err")  # fmt: skip
        try:
            await until(lambda: "standing by" in (tmp_path / "b.err").read_text(), b, "b")
        finally:
            err_b = stop(b, tmp_path / "b.err")
    finally:
        err_a = stop(a, tmp_path / "a.err")
    assert "export: node-a holds the lease lease." in err_a
    assert "export: standing by; node-a holds the lease lease." in err_b
    assert err_b.count("standing by") == 1  # said once, not every round


async def test_a_standbys_clock_jumping_ahead_takes_a_paused_holders_lease_on_its_clock(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path
) -> None:
    """The fault campaign's clock jump on a fold fleet (docs/faults.md, "Faults"): the
    lease holder is paused (SIGSTOP) with 60 s of lease left; a standby whose injected
    clock (``--clock-offset-file``) jumps 2 minutes ahead takes the lease over at once
    instead of a minute later, and exports on its own clock. The holder, resumed, never
    moves the pointer back."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"k.{i:03}", b"v") for i in range(100)])
    url = (tmp_path / "artifacts").as_uri()
    transport = ObjectStoreTransport(open_objstore(url))
    offset = tmp_path / "clock-offset"
    offset.write_text("0\n")
    node = ("fold", "--nats", nats_server.url, "--bucket", bucket_name, "--export-to", url,
            "--export-every-s", "0.1", "--lease-ttl-s", "60")  # fmt: skip
    a = waymark(*node, "--store", f"lmdb:{tmp_path / 'a'}", "--node-id", "node-a",
                stderr_to=tmp_path / "a.err")  # fmt: skip
    try:
        await until(lambda: published_cursor(transport, bucket_name) == 100, a, "a")
        b = waymark(*node, "--store", f"lmdb:{tmp_path / 'b'}", "--node-id", "node-b",
                    "--clock-offset-file", str(offset), stderr_to=tmp_path / "b.err")  # fmt: skip
        try:
            await until(lambda: "standing by" in (tmp_path / "b.err").read_text(), b, "b")
            a.send_signal(signal.SIGSTOP)  # its lease has a minute left on every real clock
            offset.write_text("120000\n")  # b's clock: 2 minutes on
            jumped = time.time() * 1000 + 120_000
            await bulk_put(kv, [(f"k.{i:03}", b"w") for i in range(50)])
            _, last = await kv.stream_bounds()
            await until(lambda: published_cursor(transport, bucket_name) == last, b, "b")
            manifest = transport.read_pointer(bucket_name).manifest
            assert manifest is not None and manifest.exporter == "node-b"
            assert manifest.exported_at_ms >= jumped - 10_000  # b's clock, not the wall's
            a.send_signal(signal.SIGCONT)
            # The resumed holder finds the pointer past its fold: it never moves it back.
            await until(lambda: "the pointer already names cursor" in
                        (tmp_path / "a.err").read_text(), a, "a to skip")  # fmt: skip
            assert published_cursor(transport, bucket_name) == last
        finally:
            err_b = stop(b, tmp_path / "b.err")
    finally:
        a.send_signal(signal.SIGCONT)
        a.kill()  # its clean stop is not what this is about
        a.wait()
    assert "export: node-b holds the lease lease." in err_b


async def test_a_recreated_bucket_is_a_new_generation_its_nodes_never_get_the_old_artifact(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path
) -> None:
    """The bucket deleted and recreated: its revisions start over. A new node must not
    bootstrap the dead bucket's artifact (it replays, with --if-exists), and it publishes
    over it rather than being superseded by its higher cursor every round."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"old.{i:03}", b"v") for i in range(200)])
    url = (tmp_path / "artifacts").as_uri()
    transport = ObjectStoreTransport(open_objstore(url))
    node = ("fold", "--nats", nats_server.url, "--bucket", bucket_name, "--export-to", url,
            "--export-every-s", "0.1", "--lease-ttl-s", "1", "--bootstrap-from", url,
            "--if-exists")  # fmt: skip
    a = waymark(*node, "--store", f"lmdb:{tmp_path / 'a'}")
    try:
        await until(lambda: published_cursor(transport, bucket_name) == 200, a, "a")
    finally:
        stop(a)
    old = transport.read_pointer(bucket_name).manifest
    assert old is not None and old.generation == await kv.generation()

    await kv.js.delete_stream(kv.stream)
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"new.{i}", b"w") for i in range(5)])
    b = waymark(*node, "--store", f"lmdb:{tmp_path / 'b'}")
    try:
        await until(lambda: published_cursor(transport, bucket_name) == 5, b, "b to publish")
    finally:
        err = stop(b)
    assert "which was deleted and recreated since" in err and "bootstrapped" not in err
    new = transport.read_pointer(bucket_name).manifest
    assert new is not None and new.generation == await kv.generation() > old.generation
    store = LmdbStore(tmp_path / "b")
    assert sorted(e.key for e in store.range()) == [f"new.{i}" for i in range(5)]
    store.close()


async def test_a_fold_of_a_deleted_bucket_starts_over_instead_of_resuming_on_its_successor(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path
) -> None:
    """The node was down while the bucket was deleted and recreated, and the new bucket
    grew past the old cursor: resuming from it would skip new revisions 1..50 without a
    trace (the resume window cannot tell). The recorded generation tells."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"old.{i:03}", b"v") for i in range(50)])
    node = ("fold", "--nats", nats_server.url, "--bucket", bucket_name,
            "--store", f"lmdb:{tmp_path / 'a'}")  # fmt: skip
    a = waymark(*node)
    try:
        await until(lambda: lmdb_cursor(tmp_path / "a") == 50, a, "a")
    finally:
        stop(a)
    await kv.js.delete_stream(kv.stream)
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    await bulk_put(kv, [(f"new.{i:03}", b"w") for i in range(80)])
    again = waymark(*node)
    try:
        await until(lambda: lmdb_cursor(tmp_path / "a") == 80, again, "the fold to start over")
    finally:
        err = stop(again)
    assert "which was deleted and recreated since" in err and "starting it over" in err
    store = LmdbStore(tmp_path / "a")
    assert sorted(e.key for e in store.range()) == [f"new.{i:03}" for i in range(80)]
    store.close()


async def test_keep_n_and_restore_an_older_artifact_by_id(
    conn: Connection, nats_server: EmbeddedNats, bucket_name: str, tmp_path: Path
) -> None:
    """``--keep 2``: the published artifact and the one before are never retired (with
    the default, 1, the one before is, on the next round);
    ``fold restore --artifact ID`` restores the older one with a progress bar, and refuses
    an unknown id (exit 4), a tampered payload (exit 3), a path holding a fold (exit 1) and,
    once the bucket was recreated, the dead bucket's artifact (exit 4)."""
    kv = await conn.store(bucket_name, StoreConfig(max_bytes=None))
    url = (tmp_path / "artifacts").as_uri()
    transport = ObjectStoreTransport(open_objstore(url))
    a = waymark("fold", "--nats", nats_server.url, "--bucket", bucket_name,
                "--store", f"lmdb:{tmp_path / 'a'}", "--export-to", url, "--keep", "2",
                "--export-every-s", "0.1", "--lease-ttl-s", "1")  # fmt: skip
    ids = {}
    try:
        for r in range(2):
            await bulk_put(kv, [(f"k.{i:03}", b"r%d" % r) for i in range(r * 20, 100)])
            _, last = await kv.stream_bounds()
            await until(lambda: published_cursor(transport, bucket_name) == last, a, f"round {r}")  # noqa: B023
            pointed = transport.pointed(bucket_name)
            assert pointed is not None
            ids[last] = pointed[1].rsplit("/", 1)[1].removesuffix(".tar")
    finally:
        stop(a)
    (c2, older), (_, newest) = ids.items()
    retired = [m.key for m in transport.store.list(f"{bucket_name}.retired/")]
    assert not [k for k in retired if older in k or newest in k], retired

    dest = tmp_path / "restored"
    restore = ["fold", "restore", url, "--bucket", bucket_name, "--nats", nats_server.url]
    result = ran(*restore, "--artifact", older, "--store", f"lmdb:{dest}")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stderr.split())
    assert f"restored artifact {older} into lmdb:{dest}: cursor {c2}" in out
    assert "download" in out and "verify (BLAKE3)" in out  # the progress bars
    assert lmdb_cursor(dest) == c2

    offline = restore[:-2]  # without --nats: checked against the pointer's generation
    again = CliRunner().invoke(app, [*offline, "--artifact", newest, "--store", f"lmdb:{dest}"])
    assert again.exit_code == 5 and "already holds a fold" in again.output  # refused
    other = tmp_path / "other"
    unknown = CliRunner().invoke(app, [*offline, "--artifact", "0" * 16, "--store",
                                       f"lmdb:{other}"])  # fmt: skip
    assert unknown.exit_code == 4 and "unknown, or pruned" in unknown.output, unknown.output
    payload = f"{bucket_name}.payloads/{newest}.tar"
    data = bytearray(transport.store.get(payload).data)
    data[-3000] ^= 0xFF  # inside data.mdb
    transport.store.put(payload, bytes(data))
    bad = CliRunner().invoke(app, [*offline, "--artifact", newest, "--store", f"lmdb:{other}"])
    assert bad.exit_code == 3 and "ArtifactInvalid" in bad.output and "BLAKE3" in bad.output
    assert not other.exists()
    # The restore records the artifact's generation: a later `waymark fold` on a bucket
    # recreated since starts over instead of resuming a dead bucket's cursor.
    assert generation_path(dest).read_text() == str(await kv.generation())
    # The bucket deleted and recreated: against the live bucket (--nats), an artifact of
    # the dead one is refused before anything is fetched.
    await kv.js.delete_stream(kv.stream)
    await conn.store(bucket_name, StoreConfig(max_bytes=None))
    dead = ran(*restore, "--artifact", older, "--store", f"lmdb:{other}")
    assert dead.returncode == 4 and "generation" in dead.stderr, dead.stderr
    assert not other.exists()
