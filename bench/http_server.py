"""The server's HTTP layer: granian against uvicorn, both serving waymark (issue #16 item 5).

Run: ``.venv/bin/python bench/http_server.py [--seconds 5]``. Needs ``wrk``
(Debian: ``apt-get install -y wrk``) and granian (a dev dependency). Not a test: it
prints figures and ratios.

The same in-memory waymark :class:`~waymark.server.App` runs under each server in its
own process, one worker, on uvloop: uvicorn as ``waymark serve`` runs it (httptools,
the anchor) and granian (Rust HTTP/1, ASGI interface). wrk drives POSTs from one
thread, so on two cores the load generator and the server each get one. For context
the trivial ASGI app of ``bench/topics_http.py`` runs under both too: its ratio is the
most a server swap could give an app that does nothing. The decision rule (docs/
http-api.md, "Server"): switch if granian reaches 1.2x on one-record appends and keeps
SSE, graceful shutdown and the lifespan's final seal.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from topics_http import TOPIC, Trivial, append_body, prefill, sse_latency, wrk

HERE = Path(__file__).resolve().parent
SERVERS = ("uvicorn", "granian")
APPS = ("waymark", "trivial")
console = Console()


def waymark_app() -> object:
    """granian's factory target: a fresh in-memory waymark app."""
    from waymark.server import App

    return App()


def trivial_app() -> object:
    return Trivial()


def serve_uvicorn(app: str) -> None:
    """Child-process mode: ``waymark serve``'s uvicorn set-up on a free port."""
    import uvicorn

    from waymark.server.serving import Server, listen

    sock = listen("127.0.0.1", 0)
    print(sock.getsockname()[1], flush=True)
    if app == "waymark":
        Server(waymark_app()).run(sockets=[sock])  # type: ignore[arg-type]
    else:
        config = uvicorn.Config(trivial_app(), loop="uvloop", http="httptools",
                                lifespan="off", log_level="warning", access_log=False)  # fmt: skip
        uvicorn.Server(config).run(sockets=[sock])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def server(kind: str, app: str) -> Iterator[str]:
    if kind == "uvicorn":
        command = [sys.executable, __file__, "--serve", app]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        port = int(process.stdout.readline())
    else:
        port = free_port()
        granian = Path(sys.executable).parent / "granian"
        command = [str(granian), "--interface", "asgi", "--host", "127.0.0.1",
                   "--port", str(port), "--workers", "1", "--runtime-threads", "1",
                   "--loop", "uvloop", "--http", "1", "--no-ws", "--log-level", "warning",
                   "--working-dir", str(HERE), "--factory", f"http_server:{app}_app"]  # fmt: skip
        # Its own process group: granian runs the app in a worker process of its own.
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(400):
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
        # Killed, group and all: the trivial app's watch never ends.
        if kind == "granian":
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        process.wait()


def measure(url: str, seconds: int, sse_samples: int) -> dict[str, float]:
    got: dict[str, float] = {}
    for n in (1, 100):
        got[f"append {n}/req (records/s)"] = n * wrk(f"{url}{TOPIC}/records",
                                                     append_body(n), seconds)  # fmt: skip
    prefill(url, 10_000)
    rps = wrk(f"{url}{TOPIC}/diff", b'{"from_seq":0,"limit":1000}', seconds)
    got["diff limit 1000 (records/s)"] = rps * 1000
    p50, p99 = asyncio.run(sse_latency(url, sse_samples))
    got["SSE append→delivery p50 (ms)"] = p50
    got["SSE append→delivery p99 (ms)"] = p99
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="wrk duration per figure")
    parser.add_argument("--sse-samples", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--serve", choices=APPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_uvicorn(args.serve)
        return
    if shutil.which("wrk") is None:
        sys.exit("wrk is needed: apt-get install -y wrk")
    # The two servers alternate, round after round, in both orders: on a shared
    # machine the load drifts, and a drift then reaches both alike. Each figure is the
    # median over the rounds; the ratio of one-record appends is also shown per round.
    rounds: dict[tuple[str, str], list[dict[str, float]]] = {}
    for i in range(args.rounds):
        for app in APPS:
            for kind in SERVERS if i % 2 == 0 else SERVERS[::-1]:
                console.print(f"[bold]round {i + 1}: {app} on {kind}[/bold] …")
                with server(kind, app) as url:
                    rounds.setdefault((kind, app), []).append(
                        measure(url, args.seconds, args.sse_samples)
                    )
    figures = {key: {name: statistics.median(r[name] for r in runs) for name in runs[0]}
               for key, runs in rounds.items()}  # fmt: skip
    one = "append 1/req (records/s)"
    per_round = [
        g[one] / u[one]
        for g, u in zip(rounds["granian", "waymark"], rounds["uvicorn", "waymark"], strict=True)
    ]
    console.print("waymark one-record appends, granian/uvicorn per round: "
                  + ", ".join(f"{r:.2f}x" for r in per_round))  # fmt: skip
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    table = Table(
        title=f"granian vs uvicorn (anchor): medians of {args.rounds} alternating "
        f"rounds; load average {load}"
    )
    table.add_column("figure")
    for app in APPS:
        table.add_column(f"{app} uvicorn", justify="right")
        table.add_column(f"{app} granian", justify="right")
        table.add_column(f"{app} ratio", justify="right")
    for name in figures["uvicorn", "waymark"]:
        fmt = "{:,.2f}" if "ms" in name else "{:,.0f}"
        row = [name]
        for app in APPS:
            anchor, ours = figures["uvicorn", app][name], figures["granian", app][name]
            # >1 means granian is better: for latency the ratio is uvicorn / granian.
            ratio = anchor / ours if "ms" in name else ours / anchor
            row += [fmt.format(anchor), fmt.format(ours), f"{ratio:.2f}x"]
        table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    main()
