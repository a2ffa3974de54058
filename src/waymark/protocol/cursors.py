"""The SSE cursor: every ``event: record|tombstone`` has ``id: <epoch>:<seq>``.

``epoch`` names the topic instance, ``seq`` is the exclusive lower bound to resume
from: a record's own ``$seq``, or for a tombstone ``earliest_seq - 1``, the position
just after the gap, so a reconnect (``Last-Event-ID``) neither reports the gap again
nor skips the first live record after it. A plain ``<seq>`` is accepted on the way
in, without the epoch check.
"""

from __future__ import annotations

from typing import NamedTuple

from .records import Tombstone

# The id line's value as bytes, formatted per event on the server's streaming path.
EVENT_ID = b"%d:%d"


class Cursor(NamedTuple):
    epoch: int | None  # None: a plain "<seq>" cursor, not tied to a topic instance
    seq: int


def format_cursor(epoch: int, seq: int) -> str:
    return f"{epoch}:{seq}"


def tombstone_cursor_seq(tombstone: Tombstone) -> int:
    """The resume position a tombstone's event id carries: just after the gap."""
    return tombstone.earliest_seq - 1


def parse_cursor(value: str) -> Cursor:
    """``"<epoch>:<seq>"`` or ``"<seq>"``; ValueError for anything else."""
    epoch, _, seq = value.strip().rpartition(":")
    if _number(seq) and (not epoch or _number(epoch)):
        return Cursor(int(epoch) if epoch else None, int(seq))
    raise ValueError('a cursor is "<epoch>:<seq>" or "<seq>" (non-negative integers)')


def _number(text: str) -> bool:
    # ASCII only: str.isdigit() also holds for digits int() refuses, such as "²".
    return text.isascii() and text.isdigit()
