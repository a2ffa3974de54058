"""Export rounds: lease, export through ``watch_applied``, upload, complete, prune.

``run_export_round`` walks Idle -> Acquiring -> Exporting -> Uploading ->
Completing | Abandoning -> Idle:

* not winning the lease ends the round at once (another node has it);
* a failed export or upload, or ``SupersededByNewer``, abandons the lease
  (a CAS delete, so the next trigger elects a node immediately);
* a failed ``complete`` or prune is logged and not fatal: the artifact is
  published, stale payloads wait for the next round;
* the local artifact is always deleted (it pins files the fold later compacts
  away);
* only the copy stalls the fold (``stage_export`` through an ``ExportRequest``):
  the verifying reopen then runs concurrently with hashing and uploading the
  payload, and the pointer is swapped only after it passed (``publish_staged``);
  a copy that fails it is a failed upload whose payload is an orphan.

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
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from waymark.kv.applied import ExportRequest, submit_export
from waymark.kv.artifact import (
    ArtifactBackend,
    ExportInfo,
    ExportManifest,
    StagedExport,
    stage_export,
)
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
    AlreadyPublished = "already-published"
    """The pointer already names this fold's cursor, or a newer one: no round was run
    (the report's manifest is the pointer's)."""


@dataclass
class RoundReport:
    result: RoundResult
    states: list[RoundState]
    manifest: ExportManifest | None = None
    error: BaseException | None = None
    pruned: list[str] = field(default_factory=list)


ExportFn = Callable[[Path], Awaitable[StagedExport]]
"""Stages a copy of the fold beside the given (not yet existing) directory
(``stage_export``); the round verifies, describes and uploads it."""


def export_via(
    requests: asyncio.Queue[ExportRequest], info: Callable[[], ExportInfo] | None = None
) -> ExportFn:
    """Stage an export through ``watch_applied``'s request queue: after its pending batch
    is flushed, between two applies, at exactly the store's cursor."""

    async def export(dest: Path) -> StagedExport:
        meta = info() if info is not None else None

        def action(store: SnapshotStore, cursor: WatchCursor) -> StagedExport:
            # Only the copy stalls the fold; verify and upload run after it resumed.
            # Every fold store class is also its own artifact backend
            # The append log's stage is a hard link to its live log (no copy).
            return stage_export(cast(ArtifactBackend, store), dest, meta, link=True)

        return await submit_export(requests, ExportRequest(action))

    return export


def verify_gate(verifying: Future[None]) -> None:
    """Wait for the verifying reopen; raises its SnapshotError. Nothing is published
    before it returns (docs/semantics/kv.md §9.2, §10.3)."""
    wait([verifying])
    verifying.result()


def publish_staged(
    transport: ObjectStoreTransport, key: str, staged: StagedExport
) -> tuple[ExportManifest, PublishOutcome]:
    """Verify ``staged`` while its payload is hashed and uploaded; swap the pointer only
    once the verification passed.

    The verifying reopen (a replay of the whole copy for the append log) runs
    on a second thread, concurrently with BLAKE3, the tar stream and the
    upload; a later round of a linked append log hashes first (that pass also
    checks the prefix the last round verified) and replays only the records
    appended since, concurrently with the upload. A backend whose reopen holds
    the GIL throughout (``reopen_holds_gil``: RocksDB's) would stall the hashing
    and the tar stream beside it: a round's stage of it reopens in the store's
    worker process (``StagedExport.reopener``), asked before anything else; a
    sealed stage's verification starts once the payload's last byte is handed to
    the store, and runs while the store syncs the file or finishes its parts. A
    copy that fails it raises SnapshotError and the pointer
    is not touched; its payload, if uploaded, is an orphan like that of any
    failed round, pruned later (docs/semantics/kv.md §10.3, §11.4). The staged
    copy is not fsynced: it is never sealed into a local artifact, and is
    deleted after the round.
    """
    pool = ThreadPoolExecutor(1, thread_name_prefix="waymark-export-verify")
    verifying: list[Future[None]] = []

    def start_verify() -> None:
        if not verifying:
            verifying.append(pool.submit(staged.verify))

    try:
        # A later round of a linked log: describe's one pass also checks the prefix the
        # last round verified, and what is left (the records appended since) is
        # verified while the payload goes up; a stage with a digest memo: the
        # verification hashes again what describe took from it. Otherwise the whole
        # verification overlaps describe and the upload, or only the upload's wait.
        describe_first = staged.known is not None or staged.memo is not None
        staged.begin_reopen()  # in another process: beside describe and the upload
        if describe_first:
            raw, manifest = staged.describe()
        if staged.reopener is not None or not staged.backend_class.reopen_holds_gil:
            start_verify()
        try:
            if not describe_first:
                raw, manifest = staged.describe()
            uploaded = transport.upload_files(
                key,
                staged.stage,
                raw,
                manifest,
                prefixes=staged.prefixes.keys(),
                sent=start_verify,
            )
            observed = transport.read_pointer(key)  # if stale by the swap, the CAS says so
        except BaseException:
            # The stage outlives a verify under way; its failure says more.
            if verifying and (refused := verifying[0].exception()) is not None:
                raise refused from None
            raise
        start_verify()  # a store that took the payload without draining the stream
        verify_gate(verifying[0])  # the only wait before the swap
    finally:
        if not verifying:  # the round failed before its verification began
            staged.abandon_reopen()
        pool.shutdown(wait=False)
    return manifest, transport.swap_pointer(uploaded, observed)


async def run_export_round(
    *,
    lease: ExportLease,
    export: ExportFn,
    transport: ObjectStoreTransport,
    key: str,
    workdir: Path,
    on_state: Callable[[RoundState], None] | None = None,
    keep: int = 1,
    fold_at: int | None = None,
) -> RoundReport:
    """One export round; never raises for a failure of the round itself (see the report).

    ``workdir`` holds the transient local artifact: put it on the fold's file
    system (exports hard-link where they can). ``keep``: the prune spares the newest
    ``keep`` restorable artifacts, the one just published included (``--keep N``).
    ``fold_at``: the rank an export would publish now (``ExportManifest.order``:
    generation, then the fold's cursor); when the pointer is already at or above it,
    the round ends ``AlreadyPublished`` before contending for the lease: its artifact
    would duplicate the published one, or be superseded (docs/semantics/kv.md §10.3).
    """
    states: list[RoundState] = []

    def enter(state: RoundState) -> None:
        states.append(state)
        if on_state is not None:
            on_state(state)

    enter(RoundState.Idle)
    if fold_at is not None:
        try:
            pointed = (await asyncio.to_thread(transport.read_pointer, key)).manifest
        except Exception as e:  # the round finds out what is wrong with the store
            log.warning("export round: reading the pointer %s failed: %s", key, e)
        else:
            if pointed is not None and pointed.order >= fold_at:
                enter(RoundState.Idle)
                return RoundReport(RoundResult.AlreadyPublished, states, manifest=pointed)
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
            staged = await export(local / "artifact")
            enter(RoundState.Uploading)
            report.manifest, outcome = await asyncio.to_thread(
                publish_staged, transport, key, staged
            )
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
                pruned = await asyncio.to_thread(transport.prune, key, grace_ms, keep)
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
