"""Which NATS failures a watch's reset retries (docs/semantics/kv.md §4.4): nats-py's own
exception classes, as its JetStream client raises them from a server's answer."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from waymark.kv import CursorExpired, KvConnectionError, Timeout, WatchError
from waymark.kv.transient import transient


def api_error(code: int, err_code: int | None, description: str) -> BaseException:
    """The exception nats-py's JetStream client raises for an API error answer."""
    try:
        nats.js.errors.APIError.from_error(
            {"code": code, "err_code": err_code, "description": description}
        )
    except nats.js.errors.APIError as e:
        return e
    raise AssertionError("from_error always raises")


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (Timeout("create consumer timed out after 2s"), True),
        (nats.errors.TimeoutError(), True),
        (nats.errors.NoRespondersError(), True),
        (nats.js.errors.ServiceUnavailableError(), True),  # nats-py's no responders, 503
        (api_error(503, 10008, "JetStream system temporarily unavailable"), True),
        (api_error(500, 10009, "JetStream cluster can not handle request"), True),
        (api_error(500, 10118, "stream is offline"), True),
        (nats.errors.ConnectionReconnectingError(), True),
        (nats.errors.StaleConnectionError(), True),
        (KvConnectionError("cannot connect"), True),
        (api_error(404, 10059, "stream not found"), False),  # the bucket was deleted
        (api_error(400, 10003, "bad request"), False),
        (api_error(500, 10012, "consumer create failed"), False),
        (nats.errors.ConnectionClosedError(), False),  # closed for good (no reconnect limit)
        (nats.errors.AuthorizationError(), False),
        (CursorExpired(5, 9, 12, "evicted"), False),
        (WatchError("live watch overrun by retention"), False),
        (ValueError("a bug"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_transient(error: BaseException, retried: bool) -> None:
    assert transient(error) is retried
