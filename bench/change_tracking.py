"""What change checkpoints cost appends (docs/recovery.md, "Costs and figures").

Run: ``.venv/bin/python bench/change_tracking.py [--seconds 5] [--rounds 2]``. Needs
``wrk`` (Debian: ``apt-get install -y wrk``). Not a test: it prints figures and ratios.

**Over HTTP.** ``waymark serve`` with a data directory, run twice per round: with change
checkpoints (``--checkpoint-interval-s 1``, the default) and without (``0``, the
anchor: the server notes no change at all). wrk drives one-record appends and appends
of 100 records from one thread, each record tagged with one of 10 000 keys (so a
checkpoint names up to 10 000 keys a second), to a ``disk`` topic (the default class)
and to a ``memory`` one. Modes alternate within a round; the best of the rounds counts.

**In the engine.** The same appends straight into an in-memory :class:`Engine`, with
change tracking and one checkpoint per 20 000 records against none, in CPU time.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from waymark.log import Engine, RecordIn
from waymark.log.records import encode_batch

HERE = Path(__file__).resolve().parent
LUA = HERE / "change_tracking.lua"
WAYMARK = str(Path(sys.executable).parent / "waymark")
KEYS = 10_000


@contextmanager
def serve(interval_s: float) -> Iterator[str]:
    """A ``waymark serve`` on a free port and a fresh data directory; its base URL."""
    with tempfile.TemporaryDirectory(prefix="waymark-bench-") as data:
        process = subprocess.Popen(
            [WAYMARK, "serve", "--port", "0", "--data-dir", data,
             "--checkpoint-interval-s", str(interval_s)],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], 30)
            assert ready, "waymark serve printed nothing"
            url = process.stdout.readline().removeprefix("waymark listening on ").split()[0]
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{url}/v0/health").status_code == 200:
                        break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "waymark serve does not answer"
                    time.sleep(0.05)
            for topic, durability in (("disk", "disk"), ("memory", "memory")):
                httpx.put(
                    f"{url}/v0/topics/{topic}",
                    json={"durability": durability, "cap_records": 2_000_000},
                )
            yield url
        finally:
            process.terminate()
            process.wait(30)


def wrk(url: str, batch: int, seconds: int) -> float:
    """Records per second of appends of ``batch`` records."""
    result = subprocess.run(
        ["wrk", "-t1", "-c32", f"-d{seconds}s", "-s", str(LUA), url],
        env={**os.environ, "WAYMARK_BATCH": str(batch)}, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    if "Non-2xx" in result.stdout:
        raise RuntimeError(f"wrk saw errors:\n{result.stdout}")
    requests = float(re.search(r"Requests/sec:\s+([\d.]+)", result.stdout)[1])  # type: ignore[index]
    return requests * batch


def engine_rate(track: bool, batch: int, records: int = 200_000, every: int = 20_000) -> float:
    """Records per CPU second of in-memory engine appends."""
    engine = Engine()
    if track:
        engine.track_changes(86_400_000)
    records_of = [
        [RecordIn.of({"order": k, "total": 12.5}, tag=f"o{k}") for k in range(s, s + batch)]
        for s in range(0, KEYS, batch)
    ]
    bodies = [encode_batch(records, engine.limits) for records in records_of]
    start = time.process_time()
    done = 0
    while done < records:
        engine.append_encoded("t", bodies[(done // batch) % len(bodies)], create=True)
        done += batch
        if track and done % every < batch:
            engine.emit_checkpoint()
    return records / (time.process_time() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    console = Console()
    best: dict[tuple[str, str, int], float] = {}
    for round_ in range(args.rounds):
        for mode, interval in (("off", 0.0), ("on", 1.0)):
            with serve(interval) as url:
                for topic in ("disk", "memory"):
                    for batch in (1, 100):
                        console.print(f"round {round_ + 1}: checkpoints {mode}, {topic}, "
                                      f"{batch} per append", style="dim")  # fmt: skip
                        rate = wrk(f"{url}/v0/topics/{topic}/records", batch, args.seconds)
                        key = (mode, topic, batch)
                        best[key] = max(best.get(key, 0.0), rate)
    engine: dict[tuple[bool, int], float] = {}
    for _ in range(args.rounds + 1):
        for track in (False, True):
            for batch in (1, 100):
                engine[track, batch] = max(engine.get((track, batch), 0.0),
                                           engine_rate(track, batch))  # fmt: skip
    load = os.getloadavg()[0]
    table = Table(title=f"change checkpoints on vs off (records/s; load average {load:.1f})")
    for column in ("path", "topic", "records per append", "checkpoints on",
                   "anchor: checkpoints off", "ratio"):  # fmt: skip
        table.add_column(column, justify="right" if "on" in column or column == "ratio" else "left")
    for topic in ("disk", "memory"):
        for batch in (1, 100):
            on, off = best["on", topic, batch], best["off", topic, batch]
            table.add_row("HTTP", topic, str(batch), f"{on:,.0f}", f"{off:,.0f}",
                          f"{on / off:.2f}x")  # fmt: skip
    for batch in (1, 100):
        on, off = engine[True, batch], engine[False, batch]
        table.add_row("engine (CPU s)", "in memory", str(batch), f"{on:,.0f}", f"{off:,.0f}",
                      f"{on / off:.2f}x")  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    main()
