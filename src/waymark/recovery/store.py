"""The receipt store protocol (docs/semantics/recovery.md §4).

A store keeps, per client, a low watermark and range receipts ``(begin, end)``: every
checkpoint with ``begin <= id <= end`` is receipted. A method returns once what it
wrote is durable and raises when it is not; the service turns that into futures.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

import msgspec


class Binding(msgspec.Struct, frozen=True):
    """What a client's receipts hold for: the server instance whose checkpoint ids they
    count (docs/semantics/recovery.md §3.5) and the topics the client reads, None for
    all (docs/semantics/recovery.md §3.4). Stored with the receipts, checked at every start."""

    instance: str
    topics: list[str] | None = None
    # What this filter may pass of the topics it leaves out: every checkpoint above
    # ``since`` (the receipts' end when a filter first took effect) and the
    # ``unreceipted`` ranges below it, the holes of the receipts then. A later filter
    # that adds topics reports what of these the receipts now hold as lost
    # (docs/semantics/recovery.md §3.4).
    since: int = 0
    unreceipted: list[tuple[int, int]] = msgspec.field(default_factory=list)

    def same(self, other: Binding | None) -> bool:
        return other is not None and (self.instance, self.topics) == (other.instance, other.topics)


class ReceiptStore(Protocol):
    def low_watermark(self, client: str) -> int | None:
        """The persisted low watermark (None: never stored)."""
        ...

    def store_low_watermark(self, client: str, checkpoint: int) -> None:
        """Every checkpoint up to ``checkpoint`` needs no recovery."""
        ...

    def store_range_receipt(self, client: str, begin: int, end: int) -> None:
        """Receipt checkpoints ``begin..end`` (inclusive); replaces the range with the
        same ``begin``, if any (a range grown at its end)."""
        ...

    def range_receipts(self, client: str, after: int) -> Iterator[tuple[int, int]]:
        """The ranges ending above ``after``, newest first by ``begin`` (they may
        overlap)."""
        ...

    def purge_range_receipts(self, client: str, begins: Iterable[int]) -> None:
        """Delete the ranges starting at ``begins`` (a merged range made them redundant)."""
        ...

    def purge_before(self, client: str, checkpoint: int) -> None:
        """Delete the ranges ending at or below ``checkpoint`` (under the watermark)."""
        ...

    def binding(self, client: str) -> Binding | None:
        """What ``client``'s receipts hold for (None: never stored)."""
        ...

    def store_binding(self, client: str, binding: Binding) -> None:
        """Bind ``client``'s receipts to a server instance and a topic filter."""
        ...

    def close(self) -> None: ...
