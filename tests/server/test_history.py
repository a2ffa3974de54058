"""The append-rate history the console charts (docs/console.md, "Rate history"): the
pure sampler on a manual clock, and the route through the shipped client against a
real ``waymark serve``."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from tests.conftest import ServerProcess

from waymark.client import ApiError, Client
from waymark.protocol import RecordIn
from waymark.server.history import AppendHistory

pytestmark = pytest.mark.timeout(60)


def test_a_quiet_stretch_reads_as_zero_and_a_burst_lands_in_its_own_interval() -> None:
    history = AppendHistory(interval_ms=1000, keep=100)
    state = {"t": (1, 10, 100)}
    history.changed("t")
    history.tick(1_000, state.get)
    history.tick(2_000, state.get)  # unchanged: no point
    state["t"] = (1, 30, 300)
    history.changed("t")
    history.tick(9_000, state.get)
    samples = history.of("t", 1, 9_500, 30, 300).samples
    # The hold point at the tick before the burst makes the rate exact: 0 until 8 s,
    # then 20 appends in [8 s, 9 s]; the state now closes the series.
    assert samples == [(1_000, 10, 100), (8_000, 10, 100), (9_000, 30, 300), (9_500, 30, 300)]


def test_a_recreated_topic_starts_a_new_history_and_a_deleted_one_drops_it() -> None:
    history = AppendHistory(interval_ms=1000)
    state: dict[str, tuple[int, int, int]] = {"t": (1, 5, 50)}
    history.changed("t")
    history.tick(1_000, state.get)
    state["t"] = (2, 1, 10)  # deleted and created again: epoch 2
    history.changed("t")
    history.tick(2_000, state.get)
    assert history.of("t", 2, 2_000, 1, 10).samples == [(2_000, 1, 10)]
    assert history.of("t", 1, 2_000, 5, 50).samples == [(2_000, 5, 50)]  # no old points
    del state["t"]
    history.changed("t")
    history.tick(3_000, state.get)
    assert history.of("t", 2, 3_000, 0, 0).samples == [(3_000, 0, 0)]


def test_the_history_is_bounded_in_points_and_topics() -> None:
    history = AppendHistory(interval_ms=1, keep=4, max_topics=3)
    for t in range(1, 200):
        for name in ("a", "b", "c"):
            history.changed(name)
        history.tick(t, lambda name, t=t: (1, t, t))
        assert history.points_held < 2 * 4 * len(history.sampled())
    samples = history.of("c", 1, 199, 199, 199).samples
    assert [p[0] for p in samples] == [196, 197, 198, 199]  # the newest `keep`
    # A fourth topic pushes out the one that changed least recently.
    for t, name in enumerate(("b", "c", "a", "d"), start=200):
        history.changed(name)
        history.tick(t, lambda name, t=t: (1, t, t))
    assert history.sampled() == ["c", "a", "d"]


def wait_until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server took no sample in time"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def server(
    spawn_module_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> ServerProcess:
    return spawn_module_server(tmp_path_factory.mktemp("history"), "--history-interval-s", "0.1")


def test_the_server_samples_appends_and_a_client_reads_them_back(server: ServerProcess) -> None:
    with Client(server.url) as client:
        client.append("rates", [RecordIn.of(i) for i in range(5)])
        wait_until(lambda: len(client.topic_history("rates").samples) >= 2, 10)
        client.append("rates", [RecordIn.of(i) for i in range(7)])
        wait_until(lambda: any(p[1] == 12 for p in client.topic_history("rates").samples[:-1]),
                   10)  # fmt: skip
        history = client.topic_history("rates")
        state = client.get_topic("rates", touch=False)
        assert history.epoch == state.epoch and history.interval_ms == 100
        times = [p[0] for p in history.samples]
        assert times == sorted(times)
        heads = [p[1] for p in history.samples]
        assert heads == sorted(heads) and heads[0] >= 5 and heads[-1] == 12
        assert history.samples[-1][2] == state.bytes
        with pytest.raises(ApiError) as missing:
            client.topic_history("nobody")
        assert (missing.value.status, missing.value.code) == (404, "topic_not_found")
