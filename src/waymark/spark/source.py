"""The topic source: ``spark.readStream.format("waymark")``.

Options (named like Spark's Kafka source where the meaning is the same):

``url``                   the waymark server, e.g. ``http://127.0.0.1:8080`` (required)
``topics``                comma-separated topic names (required)
``startingOffsets``       ``earliest`` (default) | ``latest`` | JSON per topic (:mod:`.offsets`)
``maxRecordsPerTrigger``  admission control: at most this many records per micro-batch
``minPartitions``         read each batch in at least this many tasks (default: driver cores)
``maxRecordsPerPartition`` no task reads more seqs than this (default 200000)
``node``                  reader node id: records written by this node are skipped
                          (docs/semantics/topics.md §6)
``onDataLoss``            ``fail`` (default) | ``skip``: what a gap (tombstone) does
``gapsTopic``             where ``skip`` records each gap as a row (default ``waymark.gaps``)

Progress lives only in Spark's checkpoint (``offsets/N``): the log is not
consumed destructively, so ``commit(end)`` — which arrives a batch late and not
at all after a crash — has nothing to do.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from . import wire
from .offsets import (
    EARLIEST,
    LATEST,
    Offsets,
    TopicOffset,
    admit,
    from_json,
    parse_starting,
    parse_topics,
    to_json,
)
from .partitions import ReadSettings, Recreated, SeqRange, split
from .schema import ARROW_SCHEMA

log = logging.getLogger("waymark.spark.source")

DEFAULT_GAPS_TOPIC = "waymark.gaps"
DEFAULT_MAX_PER_PARTITION = 200_000
PAGE = 10_000  # the server's largest diff page


class WaymarkDataLoss(RuntimeError):
    """Records below a batch's end were lost (cap, TTL, or a recreated topic)."""

    def __init__(
        self, topic: str, gap_from: int, gap_to: int | None, reason: str, hint: str
    ) -> None:
        # A recreate loses everything after the cursor of the old instance: no known end.
        upto = "its end" if gap_to is None else str(gap_to)
        super().__init__(
            f"waymark topic {topic!r} lost records [{gap_from}, {upto}] (reason: {reason}); {hint}"
        )
        self.topic = topic
        self.gap_from = gap_from
        self.gap_to = gap_to
        self.reason = reason


_SKIP_HINT = "set onDataLoss=skip to continue past gaps, each recorded in the gaps topic"


def _option_int(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = options.get(name)
    if value is None:
        return default
    number = int(value)
    if number < 1:
        raise ValueError(f"option {name!r} is a positive integer: {value!r}")
    return number


class WaymarkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        url = options.get("url")
        if not url:
            raise ValueError("the waymark source needs option 'url' (the server's base URL)")
        on_data_loss = options.get("onDataLoss", "fail").lower()
        if on_data_loss not in ("fail", "skip"):
            raise ValueError(f"onDataLoss is fail or skip, not {on_data_loss!r}")
        self.topics = parse_topics(options.get("topics"))
        self.starting = parse_starting(options.get("startingOffsets"), self.topics)
        self.max_rows = _option_int(options, "maxRecordsPerTrigger", None)
        self.min_partitions = _option_int(options, "minPartitions", os.cpu_count() or 1) or 1
        self.max_per_partition = (
            _option_int(options, "maxRecordsPerPartition", DEFAULT_MAX_PER_PARTITION)
            or DEFAULT_MAX_PER_PARTITION
        )
        self.settings = ReadSettings(
            url=url.rstrip("/"),
            node=options.get("node"),
            on_data_loss=on_data_loss,
            gaps_topic=options.get("gapsTopic", DEFAULT_GAPS_TOPIC),
            page=PAGE,
        )
        self._target: Offsets | None = None  # availableNow: never read past this
        self._http: httpx.Client | None = None

    def __getstate__(self) -> dict[str, Any]:
        # read() runs on a pickled copy in a Python worker: ship no connection.
        return {**self.__dict__, "_http": None}

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            self._http = wire.client(self.settings.url)
        return self._http

    # --- driver side ----------------------------------------------------------------
    def _heads(self) -> dict[str, dict[str, Any] | None]:
        return {topic: wire.topic_state(self.http, topic) for topic in self.topics}

    def initialOffset(self) -> dict:
        offsets: Offsets = {}
        for topic, state in self._heads().items():
            start = self.starting[topic]
            if isinstance(start, TopicOffset):
                offsets[topic] = start
            elif state is None:
                offsets[topic] = TopicOffset(0, 0)  # read it from its first record once it exists
            elif start == EARLIEST:
                # What is already gone when the query starts is not a gap of this query.
                offsets[topic] = TopicOffset(state["epoch"], state["earliest_seq"] - 1)
            else:
                assert start == LATEST
                offsets[topic] = TopicOffset(state["epoch"], state["head_seq"])
        return to_json(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_rows is None else ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {
            topic: TopicOffset(state["epoch"], state["head_seq"])
            for topic, state in self._heads().items()
            if state is not None
        }

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        base: Offsets = {}
        backlog: dict[str, int] = {}
        for topic, state in self._heads().items():
            at = begin.get(topic, TopicOffset(0, 0))
            if state is None:  # deleted (or not created yet): wait for an instance to read
                base[topic], backlog[topic] = at, 0
                continue
            epoch, head = state["epoch"], state["head_seq"]
            if at.epoch not in (0, epoch):
                if self.settings.on_data_loss == "fail":
                    raise WaymarkDataLoss(
                        topic, at.seq + 1, None, "recreated",
                        f"the checkpoint names instance {at.epoch}, the topic is now instance "
                        f"{epoch}; {_SKIP_HINT}",
                    )  # fmt: skip
                at = TopicOffset(epoch, 0)  # skip: the new instance, from its start
            elif at.epoch == 0:
                at = TopicOffset(epoch, 0)
            if self._target is not None:
                target = self._target.get(topic)
                head = min(head, target.seq) if target and target.epoch == epoch else at.seq
            base[topic], backlog[topic] = at, max(0, head - at.seq)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        grant = admit(backlog, max_rows)
        return to_json({t: TopicOffset(o.epoch, o.seq + grant[t]) for t, o in base.items()})

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, finish = from_json(start), from_json(end)
        ranges = []
        for topic, last in finish.items():
            first = begin.get(topic, TopicOffset(0, 0))
            recreated = None
            lo = first.seq
            if first.epoch != last.epoch:
                lo = 0
                if first.epoch != 0:
                    recreated = Recreated(first.epoch, first.seq)
            ranges.append((topic, last.epoch, lo, last.seq, recreated))
        return split(
            self.settings,
            ranges,
            min_partitions=self.min_partitions,
            max_per_partition=self.max_per_partition,
        )

    def commit(self, end: dict) -> None:
        """Nothing to release: progress is the checkpoint's offsets, not server state."""

    def stop(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    # --- executor side ----------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SeqRange)
        yield from read_range(partition)


def read_range(part: SeqRange) -> Iterator[pa.RecordBatch]:
    """Page through ``diff`` over ``(lo, hi]`` and yield the records as Arrow batches."""
    settings = part.settings
    with wire.client(settings.url) as http:
        if part.recreated is not None:
            # Only reached under skip: fail stopped the query when planning the batch.
            _gap(http, part, part.recreated.seq + 1, None, "recreated", 0)
        cursor = part.lo
        while cursor < part.hi:
            page = wire.diff(
                http, part.topic, cursor, min(settings.page, part.hi - cursor),
                part.epoch, settings.node,
            )  # fmt: skip
            gone = page.tombstone
            if gone is not None:
                if gone.reason == "recreated":
                    # The instance this range belongs to is gone; the next batch's
                    # planning sees the new epoch and follows onDataLoss there.
                    _gap(http, part, cursor + 1, part.hi, "recreated", part.hi - cursor)
                    return
                _gap(http, part, gone.gap_from, min(gone.gap_to, part.hi), gone.reason,
                     gone.missed_estimate)  # fmt: skip
            rows = page.records
            if rows and rows[-1].seq > part.hi:
                rows = [r for r in rows if r.seq <= part.hi]
            if rows:
                yield to_arrow(part.topic, rows)
            if page.next_from_seq <= cursor:
                break  # nothing more below hi exists (the range was planned from head_seq)
            cursor = page.next_from_seq


def _gap(
    http: httpx.Client,
    part: SeqRange,
    gap_from: int,
    gap_to: int | None,
    reason: str,
    missed: int,
) -> None:
    settings = part.settings
    if settings.on_data_loss == "fail":
        raise WaymarkDataLoss(part.topic, gap_from, gap_to, reason, _SKIP_HINT)
    log.warning(
        "waymark topic %r lost records [%s, %s] (reason: %s); skipping, recorded in %r",
        part.topic, gap_from, gap_to, reason, settings.gaps_topic,
    )  # fmt: skip
    gap = {
        "topic": part.topic,
        "epoch": part.recreated.epoch if reason == "recreated" and part.recreated else part.epoch,
        "gap_from": gap_from,
        "gap_to": gap_to,
        "reason": reason,
        "missed_estimate": missed,
    }
    # The id makes a retried task's report idempotent (the topic's dedupe window).
    record_id = f"{part.topic}:{gap['epoch']}:{gap_from}-{gap_to}:{reason}"
    wire.append(http, settings.gaps_topic, [{"data": gap, "tag": part.topic, "id": record_id}])


_TS_US = pa.timestamp("us", tz="UTC")
_META = pa.map_(pa.string(), pa.string())


def to_arrow(topic: str, rows: list[wire.Row]) -> pa.RecordBatch:
    """One diff page as an Arrow batch, built column-wise.

    ``data`` is assembled from the raw JSON slices as one buffer plus offsets (no
    per-row ``str``), and node/tag/meta columns that are null throughout — the
    common case — cost nothing per row.
    """
    n = len(rows)
    datas = [r.data for r in rows]
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.fromiter(map(len, datas), np.int32, n), out=offsets[1:])
    data = pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(datas))]
    )
    seqs = np.array([r.seq for r in rows], np.int64)
    micros = np.array([r.ts for r in rows], np.int64) * 1000
    nodes = [r.node for r in rows]
    tags = [r.tag for r in rows]
    metas = [r.meta for r in rows]
    return pa.RecordBatch.from_arrays(
        [
            # From numpy buffers, not pa.array() / pa.scalar(): their first call imports
            # pandas (~1 s per process here).
            _repeat(topic, n),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(seqs)]),
            pa.Array.from_buffers(_TS_US, n, [None, pa.py_buffer(micros)]),
            _strings(nodes, n),
            _strings(tags, n),
            pa.nulls(n, _META)
            if metas.count(None) == n
            else pa.array([None if m is None else list(m.items()) for m in metas], _META),
            data,
        ],
        schema=ARROW_SCHEMA,
    )


def _repeat(text: str, n: int) -> pa.Array:
    raw = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)]
    )


def _strings(values: list[str | None], n: int) -> pa.Array:
    return pa.nulls(n, pa.string()) if values.count(None) == n else pa.array(values, pa.string())
