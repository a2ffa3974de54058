"""Every NATS await under a deadline (docs/semantics/kv.md §8).

Its own module: the connection, the bucket and the consumers all use it, and the
connection vends buckets, so it cannot live in any of them without a cycle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import nats.errors

from waymark.kv.errors import Timeout

T = TypeVar("T")


async def timed(aw: Awaitable[T], timeout: float, what: str) -> T:
    """Await ``aw`` for at most ``timeout`` seconds.

    A half-dead TCP connection (CLOSE_WAIT) would otherwise park the await
    forever: nats-py does not fail in-flight requests when the socket dies.
    """
    try:
        return await asyncio.wait_for(aw, timeout)
    except (TimeoutError, nats.errors.TimeoutError) as e:
        raise Timeout(f"{what} timed out after {timeout:g}s") from e
