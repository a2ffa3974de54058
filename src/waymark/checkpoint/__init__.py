"""waymark.checkpoint: ordered per-source checkpoints over out-of-order acks.

See docs/checkpoint.md. The tracker is a pure, synchronous state machine; the
store is the only part that touches the disk.

The names below are imported when first asked for, so that importing one module of
the package (a Spark stage's patient store takes only ``backoff``) does not load the
tracker and the store (docs/architecture.md, "Enforcing the layers").
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from waymark.checkpoint.errors import (
        CheckpointError,
        CheckpointStoreCorrupt,
        DrainIncomplete,
        DroppedTicketWarning,
        TicketSpentError,
        TrackerStopped,
    )
    from waymark.checkpoint.store import CheckpointStore
    from waymark.checkpoint.tickets import AckReceipt, Outcome, QueuedTicket, SendingTicket
    from waymark.checkpoint.tracker import Committed, SourceView, Tracker

_HOME = {
    "CheckpointError": "errors",
    "CheckpointStoreCorrupt": "errors",
    "DrainIncomplete": "errors",
    "DroppedTicketWarning": "errors",
    "TicketSpentError": "errors",
    "TrackerStopped": "errors",
    "CheckpointStore": "store",
    "AckReceipt": "tickets",
    "Outcome": "tickets",
    "QueuedTicket": "tickets",
    "SendingTicket": "tickets",
    "Committed": "tracker",
    "SourceView": "tracker",
    "Tracker": "tracker",
}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'waymark.checkpoint' has no attribute {name!r}")
    return getattr(import_module(f"waymark.checkpoint.{home}"), name)


__all__ = [
    "AckReceipt",
    "CheckpointError",
    "CheckpointStore",
    "CheckpointStoreCorrupt",
    "Committed",
    "DrainIncomplete",
    "DroppedTicketWarning",
    "Outcome",
    "QueuedTicket",
    "SendingTicket",
    "SourceView",
    "TicketSpentError",
    "Tracker",
    "TrackerStopped",
]
