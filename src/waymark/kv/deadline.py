"""Every NATS await under a deadline (docs/semantics/kv.md §8).

Its own module: the connection, the bucket and the consumers all use it, and the
connection vends buckets, so it cannot live in any of them without a cycle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import nats.errors

from waymark.kv.errors import Timeout

T = TypeVar("T")


async def timed(aw: Awaitable[T], timeout: float, what: str) -> T:
    """Await ``aw`` for at most ``timeout`` seconds.

    A half-dead TCP connection (CLOSE_WAIT) would otherwise park the await
    forever: nats-py does not fail in-flight requests when the socket dies.

    ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11 the latter returns
    the answer when a cancel of the awaiting task meets it, and the task goes on as if
    never cancelled (a fold told to stop then never stopped).
    """
    try:
        async with asyncio.timeout(timeout):
            return await aw
    except (TimeoutError, nats.errors.TimeoutError) as e:
        raise Timeout(f"{what} timed out after {timeout:g}s") from e


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling it again while it runs.

    A single cancel can be swallowed: nats-py awaits its requests with
    ``asyncio.wait_for``, which on Python 3.11 returns an answer that meets a cancel,
    so the task goes on; awaited once, it would be waited for forever. Its own
    exception, if it failed, is raised here; a cancellation is not.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    if not task.cancelled():
        task.result()
