"""A client with ``patience`` waits out a server outage (docs/client.md, "Outages"):
against a real server that is not up yet, one behind a cut connection, and nothing at
all; the waits go through an injected clock and sleep, so no test sleeps them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from waymark.client import (
    ApiError,
    AsyncClient,
    Client,
    ConnectError,
    ErrorCode,
    Patience,
    RecordIn,
    TransportError,
)
from waymark.client.patience import worth_retrying
from waymark.faults.processes import free_port
from waymark.faults.proxy import FaultProxy


class FakeTime:
    """The injected clock and sleep: a sleep moves the clock, runs ``on_sleep`` if set."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []
        self.on_sleep: Callable[[int], None] | None = None

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds
        if self.on_sleep is not None:
            self.on_sleep(len(self.slept))

    def patience(self, budget_s: float) -> Patience:
        return Patience(budget_s, now=self.now, sleep=self.sleep, rng=random.Random(7))


def test_a_write_waits_for_a_server_that_is_not_up_yet(
    start_waymark: Callable[..., Any], topic: str
) -> None:
    # Nothing listens: the connection is refused, nothing was sent, so even an append
    # (not idempotent) is sent again once the server is up (started on the third wait).
    port = free_port()
    clock = FakeTime()
    clock.on_sleep = lambda n: start_waymark(port=port) if n == 3 else None
    with Client(f"http://127.0.0.1:{port}", patience=clock.patience(60)) as client:
        answer = client.append(topic, [RecordIn.of({"n": 1})], create=True)
        assert answer.seqs == [1]
        assert len(client.diff(topic, 0).records) == 1
    assert len(clock.slept) == 3
    assert clock.slept[0] < clock.slept[2]  # the backoff grows


def test_the_budget_spent_the_error_is_raised() -> None:
    clock = FakeTime()
    with (
        Client(f"http://127.0.0.1:{free_port()}", patience=clock.patience(5)) as client,
        pytest.raises(ConnectError),
    ):
        client.get_topic("t")
    assert sum(clock.slept) == pytest.approx(5.0)  # the last wait is cut to the budget
    assert max(clock.slept) <= 2.0  # the cap


def test_without_patience_a_refused_connection_raises_at_once() -> None:
    with Client(f"http://127.0.0.1:{free_port()}") as client, pytest.raises(ConnectError):
        client.get_topic("t")


def test_a_lost_answer_is_asked_again_only_when_idempotent(waymark_server: Any, topic: str) -> None:
    port = int(waymark_server.url.rsplit(":", 1)[1])
    proxy = FaultProxy(port).start()
    clock = FakeTime()
    try:
        with Client(proxy.url, patience=clock.patience(60)) as client:
            client.append(topic, [RecordIn.of({"n": 1})], create=True)
            # Cut: a connection is accepted and closed, so the request may have reached
            # the server. A read is asked again (and answered once the cut heals)...
            proxy.cut()
            clock.on_sleep = lambda n: proxy.restore() if n == 2 else None
            assert client.get_topic(topic).head_seq == 1
            assert len(clock.slept) == 2
            # ...an append is not: sending it twice could write it twice.
            proxy.cut()
            clock.on_sleep = None
            with pytest.raises(TransportError) as raised:
                client.append(topic, [RecordIn.of({"n": 2})])
            assert not isinstance(raised.value, ConnectError)
            assert len(clock.slept) == 2  # no wait: raised at once
            proxy.restore()
            assert client.get_topic(topic).head_seq == 1
    finally:
        proxy.stop()


def test_the_async_client_waits_too(start_waymark: Callable[..., Any], topic: str) -> None:
    port = free_port()

    async def main() -> int:
        patience = Patience(30, base_s=0.01, cap_s=0.05)
        async with AsyncClient(f"http://127.0.0.1:{port}", patience=patience) as client:
            loop = asyncio.get_running_loop()
            # The server comes up while the append waits (started from another thread).
            starting = loop.run_in_executor(None, lambda: start_waymark(port=port))
            answer = await client.append(topic, [RecordIn.of({"n": 1})], create=True)
            await starting
            return answer.seqs[0]

    assert asyncio.run(main()) == 1


@pytest.mark.parametrize(
    ("error", "idempotent", "retried"),
    [
        (ConnectError("refused"), False, True),
        (TransportError("reset"), True, True),
        (TransportError("reset"), False, False),
        (ApiError(503, "storage_unavailable", "disk full", {}), False, True),
        (ApiError(503, "server_busy", "too many connections", {}), False, True),
        (ApiError(429, "rate_limited", "slow down", {"retry_after_s": 3}), False, True),
        (ApiError(429, "too_many_streams", "limit", {}), True, False),
        (ApiError(404, "topic_not_found", "no", {}), True, False),
        (ApiError(409, "epoch_mismatch", "fenced", {}), True, False),
    ],
)
def test_what_is_sent_again(error: Exception, idempotent: bool, retried: bool) -> None:
    assert worth_retrying(error, idempotent) is retried


def test_retry_after_is_honoured() -> None:
    clock = FakeTime()
    outage = clock.patience(60).outage("POST /v0/topics/t")
    limited = ApiError(429, ErrorCode.RATE_LIMITED.value, "slow down", {"retry_after_s": 3})
    assert outage.delay(limited) == 3.0


def test_patience_refuses_nonsense() -> None:
    for bad in ({"budget_s": -1}, {"base_s": 0}, {"base_s": 3, "cap_s": 2}):
        with pytest.raises(ValueError, match="patience"):
            Patience(**bad)  # type: ignore[arg-type]
