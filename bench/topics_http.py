"""HTTP /v0 throughput and SSE latency, each beside a trivial in-memory ASGI app.

Run: ``.venv/bin/python bench/topics_http.py [--seconds 5]``. Needs ``wrk``
(Debian: ``apt-get install -y wrk``). Not a test: it prints figures and ratios.

Both servers run in their own process on the same uvicorn set-up (uvloop,
httptools, no access log); wrk drives the POSTs from one thread, so on two
cores the load generator and the server each get one. Two anchors run in the
same session: ``trivial`` is the Python HTTP ceiling (it appends the raw body to a
list and answers a small JSON, never looking inside), and ``trivial+parse`` is the
smallest in-memory log that actually holds records (it decodes the body with
orjson and keeps the records list).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
LUA = HERE / "topics_http.lua"
RECORD = {"data": {"user": "u-1842", "event": "click", "path": "/checkout", "n": 7}}
TOPIC = "/v0/topics/bench"
ANCHORS = ("trivial", "trivial+parse")
console = Console()


# --- the trivial app (the anchor) ------------------------------------------------------

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Trivial:
    """Appends POST bodies to a list; a diff answers the latest body verbatim (after the
    prefill, 1000 records); a watch streams each appended body. No validation, no seq.
    With ``parse`` it also decodes each appended body and keeps its records."""

    def __init__(self, parse: bool = False) -> None:
        self.parse = parse
        self.records: list[Any] = []
        self.bodies: list[bytes] = []
        self.watchers: list[asyncio.Queue[bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path.endswith("/watch"):
            await self._watch(send)
            return
        message = await receive()
        body = message.get("body", b"")
        while message.get("more_body"):
            message = await receive()
            body += message.get("body", b"")
        if path.endswith("/diff"):
            out = self.bodies[-1]
        else:
            self.bodies.append(body)
            if self.parse:
                self.records.extend(orjson.loads(body)["records"])
            for queue in self.watchers:
                queue.put_nowait(body)
            out = b'{"ok":true,"n":%d}' % len(self.bodies)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"%d" % len(out))]})  # fmt: skip
        await send({"type": "http.response.body", "body": out})

    async def _watch(self, send: Send) -> None:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.watchers.append(queue)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        while True:
            body = await queue.get()
            await send({"type": "http.response.body", "body": b"data: " + body + b"\n\n",
                        "more_body": True})  # fmt: skip


def serve(kind: str) -> None:
    """Child-process mode: serve one app on a free port and print it."""
    import uvicorn

    from waymark.server import App
    from waymark.server.serving import Server, listen

    sock = listen("127.0.0.1", 0)
    print(sock.getsockname()[1], flush=True)
    if kind == "waymark":
        Server(App()).run(sockets=[sock])
    else:
        app = Trivial(parse=kind == "trivial+parse")
        config = uvicorn.Config(app, loop="uvloop", http="httptools", lifespan="off",
                                log_level="warning", access_log=False)  # fmt: skip
        uvicorn.Server(config).run(sockets=[sock])


@contextmanager
def server(kind: str) -> Iterator[str]:
    process = subprocess.Popen([sys.executable, __file__, "--serve", kind], stdout=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        assert process.stdout is not None
        url = f"http://127.0.0.1:{process.stdout.readline().strip()}"
        for _ in range(200):
            try:
                httpx.post(
                    f"{url}{TOPIC}/records",
                    content=b'{"records":[{"data":0}]}',
                    headers={"content-type": "application/json"},
                )
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield url
    finally:
        # The trivial app's watch never ends, so uvicorn would wait for it: kill.
        process.kill()
        process.wait()


# --- measurements ---------------------------------------------------------------------


def wrk(url: str, body: bytes, seconds: int, connections: int = 32) -> float:
    """Requests per second for POSTs of ``body``."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(body)
        f.flush()
        result = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(LUA), url],
            env={**os.environ, "WAYMARK_BODY": f.name}, capture_output=True, text=True,
            check=True,
        )  # fmt: skip
    if "Non-2xx" in result.stdout:
        raise RuntimeError(f"wrk saw errors:\n{result.stdout}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", result.stdout)[1])  # type: ignore[index]


def append_body(n: int) -> bytes:
    return orjson.dumps({"records": [RECORD] * n})


def prefill(url: str, n: int) -> None:
    with httpx.Client() as client:
        for _ in range(n // 1000):
            response = client.post(
                f"{url}{TOPIC}/records",
                content=append_body(1000),
                headers={"content-type": "application/json"},
            )
            response.raise_for_status()


async def sse_latency(url: str, samples: int) -> tuple[float, float]:
    """p50/p99 ms from starting an append to reading its SSE event, one at a time."""
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        head = (await client.post(f"{TOPIC}/diff", json={"from_seq": 0, "limit": 1})).json()
        from_seq = head.get("head_seq", 0)
        async with client.stream("GET", f"{TOPIC}/watch", params={"from_seq": from_seq}) as stream:
            lines = stream.aiter_lines()
            for i in range(samples):
                body = orjson.dumps({"records": [{"data": {"i": i}}]})
                start = time.perf_counter()
                answer = await client.post(
                    f"{TOPIC}/records", content=body, headers={"content-type": "application/json"}
                )
                answer.raise_for_status()  # else the wait below never ends
                async for line in lines:
                    if line.startswith("data:"):
                        break
                latencies.append((time.perf_counter() - start) * 1000)
    latencies.sort()
    return statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="wrk duration per figure")
    parser.add_argument("--sse-samples", type=int, default=2000)
    parser.add_argument("--serve", choices=["waymark", *ANCHORS], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if shutil.which("wrk") is None:
        sys.exit("wrk is needed: apt-get install -y wrk")

    figures: dict[str, dict[str, float]] = {}
    for kind in (*ANCHORS, "waymark"):
        console.print(f"[bold]{kind}[/bold]: measuring …")
        got = figures[kind] = {}
        with server(kind) as url:
            for n in (1, 100):
                rps = wrk(f"{url}{TOPIC}/records", append_body(n), args.seconds)
                got[f"append {n}/req (records/s)"] = rps * n
            prefill(url, 10_000)
            rps = wrk(f"{url}{TOPIC}/diff", b'{"from_seq":0,"limit":1000}', args.seconds)
            got["diff limit 1000 (records/s)"] = rps * 1000
            p50, p99 = asyncio.run(sse_latency(url, args.sse_samples))
            got["SSE append→delivery p50 (ms)"] = p50
            got["SSE append→delivery p99 (ms)"] = p99

    table = Table(title="waymark /v0 vs trivial in-memory ASGI apps (same uvicorn, same run)")
    table.add_column("figure")
    table.add_column("waymark", justify="right")
    for anchor in ANCHORS:
        table.add_column(anchor, justify="right")
        table.add_column(f"ratio vs {anchor}", justify="right")
    for name, ours in figures["waymark"].items():
        fmt = "{:,.2f}" if "ms" in name else "{:,.0f}"
        row = [name, fmt.format(ours)]
        for anchor in ANCHORS:
            theirs = figures[anchor][name]
            # >1 is better for waymark: for latency the ratio is anchor / waymark.
            ratio = theirs / ours if "ms" in name else ours / theirs
            row += [fmt.format(theirs), f"{ratio:.2f}x"]
        table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    main()
