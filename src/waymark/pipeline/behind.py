"""Write-behind: where a stage's writes of one batch (its edge appends or sink write)
and its checkpoint saves run, so that the next batch's read and function can overlap
them (docs/pipeline.md, "Write-behind"; docs/semantics/pipeline.md §4.5).

A stage submits at most one task per step and waits for the previous one
(:meth:`WriteBehind.join`) before it submits the next or trusts what it did; the
task's error is raised there, in the stage's own thread. A task hands its checkpoint
save to :meth:`WriteBehind.checkpoint` once the writes the save covers have landed:
saves are group-committed, the newest one waiting replacing any older one not yet
started (docs/semantics/pipeline.md §4.6).
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

    def checkpoint(self, save: Task) -> None:
        """Run ``save`` after every save handed over before it, or instead of those of
        them not yet started (called by a task, once what ``save`` covers landed)."""

    def join(self) -> None:
        """Wait for the task submitted last; raise its error, or a save's."""

    def flush(self) -> None:
        """:meth:`join`, and wait for the saves handed over so far; raise their error."""

    def close(self) -> None:
        """Wait for the task submitted last, ignoring its error; submit no more."""


class Inline:
    """Each task and save runs at once, in the stage's thread: no overlap (the default
    of a :class:`~waymark.pipeline.stage.Stage` built by hand)."""

    def submit(self, task: Task) -> None:
        task()

    def checkpoint(self, save: Task) -> None:
        save()

    def join(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class GroupCommit:
    """A thread that runs the newest save handed over, one at a time: while one runs,
    later ones wait, and only the last of them runs next. A save's error is kept
    until :meth:`check` raises it; ``landed`` is called after each save that did not
    raise (the runner wakes the stages waiting for acknowledgements)."""

    def __init__(self, name: str, landed: Callable[[], None] | None = None) -> None:
        self._landed = landed
        self._lock = threading.Condition()
        self._next: Task | None = None
        self._running = False
        self._error: BaseException | None = None
        self._closed = False
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def hand(self, save: Task) -> None:
        with self._lock:
            self._next = save  # an older one not yet started is covered by this one
            self._lock.notify_all()

    def check(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def flush(self) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self._next is None and not self._running)
        self.check()

    def close(self) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self._next is None and not self._running)
            self._closed = True
            self._lock.notify_all()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._next is not None or self._closed)
                if self._next is None:
                    return
                save, self._next = self._next, None
                self._running = True
            error: BaseException | None = None
            try:
                save()
                if self._landed is not None:
                    self._landed()
            except BaseException as failed:  # raised again by check, in the stage's thread
                error = failed
            with self._lock:
                self._running = False
                if error is not None:
                    self._error = error
                    self._next = None  # a later save would hide the failure
                self._lock.notify_all()


class Behind:
    """Each task runs on one daemon thread of its own while the stage goes on; its
    saves on another (:class:`GroupCommit`), which calls ``landed`` after each."""

    def __init__(self, name: str, landed: Callable[[], None] | None = None) -> None:
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._outcomes: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._pending = False
        self._saves = GroupCommit(f"{name}-saves", landed)
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, task: Task) -> None:
        self.join()  # one task at a time: a stage never has two batches in the air
        self._pending = True
        self._tasks.put(task)

    def checkpoint(self, save: Task) -> None:
        self._saves.hand(save)

    def join(self) -> None:
        if self._pending:
            self._pending = False
            error = self._outcomes.get()
            if error is not None:
                raise error
        self._saves.check()

    def flush(self) -> None:
        self.join()
        self._saves.flush()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.join()
        self._tasks.put(None)
        self._saves.close()

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            except BaseException as error:  # raised again by join, in the stage's thread
                self._outcomes.put(error)
            else:
                self._outcomes.put(None)
