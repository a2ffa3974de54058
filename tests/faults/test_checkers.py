"""The campaign's checkers without a campaign (docs/faults.md, "Checkers"): each one
fails when it had nothing to check, and the duplicate check sees a second copy of a
record that reading back at the acknowledged seq cannot, on a real server."""

from __future__ import annotations

from typing import Any

from waymark.client import Client, RecordIn
from waymark.faults import checkers
from waymark.faults.campaign import _read_topic
from waymark.protocol.topics import ConfigPatch, Durability


def test_each_checker_fails_when_it_had_nothing_to_check() -> None:
    """A checker handed no input has proved nothing: a flow that never got going (the
    producers all failing, an empty bucket, a pipeline with no events) is a failure,
    not a campaign that passed."""
    empty = [
        checkers.acknowledged_lost({}, {}, "events"),
        checkers.stored_once({"events": []}),
        checkers.forwarded([], {}, "copy"),
        checkers.fold_equals_bucket({}, {}),
        checkers.pointer_monotonic([]),
        checkers.recovery_covers({}, {}, {}),
        checkers.expired_announced({}, {}, [], "expiring"),
        checkers.timestamps_monotonic({"events": []}),
        checkers.queue_done([], {}, set(), []),
        checkers.pipeline_exactly_once(0, {}, [0], 0),
        checkers.nats_writes_kept({}, {}),
        checkers.faults_recovered([], 2),
        checkers.spark_exactly_once({}, [], 0),
        checkers.spark_fold_equals({}, {}),
    ]
    assert [v.name for v in empty if v.ok] == []
    assert all("nothing" in v.summary for v in empty), [v.summary for v in empty]
    # Every key's newest change receipted: the recovery query was asked nothing.
    assert not checkers.recovery_covers({"events/k0": 5}, {"events/k0": 5}, {}).ok
    # The same checkers pass on the least that is something.
    assert checkers.acknowledged_lost({"p0-0": 1}, {"p0-0": 1}, "events").ok
    assert checkers.stored_once({"events": ["p0-0", "p0-1"]}).ok
    assert checkers.recovery_covers({"events/k0": 5}, {"events/k0": 4}, {"events/k0": 5}).ok
    assert checkers.timestamps_monotonic({"events": [(1, 10), (2, 10)]}).ok
    assert checkers.pipeline_exactly_once(1, {0: 1}, [0], 0).ok
    assert checkers.nats_writes_kept({"k": (b"v", 3)}, {"k": (b"w", 4)}).ok
    assert checkers.faults_recovered([("nats-kill", 1.0, 0.5)], 0).ok


def test_a_retry_stored_twice_is_caught_where_reading_back_at_its_seq_is_blind(
    waymark_server: Any,
) -> None:
    """A producer's retry of a write whose answer it lost carries the same id; were it
    stored again (the fault injector here: a topic with no idempotency window), the
    producer is told the second seq, and reading each acknowledged id back at that seq
    passes — only counting the ids read finds the copy (docs/semantics/topics.md §4.1)."""
    for topic, window in (("hunt-dup", 0), ("hunt-once", 120_000)):
        with Client(waymark_server.url, timeout=10) as client:
            client.put_topic(
                topic, ConfigPatch(durability=Durability.FSYNC, idempotency_window_ms=window)
            )
            record = RecordIn.of({"p": 0, "n": 0, "user": "u0"}, id="p0-0", tag="k0")
            client.append(topic, [record])  # its answer lost on the way, say
            acked = {"p0-0": client.append(topic, [record]).seqs[0]}  # the retry's answer
            got = _read_topic(client, topic, [])
        read = {rid: seq for rid, seq, _ in got}
        assert checkers.acknowledged_lost(acked, read, topic).ok  # blind to the copy
        once = checkers.stored_once({topic: [rid for rid, _, _ in got]})
        assert once.ok is bool(window), once
    assert once.summary.startswith("0 id(s) stored more than once among 1 records")
