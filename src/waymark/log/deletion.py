"""Deletion selectors (docs/semantics/topics.md §7.1): tag matches parsed from the wire grammar.

A ``Glob`` is the one glob syntax of docs/globs.md (:mod:`waymark.protocol.globs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..protocol.globs import glob_matches, literal_prefix
from .errors import ErrorCode, TopicError


@dataclass(frozen=True, slots=True)
class TagMatch:
    """``["tag","Eq","X"]`` (exact) or ``["tag","Glob","P"]`` (a glob, docs/globs.md)."""

    exact: bool
    value: str  # the tag, or the Glob's pattern

    @classmethod
    def parse(cls, match: Any) -> TagMatch:
        if isinstance(match, str):
            return cls(True, match)
        if (
            isinstance(match, (list, tuple))
            and len(match) == 3
            and match[0] == "tag"
            and isinstance(match[2], str)
        ):
            op, pattern = match[1], match[2]
            if op == "Eq":
                return cls(True, pattern)
            if op == "Glob":
                return cls(False, pattern)
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            'match is "X", ["tag","Eq","X"] or ["tag","Glob","PATTERN"]',
            {"match": match},
        )

    @property
    def prefix(self) -> str:
        """What every matching tag starts with: a range of the sorted tag index."""
        return self.value if self.exact else literal_prefix(self.value)

    def matches(self, tag: str) -> bool:
        return tag == self.value if self.exact else glob_matches(self.value, tag)

    def wire(self) -> list[str]:
        """The normal form: ``["tag","Eq","X"]`` or ``["tag","Glob","P"]``."""
        return ["tag", "Eq" if self.exact else "Glob", self.value]
