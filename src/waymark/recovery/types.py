"""The names a recovering client uses (docs/semantics/recovery.md §2)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..protocol import Checkpoint
from ..protocol.errors import WaymarkError


@dataclass(frozen=True, slots=True)
class CommittedVersion:
    """A version of a key known to be committed: the client should (re)process the
    key's current state and then receipt ``(key, version, epoch)``. ``version`` is a
    seq of the topic instance ``epoch`` (a recreated topic's seqs start again, in a
    later epoch: docs/semantics/recovery.md §1.1)."""

    key: str
    version: int
    epoch: int


@dataclass(frozen=True, slots=True)
class WindowLoss:
    """Checkpoints ``first``..``last`` (ids, inclusive) could not be examined: a change
    named only there and never receipted is lost to this client, like a tombstone's gap
    in a read (docs/semantics/recovery.md §3.2). ``reason``: ``"expired"``, the server's
    recovery window (``--recovery-window-s``) removed them; ``"outside_window"``, older
    than this service's ``max_window_s``."""

    first: int
    last: int
    reason: str


@dataclass(frozen=True, slots=True)
class ServerView:
    """What a source's last answers said of the server: its instance id ("" unknown,
    docs/semantics/recovery.md §3.5), the highest checkpoint id its recovery window
    removed (0: none), and the newest checkpoint the last walk left out for being
    older than it asked for (0: none, docs/semantics/recovery.md §3.2)."""

    instance: str = ""
    expired_to: int = 0
    older: int = 0


Missed = list[CommittedVersion | WindowLoss]  # what a recovery query reports, losses first

CommittedVersionListener = Callable[[CommittedVersion], None]
CheckpointListener = Callable[[Checkpoint], None]


class RecoveryError(WaymarkError):
    """A receipt refused (a version not known to be committed) or not persisted."""


class CheckpointSource(Protocol):
    """Where change checkpoints come from (docs/semantics/recovery.md §1.5)."""

    @property
    def topics(self) -> Sequence[str] | None:
        """The topics whose changes it hands out, None for all
        (docs/semantics/recovery.md §3.4)."""
        ...

    def newest_id(self) -> int:
        """The newest checkpoint's id (0: none yet)."""
        ...

    def view(self) -> ServerView:
        """What the last :meth:`newest_id` and :meth:`request_checkpoints` answers said
        of the server (docs/semantics/recovery.md §3.2, §3.5)."""
        ...

    def request_checkpoints(self, earliest_ms: int) -> Iterator[Checkpoint]:
        """Checkpoints back to time ``earliest_ms``, newest first."""
        ...

    def committed(self, key: str, version: int, epoch: int) -> str | None:
        """Why the log shows no committed ``version`` of ``key`` in topic instance
        ``epoch`` (None: it may; a receipt of a key no checkpoint the service saw
        names, docs/semantics/recovery.md §2.1)."""
        ...

    def register_checkpoint_listener(
        self,
        listener: CheckpointListener,
        after: int,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Call ``listener`` with every checkpoint whose id is above ``after``, in id
        order, from now on; ``on_error`` with what ended that for good (the server
        refused, or stayed unreachable past the client's retries)."""
        ...

    def close(self) -> None: ...
