"""Fence epochs: the generation every edge and every record on it carries
(docs/semantics/pipeline.md §1)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True, slots=True)
class FenceEpoch:
    """A generation of one edge. Generations only grow; 0 means "never placed"."""

    value: int

    def __post_init__(self) -> None:
        if self.value < 0:
            raise ValueError(f"a fence epoch is never negative (got {self.value})")

    def bump(self) -> FenceEpoch:
        """The next generation (docs/semantics/pipeline.md §1.2)."""
        return FenceEpoch(self.value + 1)

    def is_stale(self, current: FenceEpoch) -> bool:
        """Whether something stamped with this generation is older than ``current``
        and must be dropped (docs/semantics/pipeline.md §1.3)."""
        return self.value < current.value
