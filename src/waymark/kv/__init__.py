"""waymark.kv: durable local folds of NATS JetStream KV buckets.

A fold store holds the bucket's state plus the watch cursor it is consistent
with; ``watch_applied`` keeps it current and only ever persists a cursor whose
updates have been applied, so a restarted node resumes with the delta instead
of a full replay. See docs/kv.md.
"""

from waymark.kv.applied import (
    AppliedCursor,
    BatchConfig,
    ExportRequest,
    submit_export,
    watch_applied,
)
from waymark.kv.artifact import ExportInfo, ExportManifest
from waymark.kv.artifact_import import import_and_open, import_artifact
from waymark.kv.bucket import KvReader, KvStore, KvWriter, StoreConfig
from waymark.kv.connection import Connection, ConnectionCapabilities, NatsConnectionConfig
from waymark.kv.errors import (
    AlreadyExists,
    ArtifactInvalid,
    ArtifactUnavailable,
    BucketNotFound,
    Corrupted,
    CursorExpired,
    InvalidFormat,
    KvConnectionError,
    KvError,
    NothingPublished,
    RevisionMismatch,
    SnapshotError,
    SnapshotIoError,
    Timeout,
    WatchError,
)
from waymark.kv.export import RoundReport, RoundResult, RoundState, export_via, run_export_round
from waymark.kv.lease import ExportLease, LeaseGuard, LeaseRecord
from waymark.kv.stores import SnapshotStore, open_store, stale_keys
from waymark.kv.transport import ObjectStoreTransport, PublishOutcome
from waymark.kv.types import (
    NO_CURSOR,
    UNKNOWN_VERSION,
    KvEntry,
    KvUpdate,
    Op,
    VersionToken,
    WatchCursor,
    WatchScope,
)
from waymark.kv.watcher import KvWatch, KvWatcher

__all__ = [
    "NO_CURSOR",
    "UNKNOWN_VERSION",
    "AlreadyExists",
    "AppliedCursor",
    "ArtifactInvalid",
    "ArtifactUnavailable",
    "BatchConfig",
    "BucketNotFound",
    "Connection",
    "ConnectionCapabilities",
    "Corrupted",
    "CursorExpired",
    "ExportInfo",
    "ExportLease",
    "ExportManifest",
    "ExportRequest",
    "InvalidFormat",
    "KvConnectionError",
    "KvEntry",
    "KvError",
    "KvReader",
    "KvStore",
    "KvUpdate",
    "KvWatch",
    "KvWatcher",
    "KvWriter",
    "LeaseGuard",
    "LeaseRecord",
    "NatsConnectionConfig",
    "NothingPublished",
    "ObjectStoreTransport",
    "Op",
    "PublishOutcome",
    "RevisionMismatch",
    "RoundReport",
    "RoundResult",
    "RoundState",
    "SnapshotError",
    "SnapshotIoError",
    "SnapshotStore",
    "StoreConfig",
    "Timeout",
    "VersionToken",
    "WatchCursor",
    "WatchError",
    "WatchScope",
    "export_via",
    "import_and_open",
    "import_artifact",
    "open_store",
    "run_export_round",
    "stale_keys",
    "submit_export",
    "watch_applied",
]
