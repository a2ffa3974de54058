"""Export rounds: lease, export through ``watch_applied``, upload, complete, prune.

``run_export_round`` walks Idle -> Acquiring -> Exporting -> Uploading ->
Completing | Abandoning -> Idle:

* not winning the lease ends the round at once (another node has it);
* a failed export or upload, or ``SupersededByNewer``, abandons the lease
  (a CAS delete, so the next trigger elects a node immediately);
* a failed ``complete`` or prune is logged and not fatal: the artifact is
  published, stale payloads wait for the next round;
* the local artifact is always deleted (it pins files the fold later compacts
  away).

A crash anywhere is covered by the layout: until the pointer swap the old
pointer stays valid and whole, a lease left behind expires, and an orphaned
payload is pruned by a later round. The rules: docs/semantics/kv.md §10.3.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from waymark.kv.applied import ExportRequest
from waymark.kv.artifact import ExportInfo, ExportManifest
from waymark.kv.lease import ExportLease
from waymark.kv.stores.protocol import SnapshotStore
from waymark.kv.transport import ObjectStoreTransport, PublishOutcome
from waymark.kv.types import WatchCursor

log = logging.getLogger("waymark.kv")

PRUNE_GRACE_TTLS = 4
"""Prune grace in lease TTLs: one for a concurrent publisher still holding an older
payload, three more for bootstrap readers still downloading one
(docs/semantics/kv.md §11.4)."""


class RoundState(enum.Enum):
    Idle = "idle"
    Acquiring = "acquiring"
    Exporting = "exporting"
    Uploading = "uploading"
    Completing = "completing"
    Abandoning = "abandoning"


class RoundResult(enum.Enum):
    NotYours = "not-yours"
    """Another node holds the lease."""
    Published = "published"
    SupersededByNewer = "superseded-by-newer"
    Failed = "failed"
    """The lease could not be read, or the export or upload failed (lease abandoned)."""


@dataclass
class RoundReport:
    result: RoundResult
    states: list[RoundState]
    manifest: ExportManifest | None = None
    error: BaseException | None = None
    pruned: list[str] = field(default_factory=list)


ExportFn = Callable[[Path], Awaitable[ExportManifest]]
"""Writes an artifact of the fold at the given (not yet existing) directory."""


def export_via(
    requests: asyncio.Queue[ExportRequest], info: Callable[[], ExportInfo] | None = None
) -> ExportFn:
    """Export through ``watch_applied``'s request queue: after its pending batch is
    flushed, between two applies, at exactly the store's cursor."""

    async def export(dest: Path) -> ExportManifest:
        meta = info() if info is not None else None

        def action(store: SnapshotStore, cursor: WatchCursor) -> ExportManifest:
            return store.export_to(dest, meta)

        request = ExportRequest(action)
        await requests.put(request)
        return await request.reply

    return export


async def run_export_round(
    *,
    lease: ExportLease,
    export: ExportFn,
    transport: ObjectStoreTransport,
    key: str,
    workdir: Path,
    on_state: Callable[[RoundState], None] | None = None,
) -> RoundReport:
    """One export round; never raises for a failure of the round itself (see the report).

    ``workdir`` holds the transient local artifact: put it on the fold's file
    system (exports hard-link where they can).
    """
    states: list[RoundState] = []

    def enter(state: RoundState) -> None:
        states.append(state)
        if on_state is not None:
            on_state(state)

    enter(RoundState.Idle)
    enter(RoundState.Acquiring)
    try:
        guard = await lease.try_acquire()
    except Exception as e:
        log.warning("export round: the lease %s could not be contended for: %s", lease.key, e)
        enter(RoundState.Idle)
        return RoundReport(RoundResult.Failed, states, error=e)
    if guard is None:
        enter(RoundState.Idle)
        return RoundReport(RoundResult.NotYours, states)

    report = RoundReport(RoundResult.Failed, states)
    workdir.mkdir(parents=True, exist_ok=True)
    local = Path(tempfile.mkdtemp(prefix=".export-", dir=workdir))
    try:
        enter(RoundState.Exporting)
        outcome: PublishOutcome | None = None
        try:
            report.manifest = await export(local / "artifact")
            enter(RoundState.Uploading)
            _, outcome = await asyncio.to_thread(transport.upload, key, local / "artifact")
        except Exception as e:
            log.warning("export round failed in %s: %s", states[-1].value, e)
            report.error = e
        if outcome is PublishOutcome.Published:
            enter(RoundState.Completing)
            report.result = RoundResult.Published
            assert report.manifest is not None
            try:
                await guard.complete(report.manifest.cursor)
            except Exception as e:
                log.warning("export round: completing the lease failed (not fatal): %s", e)
            grace_ms = int(PRUNE_GRACE_TTLS * lease.ttl_s * 1000)
            try:
                pruned = await asyncio.to_thread(transport.prune, key, grace_ms)
                report.pruned = pruned.deleted
            except Exception as e:
                log.warning("export round: pruning failed (not fatal, retried next round): %s", e)
        else:
            enter(RoundState.Abandoning)
            if outcome is PublishOutcome.SupersededByNewer:
                report.result = RoundResult.SupersededByNewer
            try:
                await guard.abandon()
            except Exception as e:
                log.warning("export round: abandoning the lease failed (it expires): %s", e)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    enter(RoundState.Idle)
    return report
