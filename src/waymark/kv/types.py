"""Value types shared by the KV layer, ``watch_applied`` and the fold stores.

They are msgspec structs with ``gc=False``: a catch-up moves millions of them,
and untracked objects keep the cyclic collector out of the hot path.
"""

from __future__ import annotations

import enum

import msgspec


class VersionToken(msgspec.Struct, frozen=True, gc=False):
    """Opaque per-key version. NATS: the 8-byte big-endian stream sequence.

    Stored as raw bytes (up to 255) so tokens of other backends, such as a
    10-byte versionstamp, survive a round trip through a fold store. The empty
    token is the *unknown* version: it never moves a cursor.
    """

    raw: bytes = b""

    @classmethod
    def from_u64(cls, revision: int) -> VersionToken:
        return cls(revision.to_bytes(8, "big"))

    def as_u64(self) -> int | None:
        """The NATS revision, or None for an unknown or non-NATS token."""
        return int.from_bytes(self.raw, "big") if len(self.raw) == 8 else None

    @property
    def is_unknown(self) -> bool:
        return not self.raw


UNKNOWN_VERSION = VersionToken()


class WatchCursor(msgspec.Struct, frozen=True, gc=False):
    """Opaque resume position of a watch: the stream sequence of the last applied update.

    The empty cursor means "no position": resuming from it is a full state-sync.
    """

    raw: bytes = b""

    @classmethod
    def from_u64(cls, revision: int) -> WatchCursor:
        return cls(revision.to_bytes(8, "big")) if revision > 0 else NO_CURSOR

    def as_u64(self) -> int:
        """The stream sequence; 0 for the empty cursor."""
        return int.from_bytes(self.raw, "big") if self.raw else 0

    @property
    def is_none(self) -> bool:
        return not self.raw

    def __str__(self) -> str:
        return "none" if self.is_none else str(self.as_u64())


NO_CURSOR = WatchCursor()


class Op(enum.IntEnum):
    PUT = 1
    DELETE = 2
    PURGE = 3


class KvEntry(msgspec.Struct, frozen=True, gc=False):
    """One key, value and version from a read. An empty value is a CAS tombstone."""

    key: str
    value: bytes
    version: VersionToken


class KvUpdate(msgspec.Struct, frozen=True, gc=False):
    """One watch event. Deletes and purges carry an empty value."""

    op: Op
    key: str
    value: bytes
    version: VersionToken

    @property
    def revision(self) -> int | None:
        return self.version.as_u64()

    @classmethod
    def put(cls, key: str, value: bytes, revision: int) -> KvUpdate:
        return cls(Op.PUT, key, value, VersionToken.from_u64(revision))

    @classmethod
    def delete(cls, key: str, revision: int | None) -> KvUpdate:
        """A delete; ``revision=None`` makes a synthetic delete with the unknown version."""
        version = UNKNOWN_VERSION if revision is None else VersionToken.from_u64(revision)
        return cls(Op.DELETE, key, b"", version)


class WatchScope(msgspec.Struct, frozen=True):
    """What a watch covers: every key (no prefixes) or the union of key prefixes.

    A prefix ends at a token boundary (``"users."``) because NATS filters on
    subject tokens; ``prefixes=()`` is the All scope.
    """

    prefixes: tuple[str, ...] = ()

    @classmethod
    def all(cls) -> WatchScope:
        return cls()

    @classmethod
    def prefix(cls, prefix: str) -> WatchScope:
        return cls((prefix,))

    @classmethod
    def of(cls, prefixes: list[str] | tuple[str, ...]) -> WatchScope:
        return cls(tuple(prefixes))

    @property
    def is_all(self) -> bool:
        return not self.prefixes

    def contains(self, key: str) -> bool:
        return not self.prefixes or key.startswith(self.prefixes)

    def __post_init__(self) -> None:
        for p in self.prefixes:
            if not p or not p.endswith("."):
                raise ValueError(f"prefix {p!r} must be non-empty and end with '.'")
