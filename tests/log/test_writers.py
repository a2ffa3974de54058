"""The staging area's byte limits (docs/security.md, Limits): unpublished stages of one
writer, and of all writers, cannot pin memory past their limits; a retried chunk, a
publish and an expiry give their bytes back."""

from __future__ import annotations

import pytest

from waymark.clock import ManualClock
from waymark.log import Engine, ErrorCode, RecordIn, TopicError
from waymark.log.config import EngineConfig
from waymark.log.records import PlainRecords, plain_records
from waymark.log.writers import DEFAULT_STAGE_TTL_MS, PartKey
from waymark.protocol import Limits

RECORD = RecordIn.of("x" * 90)  # ~100 wire bytes


def engine(per_writer: int, total: int) -> tuple[Engine, ManualClock]:
    clock = ManualClock(1_000_000)
    limits = Limits(max_staged_bytes_per_writer=per_writer, max_staged_bytes=total)
    return Engine(EngineConfig(limits=limits), clock=clock), clock


def refused(call) -> TopicError:  # type: ignore[no-untyped-def]
    with pytest.raises(TopicError) as error:
        call()
    assert error.value.code is ErrorCode.STAGING_FULL and error.value.status == 429
    return error.value


def test_a_writer_that_never_publishes_is_held_to_its_limit() -> None:
    e, _ = engine(per_writer=1000, total=10_000)
    epoch = e.writers.open_writer("w")
    for partition in range(9):  # 9 x ~101 bytes
        e.writers.stage("t", "w", epoch, 0, PartKey(partition, 0), [RECORD])
    held = e.writers.staged_bytes("w")
    assert 900 < held <= 1000
    error = refused(lambda: e.writers.stage("t", "w", epoch, 0, PartKey(9, 0), [RECORD]))
    assert error.detail["staged_bytes"] == held
    assert e.writers.staged_bytes("w") == held  # the refused stage stored nothing
    # A retried chunk replaces its bytes, it does not add to them.
    e.writers.stage("t", "w", epoch, 0, PartKey(0, 0), [RECORD])
    assert e.writers.staged_bytes("w") == held


def test_all_writers_together_are_held_to_the_total() -> None:
    e, _ = engine(per_writer=1000, total=1350)  # records of ~101 bytes
    a, b = e.writers.open_writer("a"), e.writers.open_writer("b")
    for partition in range(8):
        e.writers.stage("t", "a", a, 0, PartKey(partition, 0), [RECORD])
    for partition in range(5):
        e.writers.stage("u", "b", b, 0, PartKey(partition, 0), [RECORD])
    refused(lambda: e.writers.stage("u", "b", b, 0, PartKey(9, 0), [RECORD]))


def test_a_publish_and_an_expiry_give_the_bytes_back() -> None:
    e, clock = engine(per_writer=500, total=10_000)
    epoch = e.writers.open_writer("w")
    parts = [PartKey(p, 0) for p in range(4)]
    for part in parts:
        e.writers.stage("t", "w", epoch, 0, part, [RECORD])
    refused(lambda: e.writers.stage("t", "w", epoch, 1, PartKey(0, 0), [RECORD] * 2))
    e.writers.publish("t", "w", epoch, 0, [(part, 1) for part in parts])
    assert e.writers.staged_bytes() == 0
    assert e.get_topic("t").head_seq == 4
    for part in parts:
        e.writers.stage("t", "w", epoch, 1, part, [RECORD])
    clock.advance(DEFAULT_STAGE_TTL_MS + 1)  # batch 1 was never published: it expires
    e.writers.stage("t", "w", epoch, 2, PartKey(0, 0), [RECORD] * 4)
    assert e.writers.staged_parts("t", "w") == 1


def _columnar(n: int) -> PlainRecords:
    """``n`` copies of RECORD as the server's bulk stage path keeps them."""
    array = b"[" + b",".join([b'{"data":%b}' % RECORD.data] * n) + b"]"
    plain = plain_records(array, [RECORD.data] * n, Limits())
    assert plain is not None
    return plain


def test_columnar_stages_are_held_to_the_limits_alike() -> None:
    """A chunk staged columnar (PlainRecords) counts the same bytes as the records one
    object each; a layout's join of the batch is dropped with the batch's stages, so a
    publish that never comes (a client gone mid-request) holds nothing past them."""
    e, clock = engine(per_writer=1000, total=10_000)
    epoch = e.writers.open_writer("w")
    e.writers.stage("t", "w", epoch, 0, PartKey(0, 0), [RECORD] * 3)
    as_objects = e.writers.staged_bytes("w")
    e.writers.stage("t", "w", epoch, 0, PartKey(0, 0), _columnar(3))  # a retry, columnar
    assert e.writers.staged_bytes("w") == as_objects
    refused(lambda: e.writers.stage("t", "w", epoch, 0, PartKey(1, 0), _columnar(8)))
    assert e.writers.lay_out("t", "w", epoch, 0, [(PartKey(0, 0), 1)]) is not None
    state = e.writers._writers["t", "w"]  # noqa: SLF001 -- the join a layout keeps
    assert state.gathered is not None
    clock.advance(DEFAULT_STAGE_TTL_MS + 1)  # its publish never came: the stages expire
    e.writers.stage("t", "w", epoch, 1, PartKey(0, 0), [RECORD])
    assert state.gathered is None
