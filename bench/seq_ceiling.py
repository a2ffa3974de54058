"""The cost of the seq ceiling on ``disk`` appends: this checkout beside another one.

Run: ``.venv/bin/python bench/seq_ceiling.py --baseline-src DIR [--seconds 3]``, where
``DIR`` is the ``src`` folder of the code to compare with, e.g. from
``git archive <commit> src | tar -x -C /tmp/baseline``. Not a test: it prints figures
and ratios from one run, each variant measured in its own process, alternating.

- ``engine``: the engine over a real WAL in one process, acking as the server does
  (a ``must_sync`` append is acknowledged once its commit is durable). One producer
  of 1-record and of 100-record appends back to back; 32 concurrent producers of one
  record each; and a sporadic producer, one record every 150 ms, timed from the append
  to its ack. Where the engine has ``trim_ceilings`` a task calls it every 50 ms, as
  ``waymark serve`` does. Besides records/s: the process's CPU per record, and how many
  acks had to wait for a sync.
- ``http``: a real ``waymark serve --data-dir`` process; one keep-alive client of
  1-record appends back to back, and one record every 150 ms (request to answer).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

VENV_BIN = Path(sys.executable).parent
TRIM_S = 0.05
SPORADIC_GAP_S = 0.15


# --- the measurements, run in a child process whose PYTHONPATH picks the code -----------


async def engine_figures(seconds: float, sporadic: int) -> dict[str, float]:
    from waymark.log import ConfigPatch, Durability, RecordIn
    from waymark.log.config import StorageConfig
    from waymark.log.storage.restore import open_engine

    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="waymark-bench-") as tmp:
        engine, store, _ = open_engine(StorageConfig(Path(tmp)))
        trim = getattr(engine, "trim_ceilings", None)

        async def trimmer() -> None:
            while trim is not None:
                await asyncio.sleep(TRIM_S)
                trim()

        trimming = asyncio.ensure_future(trimmer())

        waits = 0

        async def append(topic: str, batch: list) -> None:
            nonlocal waits
            result = engine.append(topic, batch)
            if result.must_sync and result.commit is not None:
                waits += 1
                await result.commit.wait()

        async def producer(topic: str, batch: list, until: float) -> int:
            n = 0
            while time.perf_counter() < until:
                await append(topic, batch)
                n += 1
                if n % 64 == 0:
                    await asyncio.sleep(0)  # let the trimmer run, as a server's loop would
            return n

        one = [RecordIn.of({"user": "u-1842", "event": "click", "n": 7})]
        for name, batch, tasks in (("1 record x1", one, 1), ("100 records x1", one * 100, 1),
                                   ("1 record x32", one, 32)):  # fmt: skip
            topic = f"t-{len(figures)}"
            engine.put_topic(topic, ConfigPatch(durability=Durability.DISK))
            until = time.perf_counter() + seconds
            waits, cpu = 0, time.process_time()
            counts = await asyncio.gather(*(producer(topic, batch, until) for _ in range(tasks)))
            records = sum(counts) * len(batch)
            figures[f"engine {name}: records/s"] = records / seconds
            # CPU of the whole process (the WAL writer included) per record: what the
            # other tenants of a shared machine disturb least.
            figures[f"engine {name}: CPU ns/record"] = (time.process_time() - cpu) / records * 1e9
            figures[f"engine {name}: acks waiting/s"] = waits / seconds
        engine.put_topic("sporadic", ConfigPatch(durability=Durability.DISK))
        latencies = []
        for _ in range(sporadic):
            await asyncio.sleep(SPORADIC_GAP_S)
            started = time.perf_counter()
            await append("sporadic", one)
            latencies.append((time.perf_counter() - started) * 1e6)
        figures["engine sporadic: ack p50 us"] = statistics.median(latencies)
        figures["engine sporadic: ack p90 us"] = statistics.quantiles(latencies, n=10)[-1]
        trimming.cancel()
        store.close()
    return figures


def http_figures(seconds: float, sporadic: int) -> dict[str, float]:
    import httpx

    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="waymark-bench-") as tmp:
        process = subprocess.Popen(
            [str(VENV_BIN / "waymark"), "serve", "--port", "0", "--data-dir", tmp],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            assert process.stdout is not None
            url = process.stdout.readline().split()[-1]
            body = orjson.dumps({"records": [{"data": {"user": "u-1842", "n": 7}}]})
            headers = {"content-type": "application/json"}
            with httpx.Client(base_url=url, timeout=10) as http:
                while True:
                    try:
                        if http.get("/v0/health").status_code == 200:
                            break
                    except httpx.TransportError:
                        time.sleep(0.05)
                http.put("/v0/topics/d", json={"durability": "disk"}).raise_for_status()
                n, until = 0, time.perf_counter() + seconds
                while time.perf_counter() < until:
                    http.post("/v0/topics/d/records", content=body, headers=headers)
                    n += 1
                figures["http 1 record x1: appends/s"] = n / seconds
                latencies = []
                for _ in range(sporadic):
                    time.sleep(SPORADIC_GAP_S)
                    started = time.perf_counter()
                    http.post("/v0/topics/d/records", content=body, headers=headers)
                    latencies.append((time.perf_counter() - started) * 1e6)
                figures["http sporadic: answer p50 us"] = statistics.median(latencies)
                figures["http sporadic: answer p90 us"] = statistics.quantiles(latencies, n=10)[-1]
        finally:
            process.terminate()
            process.wait(15)
    return figures


# --- the driver ---------------------------------------------------------------------------


def run_variant(src: str, seconds: float, sporadic: int, what: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src}
    result = subprocess.run(
        [sys.executable, __file__, "--child", what, "--seconds", str(seconds),
         "--sporadic", str(sporadic)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return orjson.loads(result.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", required=False, help="src folder of the other code")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sporadic", type=int, default=40, help="sporadic appends timed")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the variants")
    parser.add_argument("--child", choices=["engine", "http"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "engine":
        print(orjson.dumps(asyncio.run(engine_figures(args.seconds, args.sporadic))).decode())
        return
    if args.child == "http":
        print(orjson.dumps(http_figures(args.seconds, args.sporadic)).decode())
        return
    here = str(Path(__file__).resolve().parent.parent / "src")
    variants = {"this": here, "baseline": args.baseline_src}
    runs: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    for _ in range(args.rounds):
        for name in ("baseline", "this"):
            figures = {}
            for what in ("engine", "http"):
                figures.update(run_variant(variants[name], args.seconds, args.sporadic, what))
            runs[name].append(figures)
    print(f"{'figure':40} {'baseline':>12} {'this':>12} {'ratio':>7}")
    for key in runs["this"][0]:
        old = statistics.median(r[key] for r in runs["baseline"])
        new = statistics.median(r[key] for r in runs["this"])
        print(f"{key:40} {old:12,.0f} {new:12,.0f} {new / old:6.2f}x")
    one, five, _ = os.getloadavg()
    print(f"medians of {args.rounds} alternating runs; load average {one:.2f} / {five:.2f} "
          f"on {os.cpu_count()} cores")  # fmt: skip


if __name__ == "__main__":
    main()
