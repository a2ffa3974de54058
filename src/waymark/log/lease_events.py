"""A queue's lease events: the records of its ``<queue>$leases`` log
(docs/semantics/topics.md §10.1).

One msgspec Struct per event kind, a union tagged by the ``event`` field. Field order
is key order on disk, so an event is byte for byte the JSON object the engine always
wrote (``tests/log/test_compat_v1.py``); a new field goes last, with a default.
The queue applies them with a ``match`` (:meth:`waymark.log.queue.Projection.apply`).
"""

from __future__ import annotations

import msgspec


class LeaseEventBase(msgspec.Struct, tag_field="event", frozen=True, gc=False):
    epoch: int  # the queue instance it belongs to
    seq: int  # the job's seq in the jobs log
    node: str
    lease_id: str
    # absolute ms: a lease's end, or when a released job becomes claimable again
    deadline: int
    delivery: int
    # The dead_lettered total rides on every event, so trimming never loses the counter.
    dead_lettered: int


class Claimed(LeaseEventBase, frozen=True, tag="claimed"):
    """``node`` holds the job under ``lease_id`` until ``deadline``."""


class Extended(LeaseEventBase, frozen=True, tag="extended"):
    """The lease's deadline moved."""


class Released(LeaseEventBase, frozen=True, tag="released"):
    """Back on the freelist: expired, nacked, or restated by a trim."""


class Acked(LeaseEventBase, frozen=True, tag="acked"):
    """Done: the job leaves the lease state."""


class DeadLettered(LeaseEventBase, frozen=True, tag="dead_lettered"):
    """Moved to the dead-letter topic after too many deliveries."""


class Parked(LeaseEventBase, frozen=True, tag="parked"):
    """Dead, but the dead-letter topic refused it: neither delivered nor retried yet."""


LeaseEvent = Claimed | Extended | Released | Acked | DeadLettered | Parked


class _Stored(msgspec.Struct):
    """A leases-log record as a read returns it; only its data matters here."""

    data: LeaseEvent


encode = msgspec.json.Encoder().encode
_decode_stored = msgspec.json.Decoder(_Stored).decode


def decode_stored(record: bytes | memoryview) -> LeaseEvent:
    """The event a leases-log record (its wire JSON) carries."""
    return _decode_stored(record).data
