"""Request building for the queue routes (docs/semantics/topics.md §10), shared by the sync and
async clients."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..server.queues import (
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
from .calls import Call, _typed, topic_path

_encode = msgspec.json.Encoder().encode
_claim = _typed(ClaimResponse)
_ack = _typed(AckResponse)
_nack = _typed(NackResponse)
_extend = _typed(ExtendResponse)
_redrive = _typed(RedriveResponse)


def claim(topic: str, node: str, max: int, lease_ms: int | None) -> Call[list[Job]]:
    body = ClaimBody(node, max, lease_ms)
    return Call("POST", topic_path(topic, "/claim"), lambda r: _claim(r).jobs, _encode(body))


def _ids(lease_ids: Sequence[str] | None) -> list[str] | None:
    return None if lease_ids is None else list(lease_ids)


def ack(topic: str, node: str, seqs: Sequence[int], lease_ids: Sequence[str] | None
        ) -> Call[AckResponse]:  # fmt: skip
    body = AckBody(node, list(seqs), _ids(lease_ids))
    return Call("POST", topic_path(topic, "/ack"), _ack, _encode(body))


def nack(
    topic: str, node: str, seqs: Sequence[int], lease_ids: Sequence[str] | None, delay_ms: int
) -> Call[NackResponse]:
    body = NackBody(node, list(seqs), _ids(lease_ids), delay_ms)
    return Call("POST", topic_path(topic, "/nack"), _nack, _encode(body))


def extend(
    topic: str,
    node: str,
    seqs: Sequence[int],
    lease_ids: Sequence[str] | None,
    lease_ms: int | None,
) -> Call[ExtendResponse]:
    body = ExtendBody(node, list(seqs), _ids(lease_ids), lease_ms)
    return Call("POST", topic_path(topic, "/extend"), _extend, _encode(body))


def redrive(topic: str, max: int) -> Call[RedriveResponse]:
    return Call("POST", topic_path(topic, "/redrive"), _redrive, _encode(RedriveBody(max)))
