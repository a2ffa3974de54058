"""A bootstrap's or restore's progress on the terminal (rich) and, with ``--report-to``,
in the node's status reports (docs/kv.md, "Restore progress").

The transport calls it from the thread doing the work with ``(phase, done, total)``:
``download`` (payload bytes fetched), ``verify`` (file bytes hashed), ``open`` (the
engine's reopen, which for the append log replays the log), ``done``.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, cast

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

if TYPE_CHECKING:
    from rich.console import Console

    from waymark.cli.fold_report import FoldReporter
    from waymark.protocol.reports import RestorePhase

_LABELS = {
    "download": "download",
    "verify": "verify (BLAKE3)",
    "open": "open and check the cursor",
}


class RestoreProgress:
    """One bar per phase; also hands each step to ``reporter`` (its next report says it)."""

    def __init__(
        self,
        console: Console,
        artifact: str,
        cursor: int,
        reporter: FoldReporter | None = None,
    ) -> None:
        self.artifact, self.cursor, self.reporter = artifact, cursor, reporter
        self.bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._tasks: dict[str, tuple[TaskID, int]] = {}  # phase: its bar and its total

    def __enter__(self) -> RestoreProgress:
        self.bars.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.bars.stop()

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.reporter is not None:
            self.reporter.restoring(
                self.artifact, self.cursor, cast("RestorePhase", phase), done, total
            )
        if phase not in self._tasks:
            for task, whole in self._tasks.values():  # a phase ends where the next begins
                self.bars.update(task, completed=whole)
            if phase == "done":
                return
            self._tasks[phase] = (self.bars.add_task(_LABELS.get(phase, phase)), total)
        task, _ = self._tasks[phase]
        self._tasks[phase] = (task, total)
        self.bars.update(task, completed=done, total=total)
