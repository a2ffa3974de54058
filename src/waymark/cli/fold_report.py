"""``waymark fold --report-to URL``: a fold node tells a waymark server how it is doing
(docs/reports.md), every few seconds and after each export it publishes.

A report is the node's cursor, then the bucket's last seq (read in that order, so the
cursor never passes it), and with ``--export-to`` the artifact the pointer names now
(whichever node exported it) and whether this node holds the export lease or stands by;
a node that bootstraps reports its progress while it does, then the artifact it
started from. A report the server does not take is logged and the
next one tried: reporting never stops the fold. When the node ends, its last report
says so: stopped or failed (with the error), how long it ran, what it folded and
published (docs/reports.md, "A fold's final report").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from waymark.client import ApiError, AsyncClient, TransportError
from waymark.protocol import FoldExport, FoldReport, FoldRestore, FoldStopped
from waymark.protocol.reports import ExportRole, FoldOutcome, RestorePhase

if TYPE_CHECKING:
    from waymark.kv import KvStore, ObjectStoreTransport, WatchCursor

log = logging.getLogger("waymark.fold")


class FoldReporter:
    def __init__(
        self,
        client: AsyncClient,
        *,
        fold: str,
        node: str,
        bucket: str,
        backend: str,
        every_s: float,
        pointer: ObjectStoreTransport | None = None,
    ) -> None:
        self.client, self.fold, self.node = client, fold, node
        self.bucket, self.backend, self.every_s = bucket, backend, every_s
        self.pointer = pointer  # where the fleet's exports are published, if anywhere
        self.cursor = 0  # the newest applied cursor (on_applied keeps it current)
        self.role: ExportRole | None = None
        self.lease_holder: str | None = None
        self.restore: FoldRestore | None = None
        self.bucket_seq = 0  # the bucket's last seq, as the newest report read it
        self.exports = 0  # artifacts this node published
        self.export: FoldExport | None = None  # the pointer's artifact, as last read
        self.started = time.monotonic()
        self._now = asyncio.Event()

    def applied(self, cursor: WatchCursor) -> None:
        self.cursor = cursor.as_u64()

    def exported(self) -> None:
        """Report at once: an export was just published."""
        self.exports += 1
        self._now.set()

    def export_role(self, role: ExportRole, holder: str | None) -> None:
        """This node now holds the export lease (``exporter``) or stands by for ``holder``;
        reported at once."""
        self.role, self.lease_holder = role, holder
        self._now.set()

    def restoring(
        self, artifact: str, cursor: int, phase: RestorePhase, done: int, total: int
    ) -> None:
        """A bootstrap's progress; thread-safe (it runs in the bootstrap's thread: a plain
        attribute swap, read by the next report). The end (``done``) is reported at once
        by the caller through ``restored``."""
        self.restore = FoldRestore(artifact, cursor, phase, done, total)

    def restored(self) -> None:
        self._now.set()

    async def report(self, kv: KvStore) -> FoldReport:
        """Build one report and send it; returns it (raises when the server refuses)."""
        cursor = self.cursor  # first the cursor, then the bucket: never past it
        _, last = await kv.stream_bounds()
        self.bucket_seq = max(self.bucket_seq, last)
        export = None
        if self.pointer is not None:
            pointed = await asyncio.to_thread(self.pointer.pointed, self.fold)
            if pointed is not None:
                manifest, payload = pointed
                export = FoldExport(manifest.rank, manifest.exported_at_ms, payload)
        self.export = export
        report = FoldReport(self.fold, self.node, self.backend, self.bucket, cursor, last,
                            max(int(self.every_s * 1000), 100), export, self.role,
                            self.lease_holder, self.restore)  # fmt: skip
        await self.client.report_fold(report)
        return report

    async def final(self, outcome: FoldOutcome, applied: int, message: str | None = None) -> None:
        """The node's last report (best effort, within 2 s): it ended, and why. The
        bucket's seq is the newest one read (the connection may be gone by now)."""
        stopped = FoldStopped(outcome, int(time.time() * 1000),
                              int((time.monotonic() - self.started) * 1000), applied,
                              self.exports, message[:1000] if message else None)  # fmt: skip
        cursor = self.cursor
        report = FoldReport(self.fold, self.node, self.backend, self.bucket, cursor,
                            max(self.bucket_seq, cursor), max(int(self.every_s * 1000), 100),
                            self.export, self.role, self.lease_holder, self.restore,
                            stopped)  # fmt: skip
        try:
            async with asyncio.timeout(2.0):
                await self.client.report_fold(report)
        except (ApiError, TransportError, TimeoutError) as exc:
            log.warning("the fold's final report was not taken: %s", exc)

    async def run(self, kv: KvStore) -> None:
        """Report every ``every_s`` seconds, and after each export, until cancelled."""
        while True:
            try:
                await self.report(kv)
            except (ApiError, TransportError) as exc:
                log.warning("fold report to the server failed (the next one is tried): %s", exc)
            except Exception as exc:  # the bucket's info or the pointer could not be read
                log.warning("fold report not made (the next one is tried): %s", exc)
            self._now.clear()
            # Not asyncio.wait_for: on 3.11 it swallows a cancel that comes as the event is
            # set (an export or a bootstrap just ended), and this loop then never ends.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.every_s):
                    await self._now.wait()
