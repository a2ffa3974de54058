"""Deletion selectors (docs/semantics/topics.md §7.1): tag matches parsed from the wire grammar."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ErrorCode, TopicError


@dataclass(frozen=True, slots=True)
class TagMatch:
    """``["tag","Eq","X"]`` (exact) or ``["tag","Glob","X*"]`` (trailing prefix)."""

    exact: bool
    value: str  # the tag, or the literal prefix for a Glob

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
                if not pattern.endswith("*"):
                    raise TopicError(
                        ErrorCode.INVALID_REQUEST,
                        "a Glob pattern is a literal prefix followed by a single trailing '*'",
                        {"match": match},
                    )
                return cls(False, pattern[:-1])
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            'match is "X", ["tag","Eq","X"] or ["tag","Glob","X*"]',
            {"match": match},
        )

    def matches(self, tag: str) -> bool:
        return tag == self.value if self.exact else tag.startswith(self.value)
