"""The stage functions of ``waymark demo relocate`` (docs/pipeline.md, "The demo")."""

from __future__ import annotations

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
