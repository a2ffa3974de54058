"""The stage functions of ``waymark demo relocate`` (docs/pipeline.md, "The demo")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from waymark.pipeline.functions import Events, batch_function


def produce(n: int) -> dict[str, Any]:
    """Event ``n`` of the demo's stream."""
    return {"event_id": n, "user": f"u{n % 97}", "amount": n % 13}


def enrich(event: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The transform: one output per event, with a derived field."""
    yield {**event, "bucket": "big" if event["amount"] >= 7 else "small"}


@batch_function
def deliver(events: Events) -> Events:
    """The sink stage writes each event as it comes: the batch as it is, its records
    never decoded (docs/pipeline.md, "Batch functions")."""
    return events


def deliver_each(event: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """:func:`deliver` event by event, decoded and encoded again (the benchmark's
    ``--per-event-sink`` run)."""
    yield event


class HeldSource:
    """:func:`produce`, holding the events from ``at`` on until :meth:`release`: the
    relocate demo kills the server under its first edge while the source waits there,
    so the kill always lands with events left to write and the edge always moves,
    however fast the machine (docs/pipeline.md, "The demo"). Not held until
    :meth:`hold`."""

    def __init__(self) -> None:
        self.at: int | None = None
        self.reached = threading.Event()  # the source asked for event ``at``
        self.released = threading.Event()

    def hold(self, at: int) -> None:
        self.at = at
        self.reached.clear()
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def __call__(self, n: int) -> dict[str, Any]:
        if self.at is not None and n >= self.at:
            self.reached.set()
            self.released.wait()
        return produce(n)


held = HeldSource()  # the demo's source, by name: waymark.pipeline.demo:held
