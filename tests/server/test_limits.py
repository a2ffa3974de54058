"""The serve limits against a real ``waymark serve`` (docs/security.md, Limits):
slowloris, oversized bodies, too many streams, topics and connections, idle keep-alive.
Each refusal is the API's error body with its status, counted on /metrics, and leaves
what is stored as it was."""

from __future__ import annotations

import asyncio
import socket
import statistics
import time

import httpx
import pytest

from waymark.client import ApiError, Client, ErrorCode
from waymark.protocol import RecordIn, TopicType

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, spawn_module_server) -> str:
    server = spawn_module_server(
        tmp_path_factory.mktemp("limited"),
        "--header-timeout-s", str(HEADER_TIMEOUT_S), "--max-body-bytes", "4096",
        "--max-streams", "2", "--max-topics", "8", "--keep-alive-s", "1",
    )  # fmt: skip
    return server.url


@pytest.fixture(scope="module")
def slow_bodies(tmp_path_factory: pytest.TempPathFactory, spawn_module_server) -> str:
    server = spawn_module_server(tmp_path_factory.mktemp("slow-bodies"),
                                 "--body-timeout-s", str(BODY_TIMEOUT_S))  # fmt: skip
    return server.url


def metric(url: str, sample: str) -> float:
    """The value of one sample (name and labels) on /metrics; 0 before it exists."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.rsplit(" ", 1)[0] == sample:
            return float(line.split()[-1])
    return 0.0


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def drip(host: str, port: int, seconds: float) -> bytes:
    """A slowloris client: a request line, then a header byte every 100 ms, never the
    blank line that ends the headers. Returns what the server answered."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /v0/health HTTP/1.1\r\nHost: localhost\r\n")
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not reader.at_eof():
            writer.write(b"X")
            await writer.drain()
            try:  # one read at a time: a cancelled read(n) loses nothing
                answer = await asyncio.wait_for(reader.read(65536), 0.1)
            except TimeoutError:
                continue
            return answer + await reader.read() if answer else b"closed"
    except ConnectionError:
        return b"reset"
    finally:
        writer.close()
    return b""


async def normal_client(url: str, rounds: int) -> list[float]:
    latencies = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        for i in range(rounds):
            start = time.perf_counter()
            assert (await http.get("/v0/health")).status_code == 200
            latencies.append(time.perf_counter() - start)
            start = time.perf_counter()
            response = await http.post("/v0/topics/calm/records", json={"records": [{"data": i}]})
            assert response.status_code == 200
            latencies.append(time.perf_counter() - start)
            await asyncio.sleep(0.01)
    return latencies


def test_slowloris_is_cut_while_a_normal_client_is_served(limited: str) -> None:
    host, port = address(limited)
    before = metric(limited, 'waymark_refusals_total{code="request_timeout"}')

    async def run() -> tuple[list[bytes], list[float]]:
        drippers = [asyncio.create_task(drip(host, port, HEADER_TIMEOUT_S * 3))
                    for _ in range(200)]  # fmt: skip
        await asyncio.sleep(0.3)  # all 200 connected and dripping
        latencies = await normal_client(limited, 100)
        return await asyncio.gather(*drippers), latencies

    answers, latencies = asyncio.run(run())
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    assert p99 < 1.0, f"p99 {p99:.3f}s, median {statistics.median(latencies):.3f}s"
    # Every dripping connection was cut: answered 408 in the API's error format and
    # closed (a drip racing the close may see the reset before the answer).
    timed_out = [a for a in answers if a.startswith(b"HTTP/1.1 408")]
    assert all(a.startswith(b"HTTP/1.1 408") or a == b"reset" for a in answers), {
        a[:40] for a in answers}  # fmt: skip
    assert len(timed_out) >= 150 and b'"code":"request_timeout"' in timed_out[0]
    after = metric(limited, 'waymark_refusals_total{code="request_timeout"}')
    assert after - before == 200


def test_an_oversized_body_is_413_and_stores_nothing(limited: str) -> None:
    with Client(limited) as client:
        client.append("sized", [RecordIn.of(0)])
        before = client.diff("sized", 0)
        big = [RecordIn.of("x" * 500) for _ in range(10)]  # ~5 KB > 4096
        with pytest.raises(ApiError) as refused:
            client.append("sized", big)
        assert refused.value.code is ErrorCode.BODY_TOO_LARGE and refused.value.status == 413
        assert refused.value.detail == {"max_bytes": 4096}
        # Declared too large up front: refused before the body is read.
        response = httpx.post(f"{limited}/v0/topics/sized/records",
                              content=iter([b'{"records":[', b"0" * 8000, b"]}"]),
                              headers={"content-length": "8014",
                                       "content-type": "application/json"})  # fmt: skip
        assert response.status_code == 413
        after = client.diff("sized", 0)
        assert (after.head_seq, len(after.records)) == (before.head_seq, len(before.records))
        with pytest.raises(ApiError):
            client.append("never-made", big)
        assert "never-made" not in [t.name for t in client.list_topics()]
    assert metric(limited, 'waymark_refusals_total{code="body_too_large"}') >= 3


def test_streams_past_the_limit_are_429(limited: str) -> None:
    with Client(limited) as client:
        client.append("streamed", [RecordIn.of(1)])
        client.put_topic("jobs", type=TopicType.QUEUE)
        state = client.get_topic("streamed", touch=False)
    with httpx.Client(base_url=limited, timeout=10) as http:
        with http.stream("GET", "/v0/topics/streamed/watch") as one, \
                http.stream("GET", "/v0/topics/jobs/work?node=w") as two:  # fmt: skip
            assert (one.status_code, two.status_code) == (200, 200)
            for path in ("/v0/topics/streamed/watch", "/v0/topics/jobs/work?node=v"):
                third = http.get(path)
                assert third.status_code == 429
                assert third.json()["error"]["code"] == "too_many_streams"
                assert third.json()["error"]["detail"] == {"max_streams": 2}
        # Both closed: the server notices, and streams open again.
        deadline = time.monotonic() + 10
        while metric(limited, "waymark_sse_streams") > 0:
            assert time.monotonic() < deadline
        with http.stream("GET", "/v0/topics/streamed/watch") as again:
            assert again.status_code == 200
    with Client(limited) as client:
        assert client.get_topic("streamed", touch=False).head_seq == state.head_seq
    assert metric(limited, 'waymark_refusals_total{code="too_many_streams"}') == 2


def test_topics_past_the_limit_are_429(start_waymark) -> None:
    server = start_waymark("--max-topics", "3")
    with Client(server.url) as client:
        for name in ("a", "b", "c"):
            client.put_topic(name)
        for make in (lambda: client.put_topic("d"),
                     lambda: client.append("d", [RecordIn.of(1)])):  # fmt: skip
            with pytest.raises(ApiError) as refused:
                make()
            assert refused.value.code is ErrorCode.TOO_MANY_TOPICS
            assert (refused.value.status, refused.value.detail) == (
                429,
                {"topic": "d", "max_topics": 3},
            )
        assert [t.name for t in client.list_topics()] == ["a", "b", "c"]
        client.delete_topic("a")  # room again
        assert client.append("d", [RecordIn.of(1)]).seqs == [1]
    assert metric(server.url, 'waymark_refusals_total{code="too_many_topics"}') == 2


def test_connections_past_the_limit_are_503(start_waymark) -> None:
    server = start_waymark("--max-connections", "4", "--header-timeout-s", "30")
    host, port = address(server.url)
    held = [socket.create_connection((host, port)) for _ in range(4)]
    try:
        with socket.create_connection((host, port)) as extra:
            extra.sendall(b"GET /v0/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            extra.settimeout(10)
            answer = b""
            while chunk := extra.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b'"code":"server_busy"' in answer and b"connection: close" in answer
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the held ones closed: a request gets through again
        try:
            if httpx.get(f"{server.url}/v0/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline
    assert metric(server.url, 'waymark_refusals_total{code="server_busy"}') >= 1


def test_an_idle_kept_alive_connection_is_closed(limited: str) -> None:
    before = metric(limited, "waymark_idle_closed_total")
    with socket.create_connection(address(limited)) as sock:
        sock.sendall(b"GET /v0/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        sock.settimeout(10)
        answer = b""
        while not answer.endswith(b'{"status":"ok"}'):  # head and body may come apart
            answer += sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert sock.recv(4096) == b""  # closed by the server, after --keep-alive-s 1
        assert 0.5 < time.monotonic() - started < 5
    assert metric(limited, "waymark_idle_closed_total") == before + 1


def _exchange(host: str, port: int, request: bytes) -> bytes:
    """Send ``request`` on a new connection and read until the server closes it."""
    with socket.create_connection((host, port)) as sock:
        sock.sendall(request)
        sock.settimeout(10)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        return answer


@pytest.mark.parametrize("upgrade", [b"websocket", b"h2c"])
def test_upgrade_requests_are_refused_and_leak_no_connection(start_waymark, upgrade) -> None:
    """An ``Upgrade`` handed the connection to uvicorn's WebSocket protocol, which never
    gave its slot back: past --max-connections of them, every client got 503 for good."""
    server = start_waymark("--max-connections", "4")
    host, port = address(server.url)
    request = (
        b"GET /v0/health HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: " + upgrade
        + b"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )  # fmt: skip
    for _ in range(12):  # three times the limit
        answer = _exchange(host, port, request)
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert b'"code":"invalid_request"' in answer and b"connection: close" in answer
    deadline = time.monotonic() + 10
    while metric(server.url, "waymark_connections") > 1:  # the /metrics one itself
        assert time.monotonic() < deadline, "upgraded connections still count as open"
    assert httpx.get(f"{server.url}/v0/health", timeout=5).status_code == 200


async def drip_body(host: str, port: int, seconds: float) -> tuple[bytes, float]:
    """Whole headers declaring a 100 kB body, then a byte of it every 200 ms. Returns
    what the server answered and after how long."""
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    writer.write(b"POST /v0/topics/dripped/records HTTP/1.1\r\nHost: localhost\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")  # fmt: skip
    try:
        while time.monotonic() - started < seconds:
            try:
                answer = await asyncio.wait_for(reader.read(65536), 0.2)
            except TimeoutError:
                writer.write(b" ")
                await writer.drain()
                continue
            return answer + await reader.read(), time.monotonic() - started
    except ConnectionError:
        return b"reset", time.monotonic() - started
    finally:
        writer.close()
    return b"", time.monotonic() - started


def test_a_dripped_body_is_cut_while_a_normal_client_is_served(slow_bodies: str) -> None:
    """Headers on time, then a body a byte at a time: such requests were never cut, and
    enough of them held every connection (health checks got 503)."""
    host, port = address(slow_bodies)
    before = metric(slow_bodies, 'waymark_refusals_total{code="request_timeout"}')

    async def run() -> tuple[list[tuple[bytes, float]], list[float]]:
        drippers = [asyncio.create_task(drip_body(host, port, BODY_TIMEOUT_S * 10))
                    for _ in range(100)]  # fmt: skip
        latencies = await normal_client(slow_bodies, 50)
        return await asyncio.gather(*drippers), latencies

    answers, latencies = asyncio.run(run())
    assert max(latencies) < 2.0
    for answer, seconds in answers:
        assert answer.startswith(b"HTTP/1.1 408") or answer == b"reset", answer[:60]
        assert seconds < BODY_TIMEOUT_S * 5  # 1 s and a few dripped bytes, not forever
    after = metric(slow_bodies, 'waymark_refusals_total{code="request_timeout"}')
    assert after - before == 100
    response = httpx.get(f"{slow_bodies}/v0/topics/dripped")
    assert response.status_code == 404  # nothing of them was stored


def test_a_large_body_on_a_slow_link_still_arrives(slow_bodies: str) -> None:
    """Each byte received earns time (1 s per 64 KiB): 150 kB sent in pieces over 2 s,
    past the 1 s body timeout, is served."""
    host, port = address(slow_bodies)
    data = b'"' + b"x" * 150_000 + b'"'
    body = b'{"records":[{"data":%b}]}' % data

    async def send() -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /v0/topics/slow-link/records HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(body))  # fmt: skip
        for i in range(0, len(body), len(body) // 8 + 1):
            writer.write(body[i : i + len(body) // 8 + 1])
            await writer.drain()
            await asyncio.sleep(0.25)
        answer = await reader.readuntil(b"}")
        writer.close()
        return answer

    assert asyncio.run(send()).startswith(b"HTTP/1.1 200")


def test_headers_past_the_limit_are_431_and_a_large_body_is_not(slow_bodies: str) -> None:
    """Header bytes were unbounded (940 MiB of one header buffered from one connection)."""
    host, port = address(slow_bodies)
    with socket.create_connection((host, port)) as sock:
        sock.settimeout(10)
        sock.sendall(b"GET /v0/health HTTP/1.1\r\nHost: localhost\r\nX-Big: ")
        answer, sent = b"", 0
        try:
            while sent < 8 << 20:  # the server answers long before 8 MiB
                sock.sendall(b"x" * 65536)
                sent += 65536
        except OSError:  # closed by the server while sending
            pass
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
    assert b'"code":"headers_too_large"' in answer
    headers = {"x-fine": "y" * 16_000, "content-type": "application/json"}  # large, legal
    body = b'{"records":[{"data":"' + b"z" * 300_000 + b'"}]}'
    answer = httpx.post(f"{slow_bodies}/v0/topics/big-headers/records", headers=headers,
                        content=body)  # fmt: skip
    assert answer.status_code == 200, answer.text


def _ask(sock: socket.socket) -> bytes:
    """One health request on ``sock``; the answer as read until the server closes or
    one whole small answer has arrived."""
    sock.sendall(b"GET /v0/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    sock.settimeout(10)
    answer = b""
    while not answer.endswith(b"}") and (chunk := sock.recv(4096)):
        answer += chunk
    return answer


def test_connections_past_the_per_address_limit_are_503(start_waymark) -> None:
    """One client address cannot hold every connection of the server: past
    --max-connections-per-address its next one is 503 server_busy and closed, while
    another address (127.0.0.2, loopback too) is served."""
    server = start_waymark("--max-connections-per-address", "3", "--header-timeout-s", "30")
    host, port = address(server.url)
    held = [socket.create_connection((host, port)) for _ in range(3)]
    try:
        assert all(_ask(sock).startswith(b"HTTP/1.1 200") for sock in held)
        with socket.create_connection((host, port)) as extra:
            answer = _ask(extra)
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b'"code":"server_busy"' in answer and b"connection: close" in answer
        assert b'"max_connections_per_address":3' in answer
        with socket.create_connection((host, port), source_address=("127.0.0.2", 0)) as other:
            assert _ask(other).startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the held ones closed: this address gets through again
        with socket.create_connection((host, port)) as sock:
            if _ask(sock).startswith(b"HTTP/1.1 200"):
                break
        assert time.monotonic() < deadline
