"""The wire contract end to end: everything the engine and the server can answer decodes
through the shipped client. Every tombstone reason, produced for real, read by diff, by
the raw diff Spark uses and over SSE; every error code, driven for real over HTTP.

Time-driven cases (TTL) and the faults no request can cause (a full disk, a server
bug) run on an in-process uvicorn server over a real socket, with a manual clock and
fault injectors; the crash case runs a real ``waymark serve`` killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from waymark.client import (
    ApiError,
    Client,
    ConfigPatch,
    ErrorCode,
    RecordIn,
    StagedPart,
    Tombstone,
    TombstoneEvent,
    TombstoneReason,
    TopicType,
)
from waymark.clock import ManualClock
from waymark.log.config import EngineConfig, StorageConfig
from waymark.log.storage.fileio import FileIO
from waymark.log.storage.restore import open_engine
from waymark.protocol import Discard, Durability, Limits
from waymark.protocol.scopes import ALL_SCOPES
from waymark.server import App
from waymark.server.auth import new_token
from waymark.server.config import AuthConfig, HttpConfig, ServerConfig, StreamConfig
from waymark.server.serving import Server, listen


@contextmanager
def serving(app: App) -> Iterator[str]:
    """``app`` on uvicorn in a thread, on a socket that listens before this returns (a
    client may connect at once). The engine stays on the server's loop thread."""
    sock = listen("127.0.0.1", 0)
    server = Server(app)  # waymark's: its connection limits answer some codes
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        app.close()
        server.should_exit = True
        thread.join(30)
        sock.close()


def read_tombstone(
    client: Client, topic: str, from_seq: int, epoch: int | None = None
) -> Tombstone:
    """The tombstone ahead of ``from_seq`` as diff, the raw diff and SSE deliver it: all
    three decode it the same."""
    page = client.diff(topic, from_seq, epoch=epoch)
    raw = client.diff_raw(topic, from_seq, epoch=epoch)
    assert page.tombstone is not None and raw.tombstone == page.tombstone
    stream = client.watch(topic, from_seq=from_seq, epoch=epoch, max_retries=0)
    try:
        event = next(stream)
    finally:
        stream.close()
    assert isinstance(event, TombstoneEvent) and event.tombstone == page.tombstone
    assert event.cursor == f"{page.epoch}:{page.tombstone.seq - 1}"
    return page.tombstone


def test_every_tombstone_reason_decodes_through_the_client(
    tmp_path: Path, spawn_server: Callable[..., Any]
) -> None:
    seen: dict[str, Tombstone] = {}
    clock = ManualClock()
    with serving(App(clock=clock)) as url, Client(url) as client:
        client.put_topic("cap", ConfigPatch(cap_records=2))
        client.append("cap", [RecordIn.of(i) for i in range(4)])
        seen["cap"] = read_tombstone(client, "cap", 0)

        client.put_topic("ttl", ConfigPatch(ttl_ms=1000))
        client.append("ttl", [RecordIn.of("old")])
        clock.advance(1001)
        client.append("ttl", [RecordIn.of("new")])
        seen["ttl"] = read_tombstone(client, "ttl", 0)

        client.put_topic("mixed", ConfigPatch(ttl_ms=1000, cap_records=2))
        client.append("mixed", [RecordIn.of("expires")])
        clock.advance(1001)
        client.append("mixed", [RecordIn.of(i) for i in range(3)])  # one over the cap
        seen["mixed"] = read_tombstone(client, "mixed", 0)

        client.append("again", [RecordIn.of(1), RecordIn.of(2)])
        old_epoch = client.get_topic("again").epoch
        client.delete_topic("again")
        client.append("again", [RecordIn.of(3)])
        seen["recreated"] = read_tombstone(client, "again", 2, epoch=old_epoch)

        # The source evicts 1 and 2 within the append, before the router runs.
        client.put_topic("source", ConfigPatch(cap_records=1))
        client.put_router("r", "source", "dest")
        client.append("source", [RecordIn.of(i) for i in range(3)])
        assert client.diff("dest", 0, wait_ms=10_000).tombstone is not None  # forwarded
        seen["source_trim"] = read_tombstone(client, "dest", 0)

    # Acknowledged ephemeral records are gone after a crash, and say so.
    server = spawn_server(tmp_path / "crash")
    with Client(server.url) as client:
        client.put_topic("e", ConfigPatch(durability=Durability.EPHEMERAL))
        client.append("e", [RecordIn.of(i) for i in range(3)])
        # An ephemeral append does not wait for the seq ceiling it journals; a config
        # write is acknowledged once its WAL shard is durable, that ceiling included.
        client.put_topic("e", ConfigPatch())
    server.stop(signal.SIGKILL)
    server = spawn_server(tmp_path / "crash")
    with Client(server.url) as client:
        seen["lost"] = read_tombstone(client, "e", 0)

    assert {reason: t.reason for reason, t in seen.items()} == {r: r for r in seen}
    # A reason added to the contract needs a case here.
    assert set(seen) == set(TombstoneReason)


class FullDisk(FileIO):
    """Fault injector: while ``full`` is set every WAL write fails with ENOSPC."""

    def __init__(self) -> None:
        self.full = threading.Event()

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(fd, data)


class FailingClock(ManualClock):
    """Fault injector: while ``failing`` is set reading the time on the server's event
    loop raises, standing in for any bug inside the engine. The WAL's writer threads
    read it too (to time their syncs); broken there, it killed a shard's writer when a
    retry round after the full-disk case fell in the window, and a later write waited
    for its sync forever."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = threading.Event()

    def now_ms(self) -> int:
        if self.failing.is_set() and _on_event_loop():
            raise RuntimeError("fault injector: the clock broke")
        return super().now_ms()


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@contextmanager
def fault(flag: threading.Event) -> Iterator[None]:
    flag.set()
    try:
        yield
    finally:
        flag.clear()


LIMITS = Limits(max_record_bytes=64, max_tag_bytes=8, max_node_bytes=8, max_meta_bytes=64,
                max_meta_keys=2, max_records_per_write=3, max_body_bytes=4096,
                max_topics=40, max_staged_bytes_per_writer=100)  # fmt: skip
HTTP = HttpConfig(header_timeout_s=0.3, max_connections=4)
STREAMS = StreamConfig(max_streams=1)


@dataclass
class Target:
    """What an error case can reach: the client, the server's URL and the faults."""

    client: Client
    url: str
    disk: FullDisk
    clock: FailingClock
    secrets: dict[str, str]  # token name -> secret (docs/security.md)

    def raw(self, method: str, path: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {self.secrets['all']}"}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=10)


def refused_by_connection(s: Target, request: bytes, *, hold: int = 0) -> None:
    """Send ``request`` on a fresh connection while ``hold`` idle ones stay open; the
    answer is the server's, decoded by the client."""
    host, port = s.url.removeprefix("http://").rsplit(":", 1)
    held = [socket.create_connection((host, int(port))) for _ in range(hold)]
    try:
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(request)
            sock.settimeout(10)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    finally:
        for idle in held:
            idle.close()
    deadline = time.monotonic() + 10
    while httpx.get(f"{s.url}/v0/health").status_code != 200:  # the server saw them close
        assert time.monotonic() < deadline
    head, body = answer.split(b"\r\n\r\n", 1)
    raise ApiError.from_response(httpx.Response(int(head.split()[1]), content=body))


def as_token(s: Target, name: str, call: Callable[[Client], object]) -> None:
    with Client(s.url, token=s.secrets[name]) as client:
        call(client)


def token_expired(s: Target) -> None:
    s.clock.advance(61_000)  # "brief" expires 60 s after it was made
    as_token(s, "brief", lambda c: c.get_topic("t"))


def rate_limited(s: Target) -> None:
    # "slow": one request per 1000 s, a burst of one: its second is refused.
    as_token(s, "slow", lambda c: c.get_topic("t"))
    as_token(s, "slow", lambda c: c.get_topic("t"))


def too_many_streams(s: Target) -> None:
    with httpx.stream(
        "GET",
        f"{s.url}/v0/topics/t/watch",
        timeout=10,
        headers={"authorization": f"Bearer {s.secrets['all']}"},
    ) as one:
        assert one.status_code == 200
        raise ApiError.from_response(s.raw("GET", "/v0/topics/t/watch"))


def too_many_topics(s: Target) -> None:
    for i in range(LIMITS.max_topics + 1):
        s.client.put_topic(f"many-{i}")


def staging_full(s: Target) -> None:
    epoch = s.client.open_writer("stager").epoch
    for partition in range(10):  # 100 staged bytes per writer at the most
        s.client.stage("t", [RecordIn.of("x" * 40)], writer="stager", epoch=epoch,
                       batch_id=0, partition=partition, attempt=0)  # fmt: skip


def fenced(s: Target) -> None:
    old = s.client.open_writer("w").epoch
    s.client.open_writer("w")
    s.client.stage("t", [RecordIn.of(1)], writer="w", epoch=old, batch_id=0, partition=0,
                   attempt=0)  # fmt: skip


def topic_full(s: Target) -> None:
    s.client.put_topic("full", ConfigPatch(cap_records=1, discard=Discard.REJECT))
    s.client.append("full", [RecordIn.of(1)])
    s.client.append("full", [RecordIn.of(2)])


def incompatible(s: Target) -> None:
    s.client.put_topic("log")
    s.client.put_topic("log", type=TopicType.QUEUE)


def unstaged_publish(s: Target) -> None:
    epoch = s.client.open_writer("never-staged").epoch
    s.client.publish("t", writer="never-staged", epoch=epoch, batch_id=0,
                     parts=[StagedPart(0, 0, 1)])  # fmt: skip


def method_not_allowed(s: Target) -> None:
    # No client call sends a method a route lacks: decode what the server answers one.
    raise ApiError.from_response(httpx.patch(f"{s.url}/v0/topics/t"))


def not_json(s: Target) -> None:
    # The client always sends JSON: decode what the server answers a form post.
    headers = {"authorization": f"Bearer {s.secrets['all']}", "content-type": "text/plain"}
    raise ApiError.from_response(httpx.post(f"{s.url}/v0/topics/t/records", content=b"{}",
                                            headers=headers, timeout=10))  # fmt: skip


def disk_full(s: Target) -> None:
    # A write the WAL has taken is never refused afterwards (it waits until stored,
    # docs/durability.md): the refusal comes to the writes after the WAL met the full
    # disk. A memory topic's appends wait for nothing, so they find the moment.
    s.client.put_topic("scratch", ConfigPatch(durability=Durability.MEMORY))
    try:
        with fault(s.disk.full):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                s.client.append("scratch", [RecordIn.of(1)])
    finally:
        # The WAL retries on its own once the disk accepts writes again: wait for it, so
        # the cases after this one meet a server that writes (not a timing guess).
        deadline = time.monotonic() + 30
        while True:
            try:
                s.client.append("synced", [RecordIn.of(2)])
                break
            except ApiError as e:
                if e.code is not ErrorCode.STORAGE_UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def server_bug(s: Target) -> None:
    with fault(s.clock.failing):
        s.client.get_topic("t")


CASES: dict[ErrorCode, Callable[[Target], object]] = {
    ErrorCode.INVALID_REQUEST: lambda s: s.client.diff("t", 0, limit=0),
    ErrorCode.INVALID_TOPIC_NAME: lambda s: s.client.get_topic("no/slash"),
    ErrorCode.INVALID_RECORD: lambda s: s.client.append("t", [RecordIn(msgspec.Raw(b"1e400"))]),
    ErrorCode.RECORD_TOO_LARGE: lambda s: s.client.append("t", [RecordIn.of("x" * 100)]),
    ErrorCode.TAG_TOO_LONG: lambda s: s.client.append("t", [RecordIn.of(1, tag="t" * 9)]),
    ErrorCode.NODE_TOO_LONG: lambda s: s.client.append("t", [RecordIn.of(1, node="n" * 9)]),
    ErrorCode.META_TOO_LARGE: lambda s: s.client.append(
        "t", [RecordIn.of(1, meta={"a": "1", "b": "2", "c": "3"})]),
    ErrorCode.TOO_MANY_RECORDS: lambda s: s.client.append(
        "t", [RecordIn.of(i) for i in range(4)]),
    ErrorCode.BODY_TOO_LARGE: lambda s: s.client.delete("t", match="x" * 5000),
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: not_json,
    ErrorCode.TOPIC_NOT_FOUND: lambda s: s.client.get_topic("missing"),
    ErrorCode.TOPIC_FULL: topic_full,
    ErrorCode.TOPIC_EXISTS_INCOMPATIBLE: incompatible,
    ErrorCode.NOT_A_QUEUE: lambda s: s.client.claim("t", "worker"),
    ErrorCode.ROUTER_CYCLE: lambda s: s.client.put_router("loop", "a", "a"),
    ErrorCode.ROUTER_NOT_FOUND: lambda s: s.client.get_router("missing"),
    ErrorCode.FENCED: fenced,
    ErrorCode.NOT_FOUND: unstaged_publish,
    ErrorCode.METHOD_NOT_ALLOWED: method_not_allowed,
    ErrorCode.STORAGE_UNAVAILABLE: disk_full,
    ErrorCode.INTERNAL: server_bug,
    ErrorCode.UNAUTHORIZED: lambda s: as_token(s, "wrong", lambda c: c.get_topic("t")),
    ErrorCode.FORBIDDEN: lambda s: as_token(
        s, "reader", lambda c: c.append("t", [RecordIn.of(1)])),
    ErrorCode.TOKEN_EXPIRED: token_expired,
    ErrorCode.RATE_LIMITED: rate_limited,
    ErrorCode.REQUEST_TIMEOUT: lambda s: refused_by_connection(s, b"GET /v0/health HTTP/1.1\r\n"),
    ErrorCode.HEADERS_TOO_LARGE: lambda s: refused_by_connection(
        s, b"GET /v0/health HTTP/1.1\r\nX-Big: " + b"x" * (128 << 10)),
    ErrorCode.SERVER_BUSY: lambda s: refused_by_connection(
        s, b"GET /v0/health HTTP/1.1\r\nHost: localhost\r\n\r\n", hold=4),
    ErrorCode.TOO_MANY_STREAMS: too_many_streams,
    ErrorCode.STAGING_FULL: staging_full,
    ErrorCode.TOO_MANY_TOPICS: too_many_topics,  # last: no topic can be made after it
}  # fmt: skip


def test_every_error_code_decodes_through_the_client(tmp_path: Path) -> None:
    # A code added to the contract needs a case here.
    assert set(CASES) == set(ErrorCode)
    disk, clock = FullDisk(), FailingClock()
    engine, store, _ = open_engine(
        StorageConfig(tmp_path), EngineConfig(limits=LIMITS), clock=clock, fileio=disk
    )
    tokens = tmp_path / "tokens.toml"
    secrets = {
        "all": new_token(tokens, "all", list(ALL_SCOPES)),
        "reader": new_token(tokens, "reader", ["read:*"]),
        "brief": new_token(tokens, "brief", ["read:*"], expires_in_s=60, clock=clock),
        "slow": new_token(tokens, "slow", ["read:*"], rate_per_s=0.001),
        "wrong": "wmk_0_nope",
    }
    config = ServerConfig(http=HTTP, streams=STREAMS, auth=AuthConfig(tokens=tokens))
    app = App(config, engine=engine, store=store)
    try:
        with serving(app) as url, Client(url, token=secrets["all"]) as client:
            client.append("t", [RecordIn.of(0)])
            client.put_topic("synced", ConfigPatch(durability=Durability.FSYNC))
            target = Target(client, url, disk, clock, secrets)
            for code, case in CASES.items():
                with pytest.raises(ApiError) as refused:
                    case(target)
                error = refused.value
                assert error.code is code, (code, error)
                assert error.status == code.status and error.message
                assert isinstance(error.detail, dict)
    finally:
        engine.close()
        store.close()
