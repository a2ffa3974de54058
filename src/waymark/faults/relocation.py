"""The campaign's relocatable pipeline (docs/faults.md, "The data flow"): a paced source,
the pipeline file `waymark pipeline run` runs as a process, and what its sink holds.

produce -> ``raw`` -> transform -> ``enriched`` -> sink, each edge placed on one of two
servers (the campaign's and a second one); a kill of the server under an edge moves it
to the other mid-flight. The stages other than the source are the relocate demo's
(``waymark.pipeline.demo``); the campaign reaches the pipeline only as a user does:
the pipeline file, the command and the sink topic.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import tomli_w

PIPELINE = "campaign"
# The source's pace: events flow through the whole run rather than in its first seconds.
PACE_S = 0.02


def produce(n: int) -> dict[str, Any]:
    """Event ``n`` of the campaign's pipeline, one every ``PACE_S``."""
    time.sleep(PACE_S)
    return {"event_id": n, "user": f"u{n % 97}", "amount": n % 13}


def events_for(seconds: float) -> int:
    """How many events a campaign of ``seconds`` sends: produced by about two thirds
    of the run at the pace, so the last faults find them in flight."""
    return max(100, int(seconds * 0.6 / PACE_S))


def write_spec(
    path: Path, handoff: str, servers: tuple[str, str], sink_url: str, topic: str, events: int
) -> None:
    """The pipeline file: ``raw`` prefers the first server, ``enriched`` the second."""
    first, second = servers
    spec = {
        "pipeline": {"name": PIPELINE, "handoff": handoff},
        "edge": [
            {"name": "raw", "candidates": [first, second]},
            {"name": "enriched", "candidates": [second, first]},
        ],
        "stage": [
            {"name": "produce", "function": f"{__name__}:produce", "events": events,
             "output": "raw", "batch": 50},
            {"name": "transform", "function": "waymark.pipeline.demo:enrich", "input": "raw",
             "output": "enriched"},
            {"name": "sink", "function": "waymark.pipeline.demo:deliver", "input": "enriched",
             "sink": {"url": sink_url, "topic": topic}},
        ],
    }  # fmt: skip
    path.write_text(tomli_w.dumps(spec))


def sink_counts(client: Any, topic: str) -> dict[int, int]:
    """How many times each event id is in the sink ``topic`` (a ``waymark.client.Client``)."""
    counts: dict[int, int] = {}
    cursor = 0
    while True:
        page = client.diff(topic, cursor, limit=1000)
        for record in page.records:
            event = record.data["event_id"]
            counts[event] = counts.get(event, 0) + 1
        if page.caught_up or page.next_from_seq <= cursor:
            return counts
        cursor = page.next_from_seq
