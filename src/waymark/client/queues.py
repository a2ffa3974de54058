"""Request building for the queue routes (docs/semantics/topics.md §10), shared by the sync and
async clients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ..protocol import (
    AckBody,
    AckResponse,
    ClaimBody,
    ClaimResponse,
    ExtendBody,
    ExtendResponse,
    Job,
    NackBody,
    NackResponse,
    RedriveBody,
    RedriveResponse,
)
from .calls import Call, call, typed

_encode = msgspec.json.Encoder().encode
_claim = typed(ClaimResponse)
_ack = typed(AckResponse)
_nack = typed(NackResponse)
_extend = typed(ExtendResponse)
_redrive = typed(RedriveResponse)


def claim(topic: str, node: str, max_jobs: int, lease_ms: int | None) -> Call[list[Job[Any]]]:
    body = ClaimBody(node, max_jobs, lease_ms)
    return call("claimJobs", lambda r: _claim(r).jobs, _encode(body), topic=topic)


def _ids(lease_ids: Sequence[str] | None) -> list[str] | None:
    return None if lease_ids is None else list(lease_ids)


def ack(topic: str, node: str, seqs: Sequence[int], lease_ids: Sequence[str] | None
        ) -> Call[AckResponse]:  # fmt: skip
    body = AckBody(node, list(seqs), _ids(lease_ids))
    return call("ackJobs", _ack, _encode(body), topic=topic)


def nack(
    topic: str, node: str, seqs: Sequence[int], lease_ids: Sequence[str] | None, delay_ms: int
) -> Call[NackResponse]:
    body = NackBody(node, list(seqs), _ids(lease_ids), delay_ms)
    return call("nackJobs", _nack, _encode(body), topic=topic)


def extend(
    topic: str,
    node: str,
    seqs: Sequence[int],
    lease_ids: Sequence[str] | None,
    lease_ms: int | None,
) -> Call[ExtendResponse]:
    body = ExtendBody(node, list(seqs), _ids(lease_ids), lease_ms)
    return call("extendLeases", _extend, _encode(body), topic=topic)


def redrive(topic: str, max_jobs: int) -> Call[RedriveResponse]:
    return call("redrive", _redrive, _encode(RedriveBody(max_jobs)), topic=topic)
