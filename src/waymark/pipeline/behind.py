"""Write-behind: where a stage's writes of one batch (its edge appends or sink write,
and its checkpoint save) run, so that the next batch's read and function can overlap
them (docs/pipeline.md, "Write-behind"; docs/semantics/pipeline.md §4.5).

A stage submits at most one task per step and waits for the previous one
(:meth:`WriteBehind.join`) before it submits the next or trusts what it did; the
task's error is raised there, in the stage's own thread.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Protocol

Task = Callable[[], None]


class WriteBehind(Protocol):
    def submit(self, task: Task) -> None:
        """Run ``task`` (at the latest by the next :meth:`join`)."""

    def join(self) -> None:
        """Wait for the task submitted last; raise its error."""

    def close(self) -> None:
        """Wait for the task submitted last, ignoring its error; submit no more."""


class Inline:
    """Each task runs at once, in the stage's thread: no overlap (the default of a
    :class:`~waymark.pipeline.stage.Stage` built by hand)."""

    def submit(self, task: Task) -> None:
        task()

    def join(self) -> None:
        pass

    def close(self) -> None:
        pass


class Behind:
    """Each task runs on one daemon thread of its own while the stage goes on."""

    def __init__(self, name: str) -> None:
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._outcomes: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._pending = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, task: Task) -> None:
        self.join()  # one task at a time: a stage never has two batches in the air
        self._pending = True
        self._tasks.put(task)

    def join(self) -> None:
        if not self._pending:
            return
        self._pending = False
        error = self._outcomes.get()
        if error is not None:
            raise error

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.join()
        self._tasks.put(None)

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            except BaseException as error:  # raised again by join, in the stage's thread
                self._outcomes.put(error)
            else:
                self._outcomes.put(None)
