"""Typed errors of the KV layer and of the fold stores.

Every failure has its own class (docs/semantics/kv.md §8) so callers branch on
the kind, not on message text. Causes from nats-py are flattened into the message
at the boundary: the caller needs the context, not the client library's type.
"""

from __future__ import annotations

from ..protocol.errors import WaymarkError


class KvError(WaymarkError):
    """Base of every error raised by the KV layer."""


class CursorExpired(KvError):
    """The resume cursor lies outside the stream's retention window.

    Raised instead of letting NATS silently clamp a start below the first
    sequence, or silently deliver nothing from beyond the last one (bucket
    recreated).
    """

    def __init__(self, revision: int, first_sequence: int, last_sequence: int, why: str) -> None:
        super().__init__(
            f"cursor {revision} expired ({why}; stream holds {first_sequence}..{last_sequence})"
        )
        self.revision = revision
        self.first_sequence = first_sequence
        self.last_sequence = last_sequence


class RevisionMismatch(KvError):
    """A CAS write lost: the key's current version is not the expected one."""


class AlreadyExists(KvError):
    """``create`` found a live value under the key."""


class Timeout(KvError, TimeoutError):
    """A NATS operation did not complete within the configured timeout."""


class WatchError(KvError):
    """A watch stopped: stream dropped, floor guard tripped, or the fold store kept failing."""


class BucketNotFound(KvError):
    """The bucket does not exist, and the caller asked not to create it."""


class KvConnectionError(KvError):
    """Connecting, or using a connection that is not connected, failed."""


class SnapshotError(KvError):
    """Base of every error raised by a fold store (a kind of :class:`KvError`)."""


class Corrupted(SnapshotError):
    """A record in the middle of the fold log fails its CRC."""


class InvalidFormat(SnapshotError):
    """The fold file has the wrong magic or an unsupported format version."""


class SnapshotIoError(SnapshotError):
    """An I/O failure in a fold store, including use of a poisoned writer."""


class StoreInUse(SnapshotError):
    """Another process runs a fold on this store (it holds the store's lock)."""


class ArtifactInvalid(SnapshotError):
    """A fold artifact was refused at import; nothing was written at the destination
    (docs/semantics/kv.md §9.3).

    Raised for a wrong backend or format generation (before anything is
    opened), a manifest that does not parse, a file missing, extra or not
    matching its BLAKE3 digest, a payload whose embedded manifest is not the
    pointer, or a copy whose recovered cursor differs from the manifest's.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ArtifactUnavailable(KvError):
    """No artifact could be fetched: no pointer, or its payload is gone (pruned)."""


class NothingPublished(ArtifactUnavailable):
    """No pointer at all: nothing was ever published under the key (or it was removed).

    The one unavailability a new fleet's first node may treat as "start from an
    empty fold" (``waymark fold --bootstrap-from URL --if-exists``); a pointer
    whose payload is gone is not that.
    """
