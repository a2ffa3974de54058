"""The names a recovering client uses (docs/semantics/recovery.md §2)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..protocol import Checkpoint


@dataclass(frozen=True, slots=True)
class CommittedVersion:
    """A version of a key known to be committed: the client should (re)process the
    key's current state and then receipt ``(key, version, epoch)``. ``version`` is a
    seq of the topic instance ``epoch`` (a recreated topic's seqs start again, in a
    later epoch: docs/semantics/recovery.md §1.1)."""

    key: str
    version: int
    epoch: int


CommittedVersionListener = Callable[[CommittedVersion], None]
CheckpointListener = Callable[[Checkpoint], None]


class RecoveryError(Exception):
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

    def instance(self) -> str:
        """The server instance the last :meth:`newest_id` answered for ("" unknown):
        checkpoint ids count within one instance (docs/semantics/recovery.md §3.5)."""
        ...

    def request_checkpoints(self, earliest_ms: int) -> Iterator[Checkpoint]:
        """Checkpoints back to time ``earliest_ms``, newest first."""
        ...

    def register_checkpoint_listener(self, listener: CheckpointListener, after: int) -> None:
        """Call ``listener`` with every checkpoint whose id is above ``after``, in id
        order, from now on."""
        ...

    def close(self) -> None: ...
