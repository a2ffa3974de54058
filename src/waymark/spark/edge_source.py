"""The topic source reading a pipeline edge: ``readStream.format("waymark")`` with
options ``edge``, ``handoff`` and ``stage`` instead of ``topics`` (docs/spark.md,
"A Spark stage of a pipeline"; the rules are :mod:`waymark.spark.edge`).

The driver follows the edge's handoff record between micro-batches and plans each
batch from the placement the offset names; executors read that placement's topic,
keep the rows of its generation and count the stale ones; a commit acknowledges the
batch to the edge's producers through the stage's checkpointed state and deletes
what is acknowledged from the edge's bounded topic (docs/semantics/pipeline.md §7).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from waymark.client import ApiError, Client, Tombstone, TransportError
from waymark.objstore import ObjectStore, ObjectStoreError, open_store
from waymark.pipeline.identity import load_identity
from waymark.pipeline.locator import HandoffReader, QueueLocator
from waymark.pipeline.patience import PatientStore
from waymark.pipeline.placement import EdgePlacement, gone, packs_after
from waymark.pipeline.report import ReportFenced, StageReport, load_report, publish_report
from waymark.pipeline.state import CheckpointedStageState, StageStateStore

from ..protocol import MAX_ARROW_DIFF_LIMIT
from .connection import connect, token_option
from .edge import (
    EdgeOffset,
    EdgeOptions,
    EdgeRange,
    OnUnreachable,
    PackAt,
    accept,
    acknowledged,
    advance,
    after_failure,
    bind,
    follow,
    initial,
    offsets_json,
    parse_offsets,
    span,
    unpack,
)
from .source import WaymarkDataLoss, to_rows

log = logging.getLogger("waymark.spark.edge")

DEFAULT_MAX_PER_PARTITION = 200_000
WAIT_LIMIT_S = 60.0  # a read waits this long for its server or a newer placement


def stale_key(stage: str, part: EdgeRange) -> str:
    """Where a read records the stale rows it dropped: one object per range, so a
    retried task writes the same count again (docs/spark.md, "A Spark stage")."""
    return f"stages/{stage}/stale/{part.generation}-{part.lo}-{part.hi}.json"


def patient_store(options: EdgeOptions) -> PatientStore:
    """The handoff store, every call of it waiting out an outage within the budget, with
    the pipeline runner's backoff and jitter (docs/semantics/pipeline.md §10)."""
    return PatientStore(open_store(options.handoff), budget_s=options.store_budget_s)


class EdgePartition(InputPartition):
    """One seq range of one placement, with what a worker needs to read it."""

    def __init__(self, options: EdgeOptions, token: str | None, ca_file: str | None,
                 part: EdgeRange) -> None:  # fmt: skip
        super().__init__((part.generation, part.lo, part.hi))
        self.options = options
        self.token = token
        self.ca_file = ca_file
        self.part = part


class WaymarkEdgeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str], edge: EdgeOptions) -> None:
        self.edge = edge
        self.token = token_option(options)
        self.ca_file = options.get("caFile")
        self.max_rows = _positive(options, "maxOffsetsPerTrigger", None)
        self.min_partitions = _positive(options, "minPartitions", os.cpu_count() or 1) or 1
        self.max_per_partition = (
            _positive(options, "maxRecordsPerPartition", DEFAULT_MAX_PER_PARTITION)
            or DEFAULT_MAX_PER_PARTITION
        )
        self._target: EdgeOffset | None = None  # availableNow: never read past this
        self._store: ObjectStore | None = None
        self._clients: dict[str, Client] = {}
        self._rebinds = 0
        self._processed = 0
        self._released = (0, 0)  # (generation, seq) deleted up to on the edge's topic
        self._states: StageStateStore | None = None
        self._state: CheckpointedStageState | None = None  # claimed at the first commit

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None, "_clients": {}, "_states": None}

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = patient_store(self.edge)
        return self._store

    def _client(self, url: str) -> Client:
        if url not in self._clients:
            self._clients[url] = connect(url, self.token, self.ca_file)
        return self._clients[url]

    def _published(self) -> QueueLocator | None:
        return HandoffReader(self.store, self.edge.edge).current()

    def _head(self, at: EdgeOffset) -> int | None:
        """The placement's head; None when its server does not answer."""
        try:
            return self._client(at.server).get_topic(at.topic, touch=False).head_seq
        except (TransportError, ApiError) as error:
            if not gone(error):
                raise
            return None

    # --- driver ---------------------------------------------------------------------
    def initialOffset(self) -> dict:
        state = StageStateStore(self.store).load(self.edge.stage)
        start = initial(self._published(), state.input if state is not None else None)
        return offsets_json(self.edge.edge, start)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_rows is None else ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        published = self._published()
        if published is not None:
            at = bind(published)
            self._target = advance(at, self._head(at), None)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = parse_offsets(self.edge.edge, start)
        self._acknowledge(begin)  # the batch ending at start is committed
        base = follow(begin, self._published())
        if base.generation != begin.generation:
            self._rebinds += 1
            log.info("edge %r moved to generation %s on %s; rebinding", self.edge.edge,
                     base.generation, base.server)  # fmt: skip
        head = self._head(base) if base.generation else None
        target = self._target
        if target is not None and head is not None:
            if target.generation == base.generation:
                head = min(head, target.seq)
            elif target.generation < base.generation:  # moved during availableNow
                self._target = advance(base, head, None)
        max_items = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        packs: list[PackAt] = []
        if max_items is not None and head is not None and head > base.seq:
            read = self._packs(base, head, max_items)
            if read is None:
                head = None  # its server went away: nothing new for now
            packs = read or []
        return offsets_json(self.edge.edge, advance(base, head, max_items, packs))

    def _packs(self, base: EdgeOffset, head: int, max_items: int) -> list[PackAt] | None:
        """``(seq, generation, items)`` of the records after ``base`` up to ``head``, or
        one pack past ``max_items`` items of its generation, for :func:`advance` to cut
        a batch at whole packs (docs/spark.md, "A Spark stage of a pipeline"). The
        driver reads them, data too: the server has no read of metas alone. Pages start
        small and double, since a pack may be 256 KiB. None when the server is gone."""
        packs: list[PackAt] = []
        taken = 0
        try:
            client = self._client(base.server)
            for r in packs_after(client, base.topic, base.seq, head, page=4, most=512):
                packs.append((r.seq, r.meta.generation, r.count()))
                count = packs[-1][2] if r.meta.generation == base.generation else 0
                if taken and taken + count > max_items:
                    break  # the pack past the limit (advance's rule): advance cuts before it
                taken += count
        except (TransportError, ApiError) as error:
            if not gone(error):
                raise
            return None
        return packs

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        part = span(parse_offsets(self.edge.edge, start), parse_offsets(self.edge.edge, end))
        if part is None:
            return []
        seqs = part.hi - part.lo
        pieces = min(seqs, max(self.min_partitions, -(-seqs // self.max_per_partition)))
        step, extra = divmod(seqs, pieces)
        out: list[InputPartition] = []
        lo = part.lo
        for i in range(pieces):
            hi = lo + step + (1 if i < extra else 0)
            out.append(
                EdgePartition(
                    self.edge,
                    self.token,
                    self.ca_file,
                    EdgeRange(part.generation, part.server, part.topic, lo, hi),
                )
            )
            lo = hi
        return out

    def commit(self, end: dict) -> None:
        """Acknowledge the committed batch (docs/semantics/pipeline.md §7.3)."""
        self._acknowledge(parse_offsets(self.edge.edge, end))

    def _acknowledge(self, done: EdgeOffset) -> None:
        """Tell the edge's producers that everything up to ``done`` is through this stage
        (the stage's checkpointed input position), delete it from the edge's topic and
        publish the stage's report. Spark calls ``commit`` a batch late, so planning
        the next batch acknowledges the last one too: ``latestOffset`` runs only once the
        batch that ends at its ``start`` is in Spark's commit log."""
        if done.generation == 0:
            return
        published = self._published()
        ack = acknowledged(done, published.generation if published is not None else 0)
        if self._states is None or self._state is None:
            # This query is the stage's instance now; an older query still running it is
            # fenced at its next save (docs/semantics/pipeline.md §4.4).
            self._states = StageStateStore(self.store)
            fresh = CheckpointedStageState(stage=self.edge.stage, input_edge=self.edge.edge)
            self._state = self._states.claim(fresh, f"spark:{uuid.uuid4().hex[:12]}")
        states, state = self._states, self._state
        if ack is None or (state.input is not None and ack <= state.input):
            if self._rebinds:
                self._report()
            return
        same = state.input is not None and state.input.generation == ack.generation
        self._processed += ack.seq - (state.input.seq if same and state.input else done.start_seq)
        state.input = ack
        states.save(state)
        self._release(done, published)
        self._report()

    def _release(self, done: EdgeOffset, published: QueueLocator | None) -> None:
        """Delete acknowledged records from the edge's bounded topic, a tenth of its
        capacity at a time (docs/semantics/pipeline.md §3.6); best effort."""
        capacity = published.capacity if published is not None else 0
        gen, seq = self._released
        if gen == done.generation and done.seq - seq < max(1, min(capacity // 10, 10_000)):
            return
        try:
            self._client(done.server).delete(done.topic, before_seq=done.seq + 1)
        except (TransportError, ApiError):
            return
        self._released = (done.generation, done.seq)

    def _report(self) -> None:
        """The stage's counters for ``waymark pipeline status``: stale rows dropped (the
        workers' counts), rebinds, and the seqs acknowledged. Best effort, like the
        runner's: a store out past its budget leaves them for the next commit."""
        try:
            self._publish_report()
        except ObjectStoreError as error:
            log.warning("stage %s: its report waits for the store: %s", self.edge.stage, error)
        except ReportFenced as error:  # a newer query runs the stage and reports it
            log.warning("%s", error)

    def _publish_report(self) -> None:
        report = load_report(self.store, self.edge.stage) or StageReport(stage=self.edge.stage)
        report.stale_dropped = sum(
            int(self.store.get(meta.key).data)
            for meta in self.store.list(f"stages/{self.edge.stage}/stale/")
        )
        report.rebinds += self._rebinds
        report.processed += self._processed
        report.updated_ms = time.time_ns() // 1_000_000
        # fenced by this query's claim of the stage (docs/semantics/pipeline.md §4.7)
        report.incarnation = self._state.incarnation if self._state is not None else 0
        publish_report(self.store, report)
        self._rebinds = self._processed = 0  # counted once published

    def stop(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients = {}

    # --- executor -------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, EdgePartition)
        yield from read_edge_range(partition)


def read_edge_range(partition: EdgePartition) -> Iterator[pa.RecordBatch]:
    """Read one range of a placement as Arrow pages, keep the rows of its generation,
    count the stale ones; when the server is gone, wait for it or give the range up
    once a newer generation is published (docs/semantics/pipeline.md §7.3)."""
    part, options = partition.part, partition.options
    store = patient_store(options)
    handoff = HandoffReader(store, options.edge)
    stale = 0
    cursor = part.lo
    failed_at: float | None = None
    attempt = 0
    with connect(part.server, partition.token, partition.ca_file) as http:
        while cursor < part.hi:
            try:
                page = http.diff_arrow(
                    part.topic, cursor, limit=min(MAX_ARROW_DIFF_LIMIT, part.hi - cursor)
                )
            except (TransportError, ApiError) as error:
                if not gone(error):
                    raise
                now = time.monotonic()
                failed_at = now if failed_at is None else failed_at
                published = handoff.current()
                verdict = after_failure(part.generation,
                                        published.generation if published else 0,
                                        now - failed_at, WAIT_LIMIT_S)  # fmt: skip
                if verdict is OnUnreachable.ABANDON:
                    log.warning("edge %r: %s is gone and generation %s is published; the "
                                "producers write seqs (%s, %s] of generation %s there",
                                options.edge, part.server, published and published.generation,
                                cursor, part.hi, part.generation)  # fmt: skip
                    break
                if verdict is OnUnreachable.FAIL:
                    raise
                attempt += 1
                time.sleep(min(2.0, 0.05 * 2 ** min(attempt, 6)))
                continue
            failed_at, attempt = None, 0
            if page.tombstone is not None:
                # the rest of the range too: its producers write it again after the move
                lost(partition, store, http, page.tombstone)
                break
            for batch in page.table.to_batches():
                kept, dropped = accept(batch, part.generation, part.hi)
                stale += dropped
                if kept.num_rows:  # one row per item of each pack (docs/semantics/pipeline.md §7)
                    yield unpack(to_rows(part.topic, kept, part.hi))
            if page.next_from_seq <= cursor:
                break
            cursor = page.next_from_seq
    if stale:
        store.put(stale_key(options.stage, part), msgspec.json.encode(stale))


def lost(partition: EdgePartition, store: ObjectStore, http: Client, tombstone: Tombstone) -> None:
    """Records of the range's placement are gone from its topic (a server restart lost
    a tail it had acknowledged before syncing it). The stage never acknowledged them,
    so their producers hold them; the read moves the edge as a pipeline consumer does,
    unless a newer generation is published already (a retried task, another range),
    and gives the rest of its range up: once a newer generation is published the batch
    acknowledges nothing and the next batch reads the new placement from its start,
    where the producers write every unacknowledged record again
    (docs/semantics/pipeline.md §7.4). ``failOnDataLoss=true`` fails the query instead."""
    part, options = partition.part, partition.options
    identity = load_identity(store)
    gone_from = (f"records of generation {part.generation} of edge {options.edge!r} on "
                 f"{part.server} are gone; their producers hold them until this stage "
                 "acknowledges them")  # fmt: skip
    if options.fail_on_data_loss:
        raise WaymarkDataLoss(part.topic, tombstone.gap_from, tombstone.gap_to, tombstone.reason,
                              f"{gone_from}: with failOnDataLoss=false (the default) the "
                              "stage moves the edge so that they are written again")  # fmt: skip
    if identity is None or identity.edge_topic(options.edge) != part.topic:
        # not this pipeline's topic (a handoff store edited or swapped): moving it from
        # here could allocate another topic, so the query stops instead
        raise WaymarkDataLoss(part.topic, tombstone.gap_from, tombstone.gap_to, tombstone.reason,
                              f"{gone_from}, but the handoff store's pipeline does not name "
                              "this topic, so the stage cannot move the edge")  # fmt: skip
    published = HandoffReader(store, options.edge).current()
    if published is None or published.generation != part.generation:
        log.warning("edge %r: records [%s, %s] are gone from %s (%s); generation %s is "
                    "published, where the producers write them again", options.edge,
                    tombstone.gap_from, tombstone.gap_to, part.server, tombstone.reason,
                    published and published.generation)  # fmt: skip
        return
    # The edge stays on the server that answered: the only one a Spark stage knows.
    edge = EdgePlacement(options.edge, [part.server], store, capacity=published.capacity,
                         connect=lambda _url: http, identity=identity)  # fmt: skip
    edge.bind(published)
    edge.lost(tombstone)  # logs the gone range; moves, or adopts a newer placement


def _positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = options.get(name)
    if value is None:
        return default
    number = int(value)
    if number < 1:
        raise ValueError(f"option {name!r} is a positive integer: {value!r}")
    return number
