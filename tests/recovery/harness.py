"""Test parts for waymark.recovery: a checkpoint source over a real in-process engine
(the SSE delivery is a step the test takes, so its lag is a generated case) and the
store fault injector."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec

from waymark.log import CHANGES_TOPIC, Engine
from waymark.protocol import Checkpoint, CheckpointData, Record, key_topic
from waymark.recovery import CheckpointListener, LocalReceiptStore, ServerView
from waymark.recovery.source import refusal
from waymark.recovery.store import Binding


class _Stored(msgspec.Struct):
    seq: int = msgspec.field(name="$seq")
    data: CheckpointData


_stored = msgspec.json.Decoder(_Stored)


class EngineCheckpoints:
    """The engine's change checkpoints, read as the server reads them; new ones reach
    the listener when the test calls :meth:`deliver`."""

    def __init__(self, engine: Engine, topics: Iterable[str] | None = None) -> None:
        self.engine = engine
        self.topics = frozenset(topics) if topics is not None else None
        self.listener: CheckpointListener | None = None
        self.cursor = 0
        self.older = 0  # the newest checkpoint the last walk left out for age
        self.on_error: Callable[[BaseException], None] | None = None

    def all(self, filtered: bool = True) -> list[Checkpoint]:
        """Every checkpoint, as the client sees it (``filtered``) or as the server
        wrote it."""
        found: list[Checkpoint] = []
        cursor = 0
        while True:
            page = self.engine.diff(CHANGES_TOPIC, cursor, limit=1000, per_record=True,
                                    touch=False)  # fmt: skip
            for run in page.runs:
                stored = _stored.decode(bytes(run)[:-1])
                changes = stored.data.changes
                if filtered and self.topics is not None:
                    changes = [c for c in changes if key_topic(c.key) in self.topics]
                found.append(Checkpoint(stored.seq, stored.data.time_ms, changes,
                                        self.engine.instance))  # fmt: skip
            cursor = page.next_from_seq
            if page.caught_up:
                return found

    def newest_id(self) -> int:
        self.older = 0
        return self.engine.get_topic(CHANGES_TOPIC, touch=False).head_seq

    def view(self) -> ServerView:
        state = self.engine.get_topic(CHANGES_TOPIC, touch=False)
        return ServerView(self.engine.instance, state.evict_floor - 1, self.older)

    def request_checkpoints(self, earliest_ms: int) -> Iterator[Checkpoint]:
        found = list(reversed(self.all()))
        self.older = max((c.id for c in found if c.time_ms < earliest_ms), default=0)
        return iter([c for c in found if c.time_ms >= earliest_ms])

    def committed(self, key: str, version: int, epoch: int) -> str | None:
        topic = key_topic(key)
        if self.engine.kernel.get(topic) is None:
            return refusal(key, version, epoch, None, None)
        state = self.engine.get_topic(topic, touch=False)
        found = None
        if version <= state.head_seq:
            page = self.engine.diff(topic, version - 1, limit=1, touch=False)
            records = msgspec.convert(page.records(), list[Record[Any]])
            found = records[0] if records else None
        return refusal(key, version, epoch, state, found)

    def register_checkpoint_listener(
        self,
        listener: CheckpointListener,
        after: int,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.listener, self.cursor, self.on_error = listener, after, on_error

    def deliver(self) -> int:
        """Hand the listener every checkpoint after its cursor; how many. A cursor the
        server's watch refuses (past its newest checkpoint: another instance; behind its
        window: expired ones unsent) ends the following, as the SSE stream does."""
        if self.listener is None:
            return 0
        state = self.engine.get_topic(CHANGES_TOPIC, touch=False)
        if self.cursor > state.head_seq or self.cursor < state.evict_floor - 1:
            self.listener = None
            if self.on_error is not None:
                self.on_error(RuntimeError(f"the watch refuses cursor {self.cursor}"))
            return 0
        fresh = [c for c in self.all() if c.id > self.cursor]
        for checkpoint in fresh:
            self.cursor = checkpoint.id
            self.listener(checkpoint)
        return len(fresh)

    def close(self) -> None:
        self.listener = None


class StoreWriteFailure(OSError):
    pass


class FaultInjectingStore:
    """A fault injector: a real :class:`LocalReceiptStore` whose writes fail while
    ``failing`` (a full or broken disk), without writing anything."""

    def __init__(self, store: LocalReceiptStore) -> None:
        self.store = store
        self.failing = False

    def _check(self) -> None:
        if self.failing:
            raise StoreWriteFailure("injected: the receipt store refuses writes")

    def low_watermark(self, client: str) -> int | None:
        return self.store.low_watermark(client)

    def store_low_watermark(self, client: str, checkpoint: int) -> None:
        self._check()
        self.store.store_low_watermark(client, checkpoint)

    def store_range_receipt(self, client: str, begin: int, end: int) -> None:
        self._check()
        self.store.store_range_receipt(client, begin, end)

    def range_receipts(self, client: str, after: int) -> Iterator[tuple[int, int]]:
        return self.store.range_receipts(client, after)

    def purge_range_receipts(self, client: str, begins: Iterable[int]) -> None:
        self._check()
        self.store.purge_range_receipts(client, begins)

    def purge_before(self, client: str, checkpoint: int) -> None:
        self._check()
        self.store.purge_before(client, checkpoint)

    def binding(self, client: str) -> Binding | None:
        return self.store.binding(client)

    def store_binding(self, client: str, binding: Binding) -> None:
        self._check()
        self.store.store_binding(client, binding)

    def close(self) -> None:
        self.store.close()
