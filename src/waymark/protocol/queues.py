"""The queue routes (docs/semantics/topics.md §10): claim, ack, nack, extend, redrive, and
the leased job.

* ``POST /v0/topics/{q}/claim`` ``{node, max, lease_ms?}`` -> ``{"jobs": [...]}``: each
  job is the stored record plus ``lease_id``, ``deadline`` and ``delivery``.
* ``POST /v0/topics/{q}/ack`` | ``/nack`` (``delay_ms``) | ``/extend`` (``lease_ms``)
  ``{node, seqs, lease_ids?}``: seqs this node no longer holds are skipped, not refused.
* ``GET /v0/topics/{q}/work?node=&max=&lease_ms=``: one SSE ``job`` event per lease.
* ``POST /v0/topics/{q}/redrive`` ``{max?}``: dead letters back into the queue.
"""

from __future__ import annotations

from typing import Annotated, Generic, TypeVar

from msgspec import Meta, Struct

from .limits import MAX_BATCH, Seq
from .records import Record

T = TypeVar("T")

Node = Annotated[str, Meta(min_length=1, max_length=128)]
Max = Annotated[int, Meta(ge=1, le=MAX_BATCH)]
Millis = Annotated[int, Meta(ge=1, le=2**53)]


class ClaimBody(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{q}/claim``: lease up to ``max`` jobs to ``node``."""

    node: Node
    max: Max = 1
    lease_ms: Millis | None = None


class AckBody(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{q}/ack``: done; the jobs are permanently deleted."""

    node: Node
    seqs: Annotated[list[Seq], Meta(min_length=1, max_length=MAX_BATCH)]
    lease_ids: list[str] | None = None


class NackBody(AckBody, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{q}/nack``: release now; claimable again after ``delay_ms``."""

    delay_ms: Annotated[int, Meta(ge=0, le=2**53)] = 0


class ExtendBody(AckBody, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{q}/extend``: new deadline ``now + lease_ms`` (the queue's default
    when absent)."""

    lease_ms: Millis | None = None


class RedriveBody(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v0/topics/{q}/redrive``: move up to ``max`` dead letters back."""

    max: Max = 1000


class Job(Record[T], Generic[T], kw_only=True, omit_defaults=True, gc=False):
    """A leased job: the stored record plus its lease."""

    lease_id: str
    deadline: int
    delivery: int


class ClaimResponse(Struct, Generic[T]):
    jobs: list[Job[T]]


class AckResponse(Struct):
    acked: list[int]
    skipped: list[int]


class NackResponse(Struct):
    released: list[int]
    skipped: list[int]


class ExtendResponse(Struct):
    extended: list[int]
    deadlines: list[int]
    skipped: list[int]


class RedriveResponse(Struct):
    redriven: int
    seqs: list[int]
