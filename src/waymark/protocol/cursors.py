"""The SSE cursor: every ``event: record|tombstone`` has ``id: <epoch>:<seq>``.

``epoch`` names the topic instance, ``seq`` is the exclusive lower bound to resume
from: a record's own ``$seq``, or for a tombstone its ``$seq - 1``, the position the
read went on from after the gap (its ``gap_to`` for an evicted range or a crash hole,
also one in the middle of the topic; for ``recreated`` the new instance's
``earliest_seq - 1``), so a reconnect (``Last-Event-ID``) neither reports the gap
again nor skips the first record after it. A plain ``<seq>`` is accepted on the way
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
    """The resume position a tombstone's event id carries: its ``$seq - 1``, where the
    read went on from after the gap (a hole's tombstone has ``$seq = gap_to + 1``, so
    a later hole that ``earliest_seq`` already passed is still met on resume)."""
    return tombstone.seq - 1


def parse_cursor(value: str) -> Cursor:
    """``"<epoch>:<seq>"`` or ``"<seq>"``; ValueError for anything else."""
    epoch, _, seq = value.strip().rpartition(":")
    if _number(seq) and (not epoch or _number(epoch)):
        return Cursor(int(epoch) if epoch else None, int(seq))
    raise ValueError('a cursor is "<epoch>:<seq>" or "<seq>" (non-negative integers)')


def _number(text: str) -> bool:
    # ASCII only: str.isdigit() also holds for digits int() refuses, such as "²".
    return text.isascii() and text.isdigit()
