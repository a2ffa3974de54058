"""``TopicReceiptStore``: receipts kept in a waymark topic, so a stateless consumer
recovers on any machine (docs/semantics/recovery.md §4.1).

Each write is one record of an ``fsync`` topic, tagged with the client id, acknowledged
once synced: a watermark, a range, or a purge. Reading folds a client's records in
seq order. A purge below the watermark also deletes that client's older records from
the topic, so it stays about as small as the receipts it holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

import msgspec

from ..client import ApiError, Client
from ..protocol import ConfigPatch, Durability, ErrorCode, RecordIn
from .store import Binding

COMPACT_AFTER = 1000  # a client's records before a snapshot replaces them


class _Entry(msgspec.Struct, tag_field="op", tag=str.lower, omit_defaults=True):
    pass


class Watermark(_Entry):
    checkpoint: int


class Range(_Entry):
    begin: int
    end: int


class Purge(_Entry):
    begins: list[int] = []
    before: int | None = None  # every range ending at or below


class Bind(_Entry):
    binding: Binding


class Snapshot(_Entry):
    """Everything the client's earlier records said: they are deleted after it."""

    watermark: int | None
    ranges: list[tuple[int, int]]
    binding: Binding | None = None


Entry = Watermark | Range | Purge | Bind | Snapshot
_entry = msgspec.json.Decoder(Entry)


class _State:
    def __init__(self) -> None:
        self.watermark: int | None = None
        self.ranges: dict[int, int] = {}  # begin -> end
        self.binding: Binding | None = None
        self.cursor = 0  # the last seq folded in
        self.records = 0  # the client's records since its last snapshot

    def apply(self, entry: Entry) -> None:
        self.records += 1
        match entry:
            case Snapshot(watermark, ranges, binding):
                self.watermark, self.ranges, self.records = watermark, dict(ranges), 1
                self.binding = binding
            case Bind(binding):
                self.binding = binding
            case Watermark(checkpoint):
                self.watermark = checkpoint
            case Range(begin, end):
                self.ranges[begin] = max(end, self.ranges.get(begin, end))
            case Purge(begins, before):
                for begin in begins:
                    self.ranges.pop(begin, None)
                if before is not None:
                    self.ranges = {b: e for b, e in self.ranges.items() if e > before}


class TopicReceiptStore:
    def __init__(
        self, url: str, topic: str, *, client: Client | None = None, read_only: bool = False
    ) -> None:
        """``read_only``: look at an existing store (``waymark recovery missed`` and
        ``status``): the topic is neither created nor reconfigured, a missing one is a
        :class:`FileNotFoundError`."""
        self.topic = topic
        self._client = client or Client(url)
        self._owned = client is None
        if not read_only:
            self._client.put_topic(topic, ConfigPatch(durability=Durability.FSYNC))
        else:
            try:
                self._client.get_topic(topic, touch=False)
            except ApiError as exc:
                if exc.code != ErrorCode.TOPIC_NOT_FOUND:
                    raise
                self.close()
                raise FileNotFoundError(
                    f"no receipt store: topic {topic!r} does not exist"
                ) from exc
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> Client:
        """The client it talks to its server with (thread-safe: shared, e.g. by the
        service's status reports)."""
        return self._client

    def _state(self, client: str) -> _State:
        """``client``'s receipts, with every record written since the last read."""
        state = self._states.setdefault(client, _State())
        while True:
            page = self._client.diff_raw(self.topic, state.cursor, limit=1000)
            for record in page.records:
                if record.tag == client:
                    state.apply(_entry.decode(record.data))
            state.cursor = page.next_from_seq
            if page.caught_up:
                return state

    def _append(self, client: str, entry: Entry) -> int:
        data = msgspec.Raw(msgspec.json.encode(entry))
        return self._client.append(self.topic, [RecordIn(data, tag=client)]).seqs[0]

    def low_watermark(self, client: str) -> int | None:
        with self._lock:
            return self._state(client).watermark

    def store_low_watermark(self, client: str, checkpoint: int) -> None:
        with self._lock:
            self._append(client, Watermark(checkpoint))

    def store_range_receipt(self, client: str, begin: int, end: int) -> None:
        with self._lock:
            self._append(client, Range(begin, end))

    def range_receipts(self, client: str, after: int) -> Iterator[tuple[int, int]]:
        with self._lock:
            ranges = self._state(client).ranges
            found = sorted(((b, e) for b, e in ranges.items() if e > after), reverse=True)
        return iter(found)

    def purge_range_receipts(self, client: str, begins: Iterable[int]) -> None:
        with self._lock:
            self._append(client, Purge(begins=list(begins)))

    def purge_before(self, client: str, checkpoint: int) -> None:
        with self._lock:
            self._append(client, Purge(before=checkpoint))
            state = self._state(client)
            if state.records > COMPACT_AFTER:
                # One record holds it all; the client's records before it go.
                ranges = sorted(state.ranges.items())
                seq = self._append(client, Snapshot(state.watermark, ranges, state.binding))
                self._client.delete(self.topic, before_seq=seq, match=client)

    def binding(self, client: str) -> Binding | None:
        with self._lock:
            return self._state(client).binding

    def store_binding(self, client: str, binding: Binding) -> None:
        with self._lock:
            self._append(client, Bind(binding))

    def close(self) -> None:
        if self._owned:
            self._client.close()
