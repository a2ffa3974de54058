"""Checkpoint tracker: acks/s with 10k batches in flight, acks in random order.

Run: .venv/bin/python bench/checkpoint_tracker.py [--acks N] [--in-flight N]

Each round tops the window up to IN_FLIGHT + CHUNK sent batches (untimed), then
acks CHUNK of them picked at random from the whole window (timed), so the window
never drops below IN_FLIGHT and the committed checkpoint advances only as the
oldest stragglers are acked. The anchor runs the same picks through a bare
dict pop + dict insert per ack, the least bookkeeping an ack can cost.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from waymark.checkpoint import SendingTicket, Tracker

CHUNK = 1_000


def pick_rounds(rng: random.Random, in_flight: int, acks: int) -> list[list[int]]:
    """Per round, the window positions (as batch ids) acked, chosen up front."""
    window: list[int] = []
    next_id = 1
    rounds = []
    for _ in range(acks // CHUNK):
        while len(window) < in_flight + CHUNK:
            window.append(next_id)
            next_id += 1
        chosen = []
        for _ in range(CHUNK):
            i = rng.randrange(len(window))
            window[i], window[-1] = window[-1], window[i]
            chosen.append(window.pop())
        rounds.append(chosen)
    return rounds


def bench_anchor(rounds: list[list[int]]) -> float:
    in_flight: dict[int, int] = {}
    pending: dict[int, int] = {}
    next_id = 1
    elapsed = 0
    for chosen in rounds:
        top = max(chosen)
        while next_id <= top:
            in_flight[next_id] = next_id
            next_id += 1
        start = time.perf_counter_ns()
        for batch_id in chosen:
            pending[batch_id] = in_flight.pop(batch_id)
        elapsed += time.perf_counter_ns() - start
    return elapsed / 1e9


def bench_tracker_acks(rounds: list[list[int]]) -> float:
    tracker: Tracker[int] = Tracker()
    tickets: dict[int, SendingTicket[int]] = {}
    elapsed = 0
    next_id = 1
    for chosen in rounds:
        top = max(chosen)
        while next_id <= top:
            ticket = tracker.create_batch("source", next_id * 100).begin_send()
            tickets[ticket.batch_id] = ticket
            next_id += 1
        batch = [tickets.pop(batch_id) for batch_id in chosen]
        start = time.perf_counter_ns()
        for ticket in batch:
            ticket.ack()
        elapsed += time.perf_counter_ns() - start
    _finish(tracker, tickets)
    return elapsed / 1e9


def bench_tracker_lifecycle(rounds: list[list[int]]) -> float:
    """create_batch + begin_send + ack per batch, all timed."""
    tracker: Tracker[int] = Tracker()
    tickets: dict[int, SendingTicket[int]] = {}
    create = tracker.create_batch
    next_id = 1
    start = time.perf_counter_ns()
    for chosen in rounds:
        top = max(chosen)
        while next_id <= top:
            ticket = create("source", next_id * 100).begin_send()
            tickets[ticket.batch_id] = ticket
            next_id += 1
        for batch_id in chosen:
            tickets.pop(batch_id).ack()
    elapsed = time.perf_counter_ns() - start
    _finish(tracker, tickets)
    return elapsed / 1e9


def _finish(tracker: Tracker[int], tickets: dict[int, SendingTicket[int]]) -> None:
    """Resolve the window so the run ends drained, and check the result."""
    for ticket in tickets.values():
        ticket.ack()
    snapshot = tracker.stop()
    assert snapshot["source"].checkpoint == snapshot["source"].batch_id * 100


def median_of(runs: int, fn: Callable[[list[list[int]]], float], rounds: list[list[int]]) -> float:
    return statistics.median(fn(rounds) for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--acks", type=int, default=1_000_000)
    parser.add_argument("--in-flight", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3, help="median of this many runs")
    args = parser.parse_args()

    rounds = pick_rounds(random.Random(4), args.in_flight, args.acks)
    acks = len(rounds) * CHUNK
    anchor = median_of(args.runs, bench_anchor, rounds)
    tracker = median_of(args.runs, bench_tracker_acks, rounds)
    lifecycle = median_of(args.runs, bench_tracker_lifecycle, rounds)

    table = Table(
        title=f"checkpoint tracker: {acks:,} acks, random order, "
        f"{args.in_flight:,}-{args.in_flight + CHUNK:,} batches in flight "
        f"(median of {args.runs})"
    )
    table.add_column("measure")
    table.add_column("per second", justify="right")
    table.add_column("ns each", justify="right")
    table.add_column("cost vs anchor", justify="right")
    for name, seconds in (
        ("anchor: bare dict pop + insert per ack", anchor),
        ("tracker: SendingTicket.ack()", tracker),
        ("tracker: create_batch + begin_send + ack", lifecycle),
    ):
        table.add_row(
            name,
            f"{acks / seconds:,.0f}",
            f"{seconds / acks * 1e9:,.0f}",
            f"{seconds / anchor:.1f}x",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
