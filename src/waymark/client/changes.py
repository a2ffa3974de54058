"""Change checkpoints (docs/semantics/recovery.md §1): the newest-first walk and the
SSE stream, shared by the sync and async clients."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from ..protocol import ENDPOINT, Checkpoint, CheckpointPage
from . import calls
from .events import Watch

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


class CheckpointWatch(Watch):
    """One subscription to new checkpoints across reconnects: ``Last-Event-ID`` is the
    last checkpoint id handed out."""

    def __init__(
        self, after: int | None, topics: Iterable[str] | None, max_retries: int | None
    ) -> None:
        super().__init__("-", from_seq=0, node=None, epoch=None, cursor=None,
                         max_retries=max_retries)  # fmt: skip
        self.path = ENDPOINT["watchCheckpoints"].path
        self.params = [("topic", t) for t in topics or ()]
        if after is not None:
            self.cursor = str(after)

    def feed_checkpoint(self, line: str) -> Checkpoint | None:
        """One line of the stream; a checkpoint when a blank line completes one."""
        done = self.complete(line)
        if done is None or done[0] != "checkpoint" or done[1] is None:
            return None
        self.cursor = done[1]
        return _checkpoint.decode(done[2])
