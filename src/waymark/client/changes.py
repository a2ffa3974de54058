"""Change checkpoints (docs/semantics/recovery.md §1): the newest-first walk and the
SSE stream, shared by the sync and async clients."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlencode

import msgspec

from ..protocol import ENDPOINT, Checkpoint, CheckpointPage
from . import calls
from .events import Subscription

_page = calls.typed(CheckpointPage)
_checkpoint = msgspec.json.Decoder(Checkpoint)


def list_checkpoints(
    earliest_ms: int, before: int | None, limit: int, topics: Iterable[str] | None
) -> calls.Call[CheckpointPage]:
    params: dict[str, object] = {"earliest_ms": earliest_ms, "limit": limit}
    if before is not None:
        params["before"] = before
    if topics is not None:
        params["topic"] = list(topics)
    return calls.call("listCheckpoints", _page, params=params)


class CheckpointWatch(Subscription[Checkpoint]):
    """One subscription to new checkpoints across reconnects: ``Last-Event-ID`` is the
    last checkpoint id handed out."""

    def __init__(
        self, after: int | None, topics: Iterable[str] | None, max_retries: int | None
    ) -> None:
        query = urlencode([("topic", t) for t in topics or ()])
        target = ENDPOINT["watchCheckpoints"].url() + (f"?{query}" if query else "")
        super().__init__(target, None if after is None else str(after), max_retries)

    def feed(self, line: str) -> Checkpoint | None:
        done = self.complete(line)
        if done is None or done[0] != "checkpoint" or done[1] is None:
            return None
        self.cursor = done[1]
        return _checkpoint.decode(done[2])
