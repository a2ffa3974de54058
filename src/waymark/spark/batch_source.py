"""The topic source in a batch query: ``spark.read.format("waymark")``, like the
Kafka source's batch queries (docs/spark.md, "Batch queries").

The query reads each topic from ``startingOffsets`` (default ``earliest``) to
``endingOffsets`` (default ``latest``), both resolved once, on the driver, when Spark
creates the reader: the rows are those committed by then, and a rerun reads the
topics as they are at its own start. Gaps follow ``failOnDataLoss`` as in a stream:
a gap at a range's start is reported once by the driver, a hole inside a range by
the task that meets it (:func:`waymark.spark.source.read_range`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..client import TopicState
from .connection import connect
from .offsets import EARLIEST, LATEST, FromSeq, Position, TopicOffset, parse_positions
from .options import (
    BATCH_SOURCE,
    ENDING,
    MAX_PER_PARTITION,
    MIN_PARTITIONS,
    STARTING,
    positive,
    resolve,
)
from .partitions import Recreated, SeqRange, split
from .source import (
    DEFAULT_MAX_PER_PARTITION,
    front_gap,
    heads,
    read_range,
    read_settings,
    report_gap,
    share,
    start_cursor,
)
from .subscription import parse_subscription


class WaymarkBatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        options = resolve(options, BATCH_SOURCE)  # as documented, aliases folded in
        self.settings = read_settings(options)
        subscription = parse_subscription(options, self.settings.gaps_topic)
        starting = parse_positions(STARTING, options.get(STARTING), EARLIEST, subscription.accepts)
        ending = parse_positions(ENDING, options.get(ENDING), LATEST, subscription.accepts)
        # As Kafka's batch queries: a batch starting at latest or ending at earliest
        # would read nothing, so it is a mistake, not a query.
        if LATEST in (starting.default, *starting.given.values()):
            raise ValueError("startingOffsets 'latest' (-1) is not valid for a batch query")
        if EARLIEST in (ending.default, *ending.given.values()):
            raise ValueError("endingOffsets 'earliest' (-2) is not valid for a batch query")
        min_partitions = positive(options, MIN_PARTITIONS, os.cpu_count() or 1) or 1
        max_per_partition = (
            positive(options, MAX_PER_PARTITION, DEFAULT_MAX_PER_PARTITION)
            or DEFAULT_MAX_PER_PARTITION
        )
        settings = self.settings
        ranges: list[tuple[str, int, int, int, Recreated | None]] = []
        with connect(
            settings.url, settings.token, settings.ca_file, settings.server_budget_s
        ) as http:
            known = [*starting.given, *ending.given]
            for topic, state in heads(http, subscription, known).items():
                at = start_cursor(starting.of(topic), state)
                if state is None:
                    if at.epoch != 0:  # the instance the start names is gone, no other yet
                        report_gap(http, settings, topic, at.epoch, at.seq + 1, None,
                                   "recreated", 0)  # fmt: skip
                    continue  # nothing to read: the topic does not exist
                if at.epoch not in (0, state.epoch):
                    report_gap(http, settings, topic, at.epoch, at.seq + 1, None, "recreated", 0)
                    at = TopicOffset(state.epoch, 0)  # skip: the instance there now
                hi = _end_cursor(topic, ending.of(topic), state)
                lo = at.seq
                gone = front_gap(http, settings, topic, TopicOffset(state.epoch, lo), state)
                if gone is not None and lo < hi:
                    upto = min(gone.gap_to, hi)
                    report_gap(http, settings, topic, state.epoch, gone.gap_from, upto,
                               gone.reason, share(gone, upto))  # fmt: skip
                    lo = upto
                ranges.append((topic, state.epoch, lo, max(lo, hi), None))
        self.ranges = split(settings, ranges, min_partitions=min_partitions,
                            max_per_partition=max_per_partition)  # fmt: skip

    def partitions(self) -> Sequence[InputPartition]:
        return self.ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SeqRange)
        yield from read_range(partition)


def _end_cursor(topic: str, end: Position, state: TopicState) -> int:
    """The last seq a batch query reads of ``topic``: never past the head now."""
    if isinstance(end, FromSeq):
        return min(end.seq - 1, state.head_seq)
    if isinstance(end, TopicOffset):
        if end.epoch != state.epoch:
            raise ValueError(
                f"endingOffsets names instance {end.epoch} of topic {topic!r}, which is now "
                f"instance {state.epoch}"
            )
        return min(end.seq, state.head_seq)
    return state.head_seq
