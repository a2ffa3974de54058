"""waymark.checkpoint: ordered per-source checkpoints over out-of-order acks.

See docs/checkpoint.md. The tracker is a pure, synchronous state machine; the
store is the only part that touches the disk.
"""

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
