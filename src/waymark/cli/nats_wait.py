"""A long-running NATS command's start: wait for a server instead of exiting.

A daemon such as ``waymark fold`` may start before its NATS servers (a machine
booting, a cluster restarting) or while the node it reaches dies. A NATS
client keeps trying until a server answers (nats-py without an attempt limit,
Go's ``RetryOnFailedConnect``); so does the start here: a step that fails
because NATS is unreachable or did not answer in time is retried after a
capped, jittered backoff, and each retry is printed (docs/kv.md, "On a NATS
cluster"). Any other error ends the start as before.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from waymark.clock import Backoff
from waymark.kv.errors import KvConnectionError, Timeout

if TYPE_CHECKING:
    from rich.console import Console

T = TypeVar("T")

START_BACKOFF = Backoff(0.5, 5.0)
"""Delays between start attempts: from 0.25-0.5 s up to 2.5-5 s."""


async def until_nats_answers(
    console: Console,
    what: str,
    step: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff = START_BACKOFF,
    rng: random.Random | None = None,
) -> T:
    """Run ``step`` (which must clean up after itself when it fails) until NATS
    answers it; ``what`` names it in the messages."""
    from rich.markup import escape

    rng = rng or random.Random()
    attempt = 0
    while True:
        try:
            out = await step()
        except (KvConnectionError, Timeout) as e:
            attempt += 1
            delay = backoff.delay(attempt, rng)
            console.print(
                f"[yellow]NATS unreachable[/yellow] ({escape(what)}): {escape(str(e))}; "
                f"retrying in {delay:.1f} s (attempt {attempt + 1})"
            )
            await asyncio.sleep(delay)
            continue
        if attempt:
            console.print(f"NATS answered ({escape(what)}) after {attempt + 1} attempts")
        return out
