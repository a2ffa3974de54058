"""Status reports: what a fold process and a recovery client tell the server about
themselves, and what the server serves back (docs/reports.md).

A KV fold (``waymark fold --report-to``) and a :class:`waymark.recovery.RecoveryService`
run outside the server, like a Kafka consumer group's members. Each sends a report
every ``interval_ms``; the server keeps the newest per reporter (durably) and answers
with it plus what only it knows: when the report arrived, whether it is stale, and
for a recovery client how many change checkpoints it is behind.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

from .limits import NonNegative

# A fold, node or client name: the characters of a topic name, 1-120 of them (a fold's
# name and node together are the tag the server keeps its report under).
ReporterName = Annotated[str, Meta(pattern="^[A-Za-z0-9][A-Za-z0-9._:-]{0,119}$")]
Label = Annotated[str, Meta(min_length=1, max_length=255)]
# How often a reporter promises to report: 0.1 s to 1 h.
IntervalMs = Annotated[int, Meta(ge=100, le=3_600_000)]

STALE_INTERVALS = 3
"""A reporter is stale once this many of its intervals passed without a report."""


class FoldExport(Struct, forbid_unknown_fields=True, frozen=True):
    """A fold's last export: the artifact the pointer names (docs/semantics/kv.md §11)."""

    cursor: NonNegative  # the bucket seq the artifact is a snapshot at
    time_ms: NonNegative  # when it was exported (the exporter's clock)
    payload: Label  # the payload's address in the object store


RestorePhase = Literal["download", "verify", "open", "done"]
"""A bootstrap's steps: fetching the payload, hashing its files, the engine's reopen,
finished (docs/kv.md, "Restore progress")."""

ExportRole = Literal["exporter", "standby"]
"""What a node with ``--export-to`` does: holds the export lease and exports, or stands by
while ``lease_holder`` does (docs/kv.md, "The export lease and export rounds")."""


class FoldRestore(Struct, forbid_unknown_fields=True, frozen=True):
    """A node's bootstrap from a published artifact: its progress while it runs, then
    what the node started from (``phase`` "done")."""

    artifact: Label  # the artifact's id (content address)
    cursor: NonNegative  # the artifact's cursor
    phase: RestorePhase
    done_bytes: NonNegative  # of this phase: payload bytes fetched, file bytes hashed
    total_bytes: NonNegative


FoldOutcome = Literal["stopped", "failed"]
"""How a fold node ended: asked to (a signal), or an error ended it."""


class FoldStopped(Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """A fold node's last report says it ended, why, and what it did while it ran
    (docs/reports.md, "A fold's final report")."""

    outcome: FoldOutcome
    time_ms: NonNegative  # when it ended (the node's clock)
    ran_ms: NonNegative  # how long it ran
    applied: NonNegative  # updates it folded while it ran
    exports: NonNegative  # artifacts it published while it ran
    message: Annotated[str, Meta(max_length=1000)] | None = None  # the error, if it failed


class FoldReport(Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """``POST /v0/folds``: one fold node's status. ``cursor`` may not pass
    ``bucket_seq`` (the reporter reads the cursor first, then the bucket). Defaults are
    left out of the body, so a server from before ``role`` and ``restore`` still takes
    the report of a node that neither exports nor bootstraps."""

    fold: ReporterName  # the fold's name: its artifact key, by default the bucket
    node: ReporterName
    backend: Label  # append-log, lmdb, rocksdb
    bucket: Label
    cursor: NonNegative  # the stream seq of the last update folded
    bucket_seq: NonNegative  # the bucket stream's last seq when reported
    interval_ms: IntervalMs = 5000
    export: FoldExport | None = None
    role: ExportRole | None = None  # None: the node does not export (no --export-to)
    lease_holder: Label | None = None  # who holds the export lease, as the node last saw
    restore: FoldRestore | None = None  # None: the node did not bootstrap
    stopped: FoldStopped | None = None  # None: the node runs; else its final report


class FoldStatus(Struct, frozen=True):
    """A fold node's newest report, as the server keeps it."""

    fold: str
    node: str
    backend: str
    bucket: str
    cursor: int
    bucket_seq: int
    lag: int  # bucket_seq - cursor: updates in the bucket not folded yet
    interval_ms: int
    export: FoldExport | None
    reported_ms: int  # when the server received it (the server's clock)
    age_ms: int  # how long ago, when this answer was made
    stale: bool  # no report for STALE_INTERVALS intervals: the node may be gone
    role: ExportRole | None = None
    lease_holder: str | None = None
    restore: FoldRestore | None = None
    stopped: FoldStopped | None = None  # the node's final report: it ended (never stale)


class FoldList(Struct, frozen=True):
    """``GET /v0/folds`` (every fold node) and ``GET /v0/folds/{fold}`` (its nodes)."""

    folds: list[FoldStatus]


class RecoveryReport(Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """``POST /v0/recovery/clients``: one recovery client's receipts
    (docs/semantics/recovery.md §2-§4)."""

    client: ReporterName
    watermark: NonNegative | None  # the persisted low watermark (None: none yet)
    range_receipts: NonNegative  # persisted range receipts above the watermark
    pending: NonNegative  # checkpoints held with keys not receipted yet
    interval_ms: IntervalMs = 5000
    # Why the client's service stopped (a listener raised, another server instance),
    # None while it runs (docs/semantics/recovery.md §3.6). Defaults are left out of
    # the body, so a server from before this field still takes a running client's.
    failed: Annotated[str, Meta(max_length=1000)] | None = None


class RecoveryClient(Struct, frozen=True):
    """A recovery client's newest report and how far it is behind."""

    client: str
    watermark: int | None
    range_receipts: int
    pending: int
    interval_ms: int
    # Change checkpoint ids above the watermark up to the newest: what a restart of
    # this client walks back over (0 when the server keeps no checkpoints).
    behind: int
    reported_ms: int
    age_ms: int
    stale: bool
    failed: str | None = None  # why its service stopped, as it reported (None: running)


class RecoveryClientList(Struct, frozen=True):
    """``GET /v0/recovery/clients``; ``newest_checkpoint`` is the newest change
    checkpoint id (None: none written, or none kept)."""

    clients: list[RecoveryClient]
    newest_checkpoint: int | None
