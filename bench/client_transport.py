"""The Python client's transport against the alternatives, one run, ratios to a raw socket.

Run: ``.venv/bin/python bench/client_transport.py [--seconds 2]``. Not a test: it prints
figures and ratios (docs/client.md, "Transport: the measurements").

One ``waymark serve`` process (its own core on a 2-core machine) answers every client
in turn, on one ephemeral topic (no WAL, so the server's part is as small as it gets
and the client's cost shows). Each client runs a sequential loop on one kept-alive
connection:

- **append**: one one-record append per request, the same request body for every
  client. The anchor is a raw keep-alive socket client sending the same bytes and
  reading the answer by its Content-Length, decoding nothing (the issue's target row:
  goal >= 0.8x). Every other client decodes the answer into ``AppendResponse``.
- **diff**: a page of 1000 records per request, each client decoding it with the same
  ``DiffResponse[msgspec.Raw]`` decoder the waymark client's ``diff_raw`` uses; the anchor
  (a raw socket) too, so the ratio is the transport's.

The clients of one side and workload take turns (``--rounds`` short turns each), so a
change in the machine's load falls on all of them alike; a rate is the median of a
client's turns. ``cpu µs/req`` is this process's CPU time (``time.process_time``) per
request over all turns: what a client spends besides waiting for the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpcore
import httpx
import msgspec
import urllib3
from rich.console import Console
from rich.table import Table

from waymark.client import AsyncClient, Client, ConfigPatch, RecordIn
from waymark.protocol import AppendRequest, AppendResponse, DiffRequest, DiffResponse

TOPIC = "bench"
RECORD = {"user": "u-1842", "event": "click", "path": "/checkout", "n": 7}
PAGE = 1000
APPEND_PATH = f"/v0/topics/{TOPIC}/records"
DIFF_PATH = f"/v0/topics/{TOPIC}/diff"
APPEND_BODY = msgspec.json.encode(AppendRequest([RecordIn.of(RECORD)]))
DIFF_BODY = msgspec.json.encode(DiffRequest(0, PAGE))
HEADERS = {"content-type": "application/json"}
decode_append = msgspec.json.Decoder(AppendResponse).decode
decode_page = msgspec.json.Decoder(DiffResponse[msgspec.Raw]).decode
console = Console(width=120)


# --- the server ---------------------------------------------------------------------------


def start_server(data_dir: str) -> tuple[subprocess.Popen[str], str]:
    waymark = str(Path(sys.executable).parent / "waymark")
    command = [waymark, "serve", "--port", "0", "--data-dir", data_dir]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert process.stdout is not None
    if not select.select([process.stdout], [], [], 30)[0]:
        process.kill()
        raise RuntimeError("waymark serve printed nothing within 30 s")
    line = process.stdout.readline()
    return process, line.strip().rpartition(" ")[2]


# --- the anchors: raw keep-alive sockets ------------------------------------------------


def _raw_request(url: str, path: str, body: bytes) -> bytes:
    host = url.removeprefix("http://")
    head = f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
    return f"{head}content-length: {len(body)}\r\n\r\n".encode() + body


def _split_answer(buffer: bytearray) -> int:
    """The answer's total length once its head is in ``buffer``, else -1."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return -1
    at = buffer.find(b"content-length:", 0, end) + 15
    return end + 4 + int(buffer[at : buffer.find(b"\r\n", at)])


class RawSocket:
    """The anchor: a keep-alive socket, prebuilt request bytes, framing by Content-Length."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.append_bytes = _raw_request(url, APPEND_PATH, APPEND_BODY)
        self.diff_bytes = _raw_request(url, DIFF_PATH, DIFF_BODY)

    def exchange(self, request: bytes) -> bytes:
        """Send ``request``; the answer's body, received straight into one buffer."""
        self.sock.sendall(request)
        head = bytearray()
        while (total := _split_answer(head)) < 0:
            head += self.sock.recv(262144)
        start = head.find(b"\r\n\r\n") + 4
        body = bytearray(total - start)
        got = len(head) - start
        body[:got] = head[start:]
        view = memoryview(body)
        while got < len(body):
            got += self.sock.recv_into(view[got:])
        return body

    def append(self) -> None:
        self.exchange(self.append_bytes)

    def diff(self) -> None:
        decode_page(self.exchange(self.diff_bytes))

    def close(self) -> None:
        self.sock.close()


class AsyncRawSocket:
    """The asyncio anchor: asyncio streams, prebuilt bytes, framing by Content-Length."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.append_bytes = _raw_request(url, APPEND_PATH, APPEND_BODY)
        self.diff_bytes = _raw_request(url, DIFF_PATH, DIFF_BODY)

    async def open(self) -> None:
        host, port = self.url.removeprefix("http://").split(":")
        self.reader, self.writer = await asyncio.open_connection(host, int(port))

    async def exchange(self, request: bytes) -> bytes:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        at = head.find(b"content-length:") + 15
        return await self.reader.readexactly(int(head[at : head.find(b"\r\n", at)]))

    async def append(self) -> None:
        await self.exchange(self.append_bytes)

    async def diff(self) -> None:
        decode_page(await self.exchange(self.diff_bytes))

    async def close(self) -> None:
        self.writer.close()


# --- the contenders -----------------------------------------------------------------------


@dataclass
class Sync:
    append: Callable[[], object]
    diff: Callable[[], object]
    close: Callable[[], object]


@dataclass
class Async:
    append: Callable[[], Awaitable[object]]
    diff: Callable[[], Awaitable[object]]
    close: Callable[[], Awaitable[object]]


def waymark_sync(client: Client) -> Sync:
    record = [RecordIn.of(RECORD)]
    return Sync(lambda: client.append(TOPIC, record),
                lambda: client.diff_raw(TOPIC, 0, limit=PAGE), client.close)  # fmt: skip


def waymark_async(client: AsyncClient) -> Async:
    record = [RecordIn.of(RECORD)]
    return Async(lambda: client.append(TOPIC, record),
                 lambda: client.diff_raw(TOPIC, 0, limit=PAGE), client.aclose)  # fmt: skip


def httpx_sync(url: str) -> Sync:
    http = httpx.Client(base_url=url)
    return Sync(lambda: decode_append(http.post(APPEND_PATH, content=APPEND_BODY,
                                                headers=HEADERS).content),
                lambda: decode_page(http.post(DIFF_PATH, content=DIFF_BODY,
                                              headers=HEADERS).content),
                http.close)  # fmt: skip


def httpcore_sync(url: str) -> Sync:
    pool = httpcore.ConnectionPool()
    append_url, diff_url = url + APPEND_PATH, url + DIFF_PATH
    return Sync(lambda: decode_append(pool.request("POST", append_url, headers=HEADERS,
                                                   content=APPEND_BODY).content),
                lambda: decode_page(pool.request("POST", diff_url, headers=HEADERS,
                                                 content=DIFF_BODY).content),
                pool.close)  # fmt: skip


def urllib3_sync(url: str) -> Sync:
    host, port = url.removeprefix("http://").split(":")
    pool = urllib3.HTTPConnectionPool(host, int(port), maxsize=1)
    return Sync(lambda: decode_append(pool.urlopen("POST", APPEND_PATH, body=APPEND_BODY,
                                                   headers=HEADERS).data),
                lambda: decode_page(pool.urlopen("POST", DIFF_PATH, body=DIFF_BODY,
                                                 headers=HEADERS).data),
                pool.close)  # fmt: skip


def httpx_async(url: str) -> Async:
    http = httpx.AsyncClient(base_url=url)

    async def append() -> None:
        decode_append((await http.post(APPEND_PATH, content=APPEND_BODY, headers=HEADERS)).content)

    async def diff() -> None:
        decode_page((await http.post(DIFF_PATH, content=DIFF_BODY, headers=HEADERS)).content)

    return Async(append, diff, http.aclose)


def httpcore_async(url: str) -> Async:
    pool = httpcore.AsyncConnectionPool()
    append_url, diff_url = url + APPEND_PATH, url + DIFF_PATH

    async def append() -> None:
        answer = await pool.request("POST", append_url, headers=HEADERS, content=APPEND_BODY)
        decode_append(answer.content)

    async def diff() -> None:
        answer = await pool.request("POST", diff_url, headers=HEADERS, content=DIFF_BODY)
        decode_page(answer.content)

    return Async(append, diff, pool.aclose)


def aiohttp_async(url: str) -> Async:
    session = aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=1))

    async def append() -> None:
        async with session.post(APPEND_PATH, data=APPEND_BODY, headers=HEADERS) as answer:
            decode_append(await answer.read())

    async def diff() -> None:
        async with session.post(DIFF_PATH, data=DIFF_BODY, headers=HEADERS) as answer:
            decode_page(await answer.read())

    return Async(append, diff, session.close)


# --- timing -------------------------------------------------------------------------------


@dataclass
class Figure:
    """One client on one workload: its rounds' rates, and its requests and CPU in all."""

    rates: list[float]
    requests: int = 0
    cpu_s: float = 0.0

    @property
    def per_s(self) -> float:
        return statistics.median(self.rates)

    @property
    def cpu_us(self) -> float:
        return self.cpu_s / self.requests * 1e6


def timed_sync(step: Callable[[], object], seconds: float, figure: Figure) -> None:
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() < start + seconds or n == 0:
        for _ in range(20):
            step()
        n += 20
    figure.rates.append(n / (time.perf_counter() - start))
    figure.requests += n
    figure.cpu_s += time.process_time() - cpu


async def timed_async(step: Callable[[], Awaitable[object]], seconds: float,
                      figure: Figure) -> None:  # fmt: skip
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() < start + seconds or n == 0:
        for _ in range(20):
            await step()
        n += 20
    figure.rates.append(n / (time.perf_counter() - start))
    figure.requests += n
    figure.cpu_s += time.process_time() - cpu


def measure(url: str, seconds: float, rounds: int) -> dict[tuple[str, str, str], Figure]:
    """Every client of a side and workload takes turns, ``rounds`` short turns each, so
    a change in the machine's load falls on all of them alike; a figure is the median
    of its turns."""
    figures: dict[tuple[str, str, str], Figure] = {}
    turn = seconds / rounds
    sync_clients: dict[str, Callable[[], Sync]] = {
        "raw socket (anchor)": lambda: (r := RawSocket(url)) and Sync(r.append, r.diff, r.close),
        "waymark Client": lambda: waymark_sync(Client(url)),
        "waymark Client on httpx (before)": lambda: waymark_sync(
            Client(url, http=httpx.Client(base_url=url))),
        "httpx": lambda: httpx_sync(url),
        "httpcore": lambda: httpcore_sync(url),
        "urllib3": lambda: urllib3_sync(url),
    }  # fmt: skip
    for kind in ("append", "diff"):
        clients = {name: make() for name, make in sync_clients.items()}
        for name, client in clients.items():
            figures["sync", kind, name] = Figure([])
            for _ in range(50):
                getattr(client, kind)()  # warm up: connect, first requests
        for _ in range(rounds):
            for name, client in clients.items():
                timed_sync(getattr(client, kind), turn, figures["sync", kind, name])
        for name, client in clients.items():
            client.close()
            console.log(f"sync {kind:6} {name}: {figures['sync', kind, name].per_s:,.0f}/s")

    async def make_raw() -> Async:
        raw = AsyncRawSocket(url)
        await raw.open()
        return Async(raw.append, raw.diff, raw.close)

    async def wrap(make: Callable[[], Async]) -> Async:
        return make()

    async_clients: dict[str, Callable[[], Awaitable[Async]]] = {
        "raw socket (anchor)": make_raw,
        "waymark AsyncClient": lambda: wrap(lambda: waymark_async(AsyncClient(url))),
        "waymark AsyncClient on httpx (before)": lambda: wrap(lambda: waymark_async(
            AsyncClient(url, http=httpx.AsyncClient(base_url=url)))),
        "httpx": lambda: wrap(lambda: httpx_async(url)),
        "httpcore": lambda: wrap(lambda: httpcore_async(url)),
        "aiohttp": lambda: wrap(lambda: aiohttp_async(url)),
    }  # fmt: skip

    async def run_all() -> None:
        for kind in ("append", "diff"):
            clients = {name: await make() for name, make in async_clients.items()}
            for name, client in clients.items():
                figures["async", kind, name] = Figure([])
                for _ in range(50):
                    await getattr(client, kind)()
            for _ in range(rounds):
                for name, client in clients.items():
                    await timed_async(getattr(client, kind), turn, figures["async", kind, name])
            for name, client in clients.items():
                await client.close()
                console.log(f"async {kind:6} {name}: {figures['async', kind, name].per_s:,.0f}/s")

    asyncio.run(run_all())
    return figures


def report(figures: dict[tuple[str, str, str], Figure], load: tuple[float, ...]) -> None:
    table = Table(title=f"client transport, one run (load average {load[0]:.2f}, "
                        f"{os.cpu_count()} cores)")  # fmt: skip
    for column in ("client", "workload", "requests/s", "records/s", "vs anchor", "cpu µs/req"):
        table.add_column(column, justify="left" if column in ("client", "workload") else "right")
    for (side, kind, name), figure in figures.items():
        anchor = figures[side, kind, "raw socket (anchor)"]
        records = figure.per_s * (PAGE if kind == "diff" else 1)
        table.add_row(f"{side}: {name}", kind, f"{figure.per_s:,.0f}", f"{records:,.0f}",
                      f"{figure.per_s / anchor.per_s:.2f}x", f"{figure.cpu_us:,.0f}")  # fmt: skip
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per case")
    parser.add_argument("--rounds", type=int, default=10, help="turns each case's time is cut in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        process, url = start_server(data_dir)
        try:
            with Client(url) as client:
                client.put_topic(TOPIC, ConfigPatch(durable=False, cap_records=100_000))
                client.append(TOPIC, [RecordIn.of(RECORD)] * PAGE)
            figures = measure(url, args.seconds, args.rounds)
            load = os.getloadavg()
        finally:
            process.terminate()
            process.wait(10)
    report(figures, load)


if __name__ == "__main__":
    main()
