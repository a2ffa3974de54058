"""How long ``waymark`` takes to start, as a ratio to ``python -c pass``, one run.

Run: ``.venv/bin/python bench/cli_startup.py [--runs 15]``. Not a test: it prints
figures and ratios (docs/cli.md, "Start-up"); the goal is <= 0.5 s for ``--help`` and a
data command.

Each command is a fresh process, as a user starts it; the commands take turns (one
run of each, ``--runs`` times) so a change in the machine's load falls on all alike,
and a figure is the median wall time, and the median CPU time (user + system: what the
start costs, less shaken by other processes on a loaded machine). The data command is
``recovery clients`` against a port nothing listens on: it loads the client, parses,
connects (refused at once) and exits 6 through waymark.cli.errors, i.e. everything a
data command does but the server's work. Bytecode is written first (a warm-up round),
as an install has it; without it every start compiles typer and rich again (0.7 s
here). ``--importtime`` also prints the slowest imports of ``import waymark.cli``.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _children_cpu() -> float:
    """User + system CPU seconds of the waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--importtime", action="store_true")
    args = parser.parse_args()
    python = sys.executable
    waymark = str(Path(python).parent / "waymark")
    url = f"http://127.0.0.1:{_closed_port()}"
    commands = {  # each with the exit code it must end with: a crash is not a start
        "python -c pass (anchor)": ([python, "-c", "pass"], 0),
        "waymark --help": ([waymark, "--help"], 0),
        "waymark version": ([waymark, "version"], 0),
        "waymark recovery clients (data command)": (
            [waymark, "recovery", "clients", "--url", url], 6),
    }  # fmt: skip
    # Bytecode as an installed package has it (pip compiles at install): the warm-up
    # round writes what PYTHONDONTWRITEBYTECODE=1 (set by some shells here) would not.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WAYMARK_") and k != "PYTHONDONTWRITEBYTECODE"}  # fmt: skip
    for command, _ in commands.values():
        subprocess.run(command, env=env, capture_output=True, check=False)
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, (command, code) in commands.items():
            used, start = _children_cpu(), time.perf_counter()
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(_children_cpu() - used)
            if done.returncode != code:
                sys.exit(f"{name}: exit {done.returncode}, not {code}:\n{done.stderr}")
    anchor = statistics.median(times["python -c pass (anchor)"])
    cpu_anchor = statistics.median(cpu["python -c pass (anchor)"])
    print(f"{'command':<42} {'wall s':>7} {'ratio':>7} {'cpu s':>7} {'ratio':>7}")
    for name, taken in times.items():
        wall, used = statistics.median(taken), statistics.median(cpu[name])
        print(f"{name:<42} {wall:>7.3f} {wall / anchor:>6.1f}x "
              f"{used:>7.3f} {used / cpu_anchor:>6.1f}x")  # fmt: skip
    if args.importtime:
        done = subprocess.run([python, "-X", "importtime", "-c", "import waymark.cli"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        rows = [line.split("|") for line in done.stderr.splitlines()[1:]]
        slowest = sorted(rows, key=lambda r: -int(r[1]))[:10]
        print("\nslowest cumulative imports of `import waymark.cli` (µs):")
        for _, cumulative, module in slowest:
            print(f"{int(cumulative):>9} {module.rstrip()}")


if __name__ == "__main__":
    main()
