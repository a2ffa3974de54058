"""SIGKILL a real ``waymark serve --data-dir`` while a router forwards: after the
restart every source record reaches dest at least once, in source order, and with
``exactly_once`` dest holds each source record once, under its key
(docs/semantics/topics.md §8.2)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest

from .conftest import RouterHttp, eventually, ok

RECORDS = 3000


def first_occurrences(values: list[int]) -> list[int]:
    seen: set[int] = set()
    return [v for v in values if not (v in seen or seen.add(v))]  # type: ignore[func-returns-value]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_forwarded_copies_recover_after_sigkill(
    spawn_server: Callable, tmp_path: Path, guarantee: str
) -> None:
    # A short seal interval: the crash lands with a cursor in the catalog.
    server = spawn_server(tmp_path, "--seal-interval-s", "0.2")
    api = RouterHttp(httpx.Client(base_url=server.url, timeout=10))
    ok(api.http.put("/v0/topics/src", json={"durability": "fsync"}), 201)
    ok(api.put_router("r", source="src", dest="dst", guarantee=guarantee), 201)
    for start in range(0, RECORDS, 100):
        api.produce("src", *range(start, start + 100))  # fsync: durable once acked
        if start == RECORDS // 2:
            eventually(lambda: len(api.data("dst")) > 0)  # forwarding is under way
    server.stop(signal.SIGKILL)
    api = RouterHttp(httpx.Client(base_url=spawn_server(tmp_path).url, timeout=10))
    assert api.data("src") == list(range(RECORDS))
    eventually(lambda: set(api.data("dst")) == set(range(RECORDS)))
    copies = api.data("dst")
    assert first_occurrences(copies) == list(range(RECORDS))  # per-source FIFO
    assert ok(api.http.get("/v0/routers/r"))["cursor"] == ok(api.http.get("/v0/topics/src"))[
        "head_seq"]  # fmt: skip
    if guarantee == "exactly_once":
        assert copies == list(range(RECORDS))  # never twice
        keys = [orjson.loads(r["meta"]["_topics_router"]) for r in api.records("dst")]
        epoch = ok(api.http.get("/v0/topics/src"))["epoch"]
        assert keys == [["r", "src", epoch, value + 1] for value in range(RECORDS)]
