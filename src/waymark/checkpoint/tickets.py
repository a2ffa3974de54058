"""Batch tickets: the lifecycle of one batch as two types.

A batch is a :class:`QueuedTicket` until ``begin_send()`` turns it into a
:class:`SendingTicket`, which only ``ack()``, ``reject()`` or ``fail()`` resolve.
Each transition spends the ticket it is called on and, where the batch lives on,
hands back a new one, so a type checker rejects ``queued.ack()`` and the runtime
rejects a second transition on a spent ticket.

Python cannot refuse to drop an object, so an unresolved ticket that is
garbage-collected is reported instead: a :class:`DroppedTicketWarning`, the
tracker's ``dropped_tickets`` counter, and the batch is abandoned (the checkpoint
stays below it).
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from waymark.checkpoint.errors import DroppedTicketWarning, TicketSpentError

if TYPE_CHECKING:
    from waymark.checkpoint.tracker import Tracker, _Source

C = TypeVar("C")


class Outcome(enum.Enum):
    """How a sent batch was terminally resolved."""

    ACKED = "acked"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class AckReceipt:
    """Proof that a batch is terminally resolved.

    ``advanced`` tells whether this resolution moved the committed checkpoint, which
    is when a caller may want to persist it.
    """

    outcome: Outcome
    advanced: bool


# Acks are the hot path: hand out one of four shared receipts instead of allocating.
_ACKED_ADVANCED = AckReceipt(Outcome.ACKED, True)
_ACKED_PENDING = AckReceipt(Outcome.ACKED, False)
_REJECTED_ADVANCED = AckReceipt(Outcome.REJECTED, True)
_REJECTED_PENDING = AckReceipt(Outcome.REJECTED, False)


class _Ticket(Generic[C]):
    __slots__ = ("_fate", "_src", "_tracker", "attempts", "batch_id", "checkpoint")

    def __init__(
        self, tracker: Tracker[C], src: _Source[C], batch_id: int, checkpoint: C, attempts: int
    ) -> None:
        self._tracker = tracker
        self._src = src
        self.batch_id = batch_id
        self.checkpoint = checkpoint
        # Failed sends so far; the caller's backoff reads it.
        self.attempts = attempts
        # None while the ticket is live, then the name of the transition that spent it.
        self._fate: str | None = None

    @property
    def source(self) -> str:
        return self._src.name

    def _spent(self, action: str) -> TicketSpentError:
        return TicketSpentError(
            f"cannot {action} batch {self.batch_id} of source {self._src.name!r}: this "
            f"{type(self).__name__} was already spent by {self._fate}(); a ticket makes "
            "exactly one transition"
        )

    def __repr__(self) -> str:
        state = "live" if self._fate is None else f"spent by {self._fate}()"
        return (
            f"<{type(self).__name__} source={self._src.name!r} batch={self.batch_id} "
            f"checkpoint={self.checkpoint!r} {state}>"
        )

    def __del__(self) -> None:
        if self._fate is None:
            count = self._tracker._ticket_dropped(self._src, self.batch_id)
            # Warn on the 1st, 2nd, 4th, 8th... drop: a mass drop (an exit without drain)
            # stays readable, and the counter carries the exact figure.
            if count & (count - 1):
                return
            warnings.warn(
                f"{type(self).__name__} for batch {self.batch_id} of source "
                f"{self._src.name!r} was garbage-collected unresolved; the batch is "
                f"abandoned and the checkpoint stays below it until restart "
                f"({count} dropped so far)",
                DroppedTicketWarning,
                stacklevel=1,
            )


class QueuedTicket(_Ticket[C]):
    """A created batch that is not on the wire: send it, or abandon it on shutdown."""

    __slots__ = ()

    def begin_send(self) -> SendingTicket[C]:
        """Put the batch in flight; resolve the returned ticket with ack, reject or fail."""
        if self._fate is not None:
            raise self._spent("begin_send")
        self._fate = "begin_send"
        self._tracker._begin_send(self._src, self.batch_id)
        return SendingTicket(
            self._tracker, self._src, self.batch_id, self.checkpoint, self.attempts
        )

    def abandon(self) -> None:
        """Give the batch up without delivering it, e.g. a retry cut short by shutdown.

        The checkpoint never passes an abandoned batch: its data is read again after
        restart. Abandoning resolves the batch for drain.
        """
        if self._fate is not None:
            raise self._spent("abandon")
        self._fate = "abandon"
        self._tracker._abandon(self._src, self.batch_id)


class SendingTicket(_Ticket[C]):
    """A batch in flight; exactly one of ack(), reject() or fail() resolves it."""

    __slots__ = ()

    def ack(self) -> AckReceipt:
        """The batch was delivered: it may now be committed, in batch order."""
        if self._fate is not None:
            raise self._spent("ack")
        self._fate = "ack"
        if self._tracker._settle(self._src, self.batch_id):
            return _ACKED_ADVANCED
        return _ACKED_PENDING

    def reject(self) -> AckReceipt:
        """The batch can never be delivered (e.g. 413): the checkpoint advances past it."""
        if self._fate is not None:
            raise self._spent("reject")
        self._fate = "reject"
        if self._tracker._reject(self._src, self.batch_id):
            return _REJECTED_ADVANCED
        return _REJECTED_PENDING

    def fail(self) -> QueuedTicket[C]:
        """A transient failure: the batch is queued again and holds the checkpoint."""
        if self._fate is not None:
            raise self._spent("fail")
        self._fate = "fail"
        self._tracker._fail(self._src, self.batch_id)
        return QueuedTicket(
            self._tracker, self._src, self.batch_id, self.checkpoint, self.attempts + 1
        )
