"""The one glob syntax of waymark (docs/globs.md): token scopes over topic names, the
tag ``Glob`` of deletions and router filters, and the console's scope checks all match
with :func:`glob_matches`.

It is :func:`fnmatch.fnmatchcase`: case-sensitive, over the whole name; ``*`` matches
any run of characters (none included), ``?`` one character, ``[abc]``/``[a-z]`` one of
a set, ``[!abc]`` one not in it. ``/`` and ``.`` are ordinary characters. There is no
escape character: ``[*]``, ``[?]`` and ``[[]`` match those characters themselves.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

_SPECIAL = frozenset("*?[")


def glob_matches(pattern: str, name: str) -> bool:
    """Whether ``name``, whole, matches the glob ``pattern``."""
    return fnmatchcase(name, pattern)


def literal_prefix(pattern: str) -> str:
    """The characters every match starts with: ``pattern`` up to its first ``*``,
    ``?`` or ``[`` (for a range scan of a sorted index before :func:`glob_matches`)."""
    for i, char in enumerate(pattern):
        if char in _SPECIAL:
            return pattern[:i]
    return pattern


def is_glob(text: str) -> bool:
    """Whether ``text`` holds a wildcard (``*``, ``?`` or ``[``)."""
    return not _SPECIAL.isdisjoint(text)


def escape(literal: str) -> str:
    """A glob that matches ``literal`` only (each special character in a set)."""
    return "".join(f"[{c}]" if c in _SPECIAL else c for c in literal)
