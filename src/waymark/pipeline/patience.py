"""Waiting out an object-store outage (docs/semantics/pipeline.md §10): every call
the runner makes to the rendezvous store is retried with capped exponential backoff
and jitter, on an injected clock, for up to a budget; meanwhile the store says since
when it is being waited for, which the status shows."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from waymark.clock import Backoff, Clock, SystemClock
from waymark.objstore import (
    OVERWRITE,
    PART_SIZE,
    UPLOAD_CONCURRENCY,
    Capabilities,
    GetResult,
    ObjectMeta,
    ObjectStore,
    ObjectStoreError,
    ObjectStream,
    ObjectVersion,
    PutMode,
)

T = TypeVar("T")

STORE_BUDGET_S = 60.0  # how long one call waits out an outage before it fails


def transient(error: Exception) -> bool:
    """An outage, not an answer: the base class only (not found, exists, precondition
    failed, unsupported and invalid keys are answers the caller acts on)."""
    return type(error) is ObjectStoreError


class PatientStore:
    """An :class:`ObjectStore` whose calls wait out outages of the one it wraps.

    A conditional write retried after an outage may find its own first attempt
    landed (the answer was lost): it then fails as ``ObjectExists`` or
    ``PreconditionFailed``, which the handoff and stage-state writers already read
    back and resolve (docs/semantics/pipeline.md §10).
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        budget_s: float = STORE_BUDGET_S,
        clock: Clock | None = None,
        sleep: Callable[[float], object] = time.sleep,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        """``sleep`` waits between attempts; once ``cancel`` is set a call fails at its
        next failure instead of waiting."""
        self.inner = store
        self.url = store.url
        self.capabilities: Capabilities = store.capabilities
        self.budget_s = budget_s
        self.clock = clock or SystemClock()
        self.sleep = sleep
        self.backoff = backoff or Backoff(0.05, 2.0)
        self.rng = rng or random.Random()
        self.cancel = cancel
        self._lock = threading.Lock()
        self._waiting: dict[int, int] = {}  # calls waiting now: thread id -> since (ms)
        self.last_error: str = ""

    def waiting_since_ms(self) -> int | None:
        """Since when the oldest call now waiting has waited, or None."""
        with self._lock:
            return min(self._waiting.values(), default=None)

    def _call(self, call: Callable[[], T]) -> T:
        started: int | None = None
        attempt = 0
        me = threading.get_ident()
        try:
            while True:
                try:
                    return call()
                except ObjectStoreError as error:
                    if not transient(error):
                        raise
                    now = self.clock.now_ms()
                    if started is None:
                        started = now
                        with self._lock:
                            self._waiting[me] = now
                    self.last_error = str(error)
                    cancelled = self.cancel is not None and self.cancel.is_set()
                    if cancelled or now - started >= self.budget_s * 1000:
                        raise
                    attempt += 1
                    self.sleep(self.backoff.delay(attempt, self.rng))
        finally:
            if started is not None:
                with self._lock:
                    self._waiting.pop(me, None)

    def get(self, key: str) -> GetResult:
        return self._call(lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._call(lambda: self.inner.get_range(key, start, end))

    def head(self, key: str) -> ObjectMeta:
        return self._call(lambda: self.inner.head(key))

    def put(self, key: str, data: bytes, *, mode: PutMode = OVERWRITE) -> ObjectVersion:
        return self._call(lambda: self.inner.put(key, data, mode=mode))

    def upload(
        self,
        key: str,
        chunks: Iterable[bytes],
        *,
        part_size: int = PART_SIZE,
        concurrency: int = UPLOAD_CONCURRENCY,
    ) -> ObjectVersion:
        # a stream cannot be replayed: one attempt (the pipeline never uploads)
        return self.inner.upload(key, chunks, part_size=part_size, concurrency=concurrency)

    def stream(self, key: str, *, chunk_size: int = PART_SIZE) -> ObjectStream:
        return self._call(lambda: self.inner.stream(key, chunk_size=chunk_size))

    def delete(self, key: str, *, if_match: ObjectVersion | None = None) -> None:
        self._call(lambda: self.inner.delete(key, if_match=if_match))

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        return iter(self._call(lambda: list(self.inner.list(prefix))))

    def clean_abandoned_temp(self, min_age_s: float | None = None) -> Sequence[tuple[str, int]]:
        return self._call(lambda: self.inner.clean_abandoned_temp(min_age_s))
