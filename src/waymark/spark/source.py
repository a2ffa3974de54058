"""The topic source: ``spark.readStream.format("waymark")``.

Options (named like Spark's Kafka source's, checked strictly by
:mod:`waymark.spark.options`; the table is docs/spark.md, "Options"):

``url``                   the waymark server, e.g. ``http://127.0.0.1:8080`` (required)
``subscribe``             comma-separated topic names (alias ``topics``); or
``subscribePattern``      a regular expression matching whole topic names (:mod:`.subscription`)
``startingOffsets``       ``earliest`` (default) | ``latest`` | JSON per topic (:mod:`.offsets`)
``maxOffsetsPerTrigger``  admission control: at most this many records per micro-batch
                          (alias ``maxRecordsPerTrigger``)
``minOffsetsPerTrigger``  wait for this many records before a micro-batch, at most
``maxTriggerDelay``       this long since the last one (default 15m)
``minPartitions``         read each batch in at least this many tasks (default: driver cores)
``maxRecordsPerPartition`` no task reads more seqs than this (default 1000000)
``node``                  reader node id: records written by this node are skipped
                          (docs/semantics/topics.md §6)
``failOnDataLoss``        ``true`` (default) | ``false``: what a gap (tombstone) does
                          (alias ``onDataLoss`` = ``fail`` | ``skip``)
``gapsTopic``             where ``false`` records each gap as a row (default ``waymark.gaps``)
``token``                 bearer token of a server with tokens (default: $WAYMARK_TOKEN)
``caFile``                CA certificate (PEM) of an https server (docs/security.md)

Progress lives only in Spark's checkpoint (``offsets/N``): the log is not
consumed destructively, so ``commit(end)`` — which arrives a batch late and not
at all after a crash — has nothing to do.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from ..client import ApiError, Client, ErrorCode, RecordIn, Tombstone, TopicState
from ..clock import Clock, SystemClock
from ..protocol import MAX_ARROW_DIFF_LIMIT
from ..protocol.arrow import ArrowPage
from ..protocol.errors import WaymarkError
from .connection import connect, server_budget_s, token_option
from .offsets import (
    EARLIEST,
    LATEST,
    FromSeq,
    Offsets,
    Position,
    TopicOffset,
    admit,
    from_json,
    parse_positions,
    to_json,
)
from .options import (
    CA_FILE,
    FAIL_ON_DATA_LOSS,
    GAPS_TOPIC,
    MAX_PER_PARTITION,
    MAX_PER_TRIGGER,
    MAX_TRIGGER_DELAY,
    MIN_PARTITIONS,
    MIN_PER_TRIGGER,
    NODE,
    STARTING,
    STREAM_SOURCE,
    URL,
    duration_ms,
    flag,
    positive,
    resolve,
)
from .partitions import ReadSettings, Recreated, SeqRange, split
from .schema import ARROW_SCHEMA
from .subscription import SourceSubscription, parse_subscription

log = logging.getLogger("waymark.spark.source")

DEFAULT_GAPS_TOPIC = "waymark.gaps"
# Each task costs a Python worker its own start (docs/spark.md, "Figures"): a batch is
# read in one wave of minPartitions tasks until it is larger than this per task.
DEFAULT_MAX_PER_PARTITION = 1_000_000
PAGE = MAX_ARROW_DIFF_LIMIT  # the server's largest Arrow page


class WaymarkDataLoss(WaymarkError, RuntimeError):
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


_SKIP_HINT = "set failOnDataLoss=false to continue past gaps, each recorded in the gaps topic"
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000  # Kafka's maxTriggerDelay default


def read_settings(options: Mapping[str, str]) -> ReadSettings:
    """What the streaming and the batch source share, from their resolved options."""
    url = options.get(URL)
    if not url:
        raise ValueError("the waymark source needs option 'url' (the server's base URL)")
    fail = flag(options, FAIL_ON_DATA_LOSS, True)
    return ReadSettings(
        url=url.rstrip("/"),
        node=options.get(NODE),
        on_data_loss="fail" if fail else "skip",
        gaps_topic=options.get(GAPS_TOPIC, DEFAULT_GAPS_TOPIC),
        page=PAGE,
        token=token_option(options),  # carried to the tasks (docs/spark.md, cluster)
        ca_file=options.get(CA_FILE),
        server_budget_s=server_budget_s(options),
    )


def heads(
    http: Client, subscription: SourceSubscription, known: Iterable[str]
) -> dict[str, TopicState | None]:
    """The state of every topic the query reads now: the subscribed ones, or those the
    pattern matches, and the ``known`` ones of an offset (None: deleted or not created)."""
    if subscription.topics is not None:
        return {topic: _state(http, topic) for topic in subscription.topics}
    states: dict[str, TopicState | None] = {
        state.name: state for state in http.list_topics() if subscription.accepts(state.name)
    }
    for topic in known:
        states.setdefault(topic, None)
    return states


def start_cursor(position: Position, state: TopicState | None) -> TopicOffset:
    """Where a read that starts at ``position`` resumes, as a cursor (epoch 0: the topic
    does not exist yet; its first instance is read from the cursor's seq on)."""
    if isinstance(position, TopicOffset):
        return position
    if isinstance(position, FromSeq):
        return TopicOffset(0 if state is None else state.epoch, position.seq - 1)
    if state is None:
        return TopicOffset(0, 0)  # read it from its first record once it exists
    if position == EARLIEST:
        # What is already gone when the query starts is not a gap of this query.
        return TopicOffset(state.epoch, state.earliest_seq - 1)
    assert position == LATEST
    return TopicOffset(state.epoch, state.head_seq)


def delay_batch(available: int, min_rows: int, now_ms: int, last_ms: int, delay_ms: int) -> bool:
    """Kafka's ``minOffsetsPerTrigger`` rule: wait for more records unless ``min_rows``
    are available or ``delay_ms`` passed since the last micro-batch."""
    return available < min_rows and now_ms - last_ms < delay_ms


class WaymarkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str], clock: Clock | None = None) -> None:
        options = resolve(options, STREAM_SOURCE)  # as documented, aliases folded in
        self.settings = read_settings(options)
        self.subscription = parse_subscription(options, self.settings.gaps_topic)
        self.starting = parse_positions(
            STARTING, options.get(STARTING), EARLIEST, self.subscription.accepts
        )
        self.max_rows = positive(options, MAX_PER_TRIGGER, None)
        self.min_rows = positive(options, MIN_PER_TRIGGER, None)
        if MAX_TRIGGER_DELAY in options and self.min_rows is None:
            raise ValueError("option 'maxTriggerDelay' goes with option 'minOffsetsPerTrigger'")
        self.max_delay_ms = duration_ms(options, MAX_TRIGGER_DELAY, DEFAULT_MAX_TRIGGER_DELAY_MS)
        if self.min_rows and self.max_rows and self.min_rows > self.max_rows:
            raise ValueError("option 'minOffsetsPerTrigger' is above 'maxOffsetsPerTrigger'")
        self.min_partitions = positive(options, MIN_PARTITIONS, os.cpu_count() or 1) or 1
        self.max_per_partition = (
            positive(options, MAX_PER_PARTITION, DEFAULT_MAX_PER_PARTITION)
            or DEFAULT_MAX_PER_PARTITION
        )
        self.clock: Clock = clock or SystemClock()  # minOffsetsPerTrigger's delay
        self._last_trigger_ms = 0  # as Kafka's: the first micro-batch is never delayed
        self._target: Offsets | None = None  # availableNow: never read past this
        # Per topic, the start latestOffset last planned from and the gap it found
        # there: partitions() of that batch need not ask the server again.
        self._front_gaps: dict[str, tuple[TopicOffset, Tombstone | None]] = {}
        self._http: Client | None = None

    def __getstate__(self) -> dict[str, Any]:
        # read() runs on a pickled copy in a Python worker: ship no connection.
        return {**self.__dict__, "_http": None, "_front_gaps": {}}

    @property
    def http(self) -> Client:
        if self._http is None:
            self._http = connect(
                self.settings.url, self.settings.token, self.settings.ca_file,
                self.settings.server_budget_s,
            )  # fmt: skip
        return self._http

    # --- driver side ----------------------------------------------------------------
    def _heads(self, known: Iterable[str] = ()) -> dict[str, TopicState | None]:
        return heads(self.http, self.subscription, known)

    def initialOffset(self) -> dict:
        return to_json(
            {
                topic: start_cursor(self.starting.of(topic), state)
                for topic, state in self._heads(self.starting.given).items()
            }
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_rows is not None:
            return ReadMaxRows(self.max_rows)
        # Spark passes ReadAllAvailable instead when a trigger must read everything.
        return ReadAllAvailable() if self.min_rows is None else ReadMinRows(self.min_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {
            topic: TopicOffset(state.epoch, state.head_seq)
            for topic, state in self._heads().items()
            if state is not None
        }

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        base: Offsets = {}
        skipped: dict[str, int] = {}  # per topic: where the batch's records start
        backlog: dict[str, int] = {}
        for topic, state in self._heads(begin).items():
            # A topic a pattern finds after the query started is read from its start.
            at = begin.get(topic, TopicOffset(0, 0))
            if state is None:  # deleted (or not created yet): wait for an instance to read
                base[topic], skipped[topic], backlog[topic] = at, at.seq, 0
                continue
            epoch, head = state.epoch, state.head_seq
            if at.epoch not in (0, epoch):
                if self.settings.on_data_loss == "fail":
                    raise WaymarkDataLoss(
                        topic, at.seq + 1, None, "recreated",
                        f"the checkpoint names instance {at.epoch}, the topic is now instance "
                        f"{epoch}; {_SKIP_HINT}",
                    )  # fmt: skip
                at = TopicOffset(epoch, 0)  # skip: the new instance, from its start
            elif at.epoch == 0:
                at = TopicOffset(epoch, at.seq)
            # A gap at the start is planned whole into this batch (partitions() reports
            # it once), so no batch or partition boundary cuts it into slices; its seqs
            # hold no rows and cost no admission budget.
            past = at.seq
            gone = self._front_gap(topic, at, state)
            self._front_gaps[topic] = (at, gone)
            if gone is not None:
                if self.settings.on_data_loss == "fail":
                    raise WaymarkDataLoss(
                        topic, gone.gap_from, gone.gap_to, gone.reason, _SKIP_HINT
                    )
                past = max(past, gone.gap_to)
            if self._target is not None:
                target = self._target.get(topic)
                head = min(head, target.seq) if target and target.epoch == epoch else past
            base[topic], skipped[topic], backlog[topic] = at, past, max(0, head - past)
        if self._delay(sum(backlog.values()), limit):
            return start
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        grant = admit(backlog, max_rows)
        return to_json({t: TopicOffset(o.epoch, skipped[t] + grant[t]) for t, o in base.items()})

    def _delay(self, available: int, limit: ReadLimit) -> bool:
        """Whether this micro-batch waits for ``minOffsetsPerTrigger`` records: not under
        availableNow (Kafka ignores it there too), nor when Spark asks for everything."""
        if self.min_rows is None or self._target is not None:
            return False
        if isinstance(limit, ReadAllAvailable):
            return False
        now = self.clock.now_ms()
        if delay_batch(available, self.min_rows, now, self._last_trigger_ms, self.max_delay_ms):
            return True
        self._last_trigger_ms = now
        return False

    def _front_gap(self, topic: str, at: TopicOffset, state: TopicState) -> Tombstone | None:
        return front_gap(self.http, self.settings, topic, at, state)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
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
                else:  # not created when planned from: its first instance, from the cursor
                    lo = first.seq
            if lo < last.seq:
                lo = self._report_front_gap(topic, TopicOffset(last.epoch, lo), last.seq)
            ranges.append((topic, last.epoch, lo, last.seq, recreated))
        return split(
            self.settings,
            ranges,
            min_partitions=self.min_partitions,
            max_per_partition=self.max_per_partition,
        )

    def _report_front_gap(self, topic: str, at: TopicOffset, hi: int) -> int:
        """Report a gap right after ``at`` once, from the driver, and return where the
        batch's reads start. Runs again if Spark replays the batch: the gaps row's id
        makes the report idempotent."""
        planned = self._front_gaps.pop(topic, None)
        if planned is not None and planned[0] == at:
            gone = planned[1]
        else:  # a batch Spark replays from its offset log: latestOffset did not plan it
            state = _state(self.http, topic)
            gone = None if state is None else self._front_gap(topic, at, state)
        if gone is None:
            return at.seq
        upto = min(gone.gap_to, hi)  # below gap_to only if eviction moved on since planned
        report_gap(self.http, self.settings, topic, at.epoch, gone.gap_from, upto, gone.reason,
                   share(gone, upto))  # fmt: skip
        return upto

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
    """Page through ``diff`` over ``(lo, hi]`` as Arrow pages (docs/http-api.md, "Arrow
    pages") and yield the server's batches as they come, with the topic column added.

    The next page is asked for as soon as a page arrives, in a background thread, so
    the server renders it while Spark takes this page's batches (docs/spark.md,
    "Figures"). The client is never used by both threads at once: a gap is reported
    before the next request goes out."""
    settings = part.settings
    with (
        connect(settings.url, settings.token, settings.ca_file, settings.server_budget_s) as http,
        ThreadPoolExecutor(1, thread_name_prefix="waymark-prefetch") as prefetch,
    ):

        def fetch(cursor: int) -> Future[ArrowPage]:
            return prefetch.submit(
                http.diff_arrow, part.topic, cursor, limit=min(settings.page, part.hi - cursor),
                epoch=part.epoch, node=settings.node,
            )  # fmt: skip

        if part.recreated is not None:
            # Only reached under skip: fail stopped the query when planning the batch.
            _gap(http, part, part.recreated.seq + 1, None, "recreated", 0)
        cursor = part.lo
        pending = fetch(cursor) if cursor < part.hi else None
        while pending is not None:
            page = pending.result()
            pending = None
            gone = page.tombstone
            if gone is not None:
                if gone.reason == "recreated":
                    # The instance this range belongs to is gone; the next batch's
                    # planning sees the new epoch and follows onDataLoss there.
                    _gap(http, part, cursor + 1, part.hi, "recreated", part.hi - cursor)
                    return
                # Met here if the loss happened after the driver planned the batch, or is
                # a hole inside the range (a crash's `lost`, a router's `source_trim`):
                # each range reports its own slice of the gap.
                upto = min(gone.gap_to, part.hi)
                _gap(http, part, gone.gap_from, upto, gone.reason, share(gone, upto))
            # Past next_from_seq only if the page moved the cursor: otherwise nothing
            # more below hi exists (the range was planned from head_seq).
            if cursor < page.next_from_seq < part.hi:
                pending = fetch(page.next_from_seq)
            cursor = page.next_from_seq
            for batch in page.table.to_batches():
                if batch.num_rows:
                    yield to_rows(part.topic, batch, part.hi)


def front_gap(
    http: Client, settings: ReadSettings, topic: str, at: TopicOffset, state: TopicState
) -> Tombstone | None:
    """The tombstone a read after ``at`` meets first, if records from ``at.seq + 1``
    on were lost to cap/TTL eviction; asks the server only when the topic's
    ``evict_floor`` says so (the tombstone carries the reason and the count)."""
    if state.epoch != at.epoch or at.seq + 1 >= state.evict_floor:
        return None
    page = http.diff_raw(topic, at.seq, limit=1, epoch=at.epoch, node=settings.node)
    gone = page.tombstone
    return None if gone is None or gone.reason == "recreated" else gone


def _state(http: Client, topic: str) -> TopicState | None:
    """The topic's state without counting as consumption; None if it does not exist."""
    try:
        return http.get_topic(topic, touch=False)
    except ApiError as error:
        if error.code != ErrorCode.TOPIC_NOT_FOUND:
            raise
        return None


def _gap(
    http: Client,
    part: SeqRange,
    gap_from: int,
    gap_to: int | None,
    reason: str,
    missed: int,
) -> None:
    old = part.recreated
    epoch = old.epoch if reason == "recreated" and old is not None else part.epoch
    report_gap(http, part.settings, part.topic, epoch, gap_from, gap_to, reason, missed)


def share(gone: Tombstone, upto: int) -> int:
    """The tombstone's ``missed_estimate`` for its gap cut at ``upto``, in proportion,
    so that the slices of one gap add up to its count rather than each claiming it."""
    if upto >= gone.gap_to:
        return gone.missed_estimate
    whole = gone.gap_to - gone.gap_from + 1
    return max(1, gone.missed_estimate * (upto - gone.gap_from + 1) // whole)


def report_gap(
    http: Client,
    settings: ReadSettings,
    topic: str,
    epoch: int,
    gap_from: int,
    gap_to: int | None,
    reason: str,
    missed: int,
) -> None:
    """Follow ``onDataLoss`` for records of ``topic`` instance ``epoch`` that were lost."""
    if settings.on_data_loss == "fail":
        raise WaymarkDataLoss(topic, gap_from, gap_to, reason, _SKIP_HINT)
    log.warning(
        "waymark topic %r lost records [%s, %s] (reason: %s); skipping, recorded in %r",
        topic, gap_from, gap_to, reason, settings.gaps_topic,
    )  # fmt: skip
    gap = {
        "topic": topic,
        "epoch": epoch,
        "gap_from": gap_from,
        "gap_to": gap_to,
        "reason": reason,
        "missed_estimate": missed,
    }
    # The id makes a retried task's or a replayed batch's report idempotent (the topic's
    # dedupe window). It names the gap by its range, which is authoritative; the
    # reason is informational and may read differently on a retry.
    record_id = f"{topic}:{epoch}:{gap_from}-{gap_to}"
    http.append(settings.gaps_topic, [RecordIn.of(gap, tag=topic, id=record_id)])


_TS_US = pa.timestamp("us", tz="UTC")


def to_rows(topic: str, batch: pa.RecordBatch, hi: int) -> pa.RecordBatch:
    """One batch of an Arrow page as rows of the source's schema, cut at seq ``hi``.

    Built from the page's buffers: its node, tag, meta and data columns are passed on
    as they are (``data`` stays the JSON text; ``meta`` is null where no record has
    one), ``ts`` goes from ms to Spark's µs, and ``topic`` is one repeated value.
    """
    seqs = _int64s(batch.column(0))
    if seqs[-1] > hi:  # seqs ascend: the rows past the range's end are a tail
        batch = batch.slice(0, int(np.searchsorted(seqs, hi, side="right")))
    n = batch.num_rows
    micros = _int64s(batch.column(1)) * 1000
    return pa.RecordBatch.from_arrays(
        [
            # From numpy buffers, not pa.array() / pa.scalar(): their first call imports
            # pandas (~1 s per process here).
            _repeat(topic, n),
            batch.column(0),
            pa.Array.from_buffers(_TS_US, n, [None, pa.py_buffer(micros)]),  # type: ignore[arg-type]  # an ndarray is a buffer
            *batch.columns[2:],
        ],
        schema=ARROW_SCHEMA,
    )


def _int64s(column: pa.Array) -> np.ndarray:
    """A 64-bit column without nulls as numpy, from its buffer (``to_numpy()`` imports
    pandas on first use: ~1 s per worker process)."""
    data = column.buffers()[1]
    assert data is not None  # an int64 column has its values buffer
    return np.frombuffer(data, np.int64, len(column), column.offset * 8)  # type: ignore[call-overload]  # a pa.Buffer is a buffer


def _repeat(text: str, n: int) -> pa.Array:
    raw = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(
        pa.string(),
        n,
        [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)],  # type: ignore[arg-type]  # an ndarray is a buffer
    )
