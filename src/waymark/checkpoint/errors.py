"""Errors and warnings raised by the checkpoint tracker and its store."""

from __future__ import annotations

from ..protocol.errors import WaymarkError


class CheckpointError(WaymarkError):
    """Base class for every checkpoint error."""


class TicketSpentError(CheckpointError):
    """A ticket was used after its one transition (a second ack, a send after a fail, ...)."""


class TrackerStopped(CheckpointError):
    """A batch was created after stop began: a stopping tracker only drains."""


class DrainIncomplete(CheckpointError):
    """stop() was called while some batch is still queued or in flight."""


class CheckpointStoreCorrupt(CheckpointError):
    """The durable checkpoint file exists but cannot be trusted."""


class DroppedTicketWarning(RuntimeWarning):
    """An unresolved ticket was garbage-collected.

    A RuntimeWarning, not a ResourceWarning, because the latter is hidden by default and
    a dropped batch must never go unnoticed.
    """
