"""The Python client's queue calls, sync and async, against the real server."""

from __future__ import annotations

from typing import Any

import pytest

from waymark.client import ApiError, AsyncClient, Client, ConfigPatch, RecordIn, TopicType
from waymark.protocol import DeadLetterError, Discard, ErrorCode, QueueCounts


def test_sync_client_runs_the_lease_lifecycle(waymark_server: Any, q: str) -> None:
    with Client(waymark_server.url) as client:
        client.put_topic(q, ConfigPatch(max_deliveries=1, dead_letter=f"{q}.dlq"),
                         type=TopicType.QUEUE)  # fmt: skip
        client.append(q, [RecordIn.of({"n": i}) for i in range(3)])
        jobs = client.claim(q, "w", 3, lease_ms=5000)
        assert [(j.seq, j.data, j.delivery) for j in jobs] == [(1, {"n": 0}, 1), (2, {"n": 1}, 1),
                                                               (3, {"n": 2}, 1)]  # fmt: skip
        assert client.ack(q, "w", [1], lease_ids=[jobs[0].lease_id]).acked == [1]
        extended = client.extend(q, "w", [2], lease_ms=9000)
        assert extended.extended == [2]
        assert client.nack(q, "w", [3]).released == [3]
        assert client.claim(q, "w") == []  # seq 3 is dead-lettered instead of redelivered
        state = client.get_topic(q, touch=False)
        assert state.queue == QueueCounts(0, 1, 1, earliest_lease_deadline=extended.deadlines[0])
        assert client.redrive(q).seqs == [4]
        client.put_topic("plain-log-for-client")
        with pytest.raises(ApiError) as refused:
            client.claim("plain-log-for-client", "w")
        assert (refused.value.status, refused.value.code) == (409, "not_a_queue")


def test_the_client_decodes_a_parked_dead_letter_as_typed_counts(
    waymark_server: Any, q: str
) -> None:
    """A dead-letter move the dead-letter topic refuses parks the job; the state's
    queue counts carry it as protocol types, the refusal a DeadLetterError."""
    dlq = f"{q}.full-dlq"
    with Client(waymark_server.url) as client:
        client.put_topic(dlq, ConfigPatch(cap_records=1, discard=Discard.REJECT))
        client.append(dlq, [RecordIn.of("already here")])
        client.put_topic(q, ConfigPatch(max_deliveries=1, dead_letter=dlq), type=TopicType.QUEUE)
        client.append(q, [RecordIn.of("poison")])
        [job] = client.claim(q, "w")
        client.nack(q, "w", [job.seq])
        assert client.claim(q, "w") == []  # dead, and the dead-letter topic refuses it
        counts = client.get_topic(q, touch=False).queue
        assert isinstance(counts, QueueCounts)
        error = counts.dead_letter_error
        assert isinstance(error, DeadLetterError)
        assert (error.code, error.topic) == (ErrorCode.TOPIC_FULL, dlq) and error.message
        assert counts == QueueCounts(0, 0, 0, dead_letter_parked=1, dead_letter_error=error)


async def test_async_client_claims_and_acks(waymark_server: Any, q: str) -> None:
    async with AsyncClient(waymark_server.url) as client:
        await client.put_topic(q, type=TopicType.QUEUE)
        await client.append(q, [RecordIn.of(i) for i in range(2)])
        jobs = await client.claim(q, "w", 2)
        answer = await client.ack(q, "w", [j.seq for j in jobs])
        assert answer.acked == [1, 2] and answer.skipped == []
        assert (await client.nack(q, "w", [1])).skipped == [1]
        assert (await client.redrive(q)).seqs == []
