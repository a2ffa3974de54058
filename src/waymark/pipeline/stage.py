"""A stage: read the input edge (or produce events), apply the stage's function,
write the output edge (or the sink), checkpoint (docs/semantics/pipeline.md §4, §5)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from waymark.client import ApiError, Client, ConfigPatch, RecordIn, TransportError
from waymark.clock import Backoff, Clock, SystemClock
from waymark.pipeline.batch import InFlight
from waymark.pipeline.behind import Inline, WriteBehind
from waymark.pipeline.edge import Connect, RelocatableQueueEdge, Sleep
from waymark.pipeline.functions import RecordError, apply, is_batch
from waymark.pipeline.identity import PipelineIdentity, identity_of
from waymark.pipeline.shard import ShardedEdge
from waymark.pipeline.state import CheckpointedStageState, Position, StageStateStore
from waymark.protocol import EDGE_EVENT

from .errors import PipelineError

SourceFn = Callable[[int], Any]
_encode = msgspec.json.encode
_decode = msgspec.json.decode
StageFn = Callable[[Any], Iterable[Any]]
Output = RelocatableQueueEdge | ShardedEdge  # an edge, or one read by a sharded stage


def output_event(event: str, stage: str, k: int) -> str:
    """The stable id of the ``k``-th output ``stage`` makes of the record ``event``
    (docs/semantics/pipeline.md §5.1). The stage's name keeps two fanning-out stages
    apart: with ``/k`` alone, the second output of ``e`` and the first of ``e/1`` would
    both be ``e/1``, and the sink would drop one as a repeat."""
    return event if k == 0 else f"{event}/{stage}:{k}"


def _held(out: Output) -> int:
    """Records ``out`` holds unacknowledged (a sharded edge: its fullest part's, each
    part being an edge with a consumer of its own)."""
    parts = out.parts if isinstance(out, ShardedEdge) else [out]
    return max(len(part.unacked) for part in parts)


def _full(out: Output, coming: int) -> bool:
    """Whether ``coming`` more items would take a part of ``out`` past the edge's
    ``capacity``, which counts items, as a user sets it in events (docs/pipeline.md,
    "Flow control"). An empty part takes a step's items whatever their number, so a
    stage always progresses."""
    parts = out.parts if isinstance(out, ShardedEdge) else [out]
    return any(len(p.unacked) and len(p.unacked) + coming > p.capacity for p in parts)


class SinkUnavailable(PipelineError):
    """The sink server refused or did not answer within the retry budget."""


class StageFunctionFailed(PipelineError):
    """A stage's function raised on one event (or gave a value JSON cannot hold);
    ``event`` is its id as JSON (docs/semantics/pipeline.md §9.2)."""

    def __init__(self, stage: str, event: bytes, error: BaseException) -> None:
        self.stage = stage
        self.event = event
        self.error = f"{type(error).__name__}: {error}"
        name = event.decode(errors="replace")
        super().__init__(f"stage {stage!r}: its function failed on event {name}: {self.error}")


# The meta of a dead-lettered record (docs/semantics/pipeline.md §9.2).
DEAD_STAGE, DEAD_ERROR, DEAD_ATTEMPTS = "wm.stage", "wm.error", "wm.attempts"


class Sink:
    """The final topic, written with each event's stable id as the record ``id``, so
    a replayed event is absorbed (docs/semantics/pipeline.md §5.2)."""

    WINDOW_MS = 7 * 24 * 3_600_000

    def __init__(
        self,
        url: str,
        topic: str,
        *,
        connect: Connect,
        sleep: Sleep = time.sleep,
        retries: int = 20,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.url = url
        self.topic = topic
        self.client: Client = connect(url)
        self.sleep = sleep
        self.retries = retries
        self.backoff = backoff or Backoff(0.05, 2.0)
        self.rng = rng or random.Random()

    def _retry(self, call: Callable[[], object]) -> None:
        for attempt in range(1, self.retries + 2):
            try:
                call()
                return
            except (TransportError, ApiError) as error:
                if isinstance(error, ApiError) and error.status < 500:
                    raise
                if attempt > self.retries:
                    raise SinkUnavailable(f"sink {self.url} {self.topic}: {error}") from error
                self.sleep(self.backoff.delay(attempt, self.rng))

    def open(self) -> None:
        self._retry(lambda: self.client.put_topic(
            self.topic, ConfigPatch(idempotency_window_ms=self.WINDOW_MS)))  # fmt: skip

    def write(self, records: InFlight) -> None:
        # in writes the server takes (docs/semantics/pipeline.md §3.7); a retried chunk
        # is absorbed by the ids
        for chunk in records.chunks():
            body = chunk.sink_records()
            self._retry(lambda body=body: self.client.append(self.topic, body))  # type: ignore[misc]

    def write_dead(self, event: bytes, data: bytes, meta: dict[str, str]) -> None:
        """One poison event, as a dead-letter topic takes it: its input as ``data``, why
        in ``meta``, its event id as the record id (a second write is absorbed)."""
        eid = str(_decode(event))
        record = RecordIn(msgspec.Raw(data), meta={EDGE_EVENT: eid, **meta}, id=eid)
        self._retry(lambda: self.client.append(self.topic, [record]))


@dataclass(slots=True)
class StageStats:
    processed: int = 0
    dead_lettered: int = 0
    latencies_ms: list[int] = field(default_factory=list)  # at a sink: now - born


class Stage:
    """One stage of a pipeline, driven step by step by :meth:`step`.

    A source stage (``events`` set) calls ``function(n)`` for event n; another stage
    calls ``function(value)`` for each input record and writes every value it yields,
    or, for a :func:`~waymark.pipeline.functions.batch_function`, ``function(events)``
    for each batch (docs/pipeline.md, "Batch functions"). Exactly one of ``output``
    and ``sink`` is set. ``identity`` (default: the one kept in the states' store)
    scopes a source's event ids. ``behind`` runs each batch's
    writes and checkpoint save (default: at once; the runner's overlap them with the
    next batch's read, docs/semantics/pipeline.md §4.5).
    """

    def __init__(
        self,
        name: str,
        function: Callable[..., Any],
        *,
        states: StageStateStore,
        input: RelocatableQueueEdge | None = None,  # noqa: A002 -- the pipeline file's word
        output: Output | Sequence[Output] | None = None,
        sink: Sink | None = None,
        events: int | None = None,
        batch: int = 500,
        clock: Clock | None = None,
        identity: PipelineIdentity | None = None,
        dead_letter: Sink | None = None,
        poison: dict[bytes, tuple[int, str]] | None = None,
        checkpoint_interval_ms: int = 0,
        save_every: int | None = None,
        behind: WriteBehind | None = None,
        key: str | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        if (input is None) == (events is None):
            raise ValueError(f"stage {name!r}: give an input edge or a number of events")
        outputs: list[Output] = (
            [output] if isinstance(output, (RelocatableQueueEdge, ShardedEdge))
            else list(output or ())
        )  # fmt: skip
        if (not outputs) == (sink is None):
            raise ValueError(f"stage {name!r}: give output edges or a sink")
        if input is None and is_batch(function):
            raise ValueError(f"stage {name!r}: a source's function takes an event number, "
                             "not a batch")  # fmt: skip
        self.name = name
        # Where its state is kept: the name, or ``<stage>.<k>`` for shard k
        # (docs/semantics/pipeline.md §11).
        self.key = key or name
        self.function = function
        self.states = states
        self.input = input
        # Several output edges: each gets every output (docs/pipeline.md, "Fan-out").
        self.outputs = outputs
        self.output = outputs[0] if outputs else None
        self.sink = sink
        self.events = events
        self.batch = batch
        self.clock = clock or SystemClock()
        self.identity = identity or identity_of(states.store)
        # Events (ids as JSON) the function failed on too often: (attempts, last error).
        # Each goes to ``dead_letter`` instead of the function (docs/semantics/pipeline.md §9.2).
        self.poison = poison if poison is not None else {}
        self.dead_letter = dead_letter
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self._saved: tuple[Position | None, int] | None = None  # what the last save held
        self._saved_ms: int | None = None
        # Credit back to the producers: a busy stage saves once it took this many input
        # records since its last save, even within the interval, so that a producer
        # bounded by ``max_in_flight`` hears of them before its window fills
        # (docs/pipeline.md, "Flow control"). None: by the interval alone.
        self.save_every = save_every
        self._unsaved = 0  # input records taken since the last save
        self.behind: WriteBehind = behind or Inline()
        # Credit-based flow control: at this many records unacknowledged on an output
        # edge the stage takes no new input until its consumer catches up (None: no
        # bound). A producer racing ahead only grows what it holds, copies and replays
        # (docs/pipeline.md, "Flow control").
        self.max_in_flight = max_in_flight
        self.held_back = False  # the last step took nothing: an output's window is full
        self._coming = batch  # the items the next step may add to each output: the last's
        self._durable: Position | None = None  # an input position whose save landed
        self._landed_ms: list[int] = []  # latencies of the sink write that landed
        self.stats = StageStats()
        self.instance = f"{self.key}/{uuid.uuid4().hex[:12]}"
        self.state = CheckpointedStageState(stage=self.key)
        self.next_event = 0

    def start(self) -> None:
        """Load the checkpoint and bind the edges (docs/semantics/pipeline.md §4.3)."""
        # Claiming the state fences every earlier instance of this stage: a zombie of a
        # restart or a second process can no longer save (docs/semantics/pipeline.md §4.4).
        fresh = CheckpointedStageState(
            stage=self.key,
            input_edge=self.input.name if self.input else None,
            output_edge=self.output.name if self.output else None,
        )
        self.state = self.states.claim(fresh, self.instance)
        self._saved = (self.state.input, self.state.source_offset)
        self.next_event = self.state.source_offset
        if self.input is not None:
            self.input.resume(self.state.input)
        for out in self.outputs:
            out.open()
        if self.sink is not None:
            self.sink.open()
        if self.dead_letter is not None and self.poison:
            self.dead_letter.open()

    def _dead(self, event: bytes, data: bytes) -> bool:
        """Dead-letter ``event`` if it is poison; whether it was."""
        found = self.poison.get(event)
        if found is None:
            return False
        if self.dead_letter is None:
            raise ValueError(f"stage {self.name!r}: poison events but no dead letter topic")
        attempts, error = found
        self.dead_letter.write_dead(event, data, {DEAD_STAGE: self.name, DEAD_ERROR: error[:2000],
                                                  DEAD_ATTEMPTS: str(attempts)})  # fmt: skip
        self.stats.dead_lettered += 1
        return True

    def _call(self, event: bytes, n: int) -> bytes:
        """A source's event ``n``, encoded; any failure is the event's."""
        try:
            return _encode(self.function(n))
        except Exception as error:  # the user's code: any failure is this event's
            raise StageFunctionFailed(self.name, event, error) from error

    def _produce(self) -> InFlight:
        assert self.events is not None
        begin, end = self.next_event, min(self.events, self.next_event + self.batch)
        # event n's id is "<pipeline>.<run>/<stage>:<n>" (docs/semantics/pipeline.md §5.1)
        prefix = _encode(self.identity.event_prefix(self.name))[:-1]
        born = self.clock.now_ms()
        if self.poison:
            made = self._produce_each(prefix, begin, end, born)
        else:
            numbers = range(begin, end)
            events = [b'%s%d"' % (prefix, n) for n in numbers]
            data: list[bytes] = []
            function, n = self.function, begin
            try:  # one guard for the batch: the loop's n names the event that failed
                for n in numbers:
                    data.append(_encode(function(n)))
            except Exception as error:  # the user's code: any failure is this event's
                raise StageFunctionFailed(self.name, events[n - begin], error) from error
            made = InFlight.build(events, data, origin_seq=np.arange(begin, end), born_ms=born)
        self.next_event = end
        return made

    def _produce_each(self, prefix: bytes, begin: int, end: int, born: int) -> InFlight:
        """:meth:`_produce` event by event, dead-lettering the poison ones."""
        events: list[bytes] = []
        data: list[bytes] = []
        origins: list[int] = []
        for n in range(begin, end):
            event = b'%s%d"' % (prefix, n)
            if self._dead(event, b"%d" % n):
                continue
            events.append(event)
            data.append(self._call(event, n))
            origins.append(n)
        return InFlight.build(events, data, origin_seq=origins, born_ms=born)

    def _transform(self, records: InFlight) -> InFlight:
        """The function applied to the records (event by event, or to the batch for a
        batch function): their outputs, each with its stable id and the record's
        position as origin (docs/semantics/pipeline.md §5.1). Poison records are
        dead-lettered first and the function sees the rest."""
        if self.poison:
            keep = np.ones(len(records), np.bool_)
            for i, (event, value) in enumerate(zip(records.event_jsons(), records.values(),
                                                   strict=True)):  # fmt: skip
                keep[i] = not self._dead(event, value)
            records = records.keep(keep)
        stage = _encode(self.name)[1:-1]  # as it reads inside a JSON string
        try:
            return apply(self.function, records, stage)
        except RecordError as failed:  # the user's code: any failure is this event's
            error = failed.__cause__
            assert isinstance(error, BaseException)
            raise StageFunctionFailed(self.name, records.event_json(failed.index),
                                      error) from error  # fmt: skip

    def step(self, *, wait_ms: int = 0) -> int:
        """Move one batch through the stage; the number of input records (or events)
        taken.

        The batch's writes go to :attr:`behind` as one task, which may run while the
        next step reads and calls the function, and which hands the checkpoint save on
        to be group-committed once they landed (docs/semantics/pipeline.md §4.6); a
        step waits for the previous task (raising its error) before it hands over the
        next.
        The saved position never passes a record whose outputs are not yet held by an
        output edge or written to the sink (docs/semantics/pipeline.md §4.5)."""
        self.held_back = any(
            (self.max_in_flight is not None and _held(out) >= self.max_in_flight)
            or _full(out, self._coming)
            for out in self.outputs
        )
        if self.held_back:
            records = InFlight.empty()  # an idle step: it settles and saves
            taken = 0
        elif self.input is None:
            records = self._produce()
            taken = len(records)
        else:
            popped = self.input.pop(self.batch, wait_ms=wait_ms)
            taken = len(popped)
            records = self._transform(popped)
        self.join()  # not its save: that one is group-committed (docs/semantics/pipeline.md §4.6)
        self._release()
        # The outputs are held by their edges from here on (each edge's unacknowledged
        # window), so the position saved may pass their input; a sink's are written
        # before the save, in the same task.
        for i, out in enumerate(self.outputs):
            if records:
                out.enqueue(self._branch(records, i))
        self._unsaved += taken
        save = self._checkpoint(now=taken == 0)
        self.stats.processed += taken
        if taken:
            self._coming = len(records)

        def task() -> None:
            for out in self.outputs:
                if records:
                    out.send()  # as push does (docs/semantics/pipeline.md §3.4)
                out.settle()  # forget what is acknowledged; follow a newer placement
            if self.sink is not None and records:
                self.sink.write(records)
                self._landed_ms = records.latencies_ms(self.clock.now_ms())
            if save is not None:
                # group-committed once what it covers landed (docs/semantics/pipeline.md §4.6)
                self.behind.checkpoint(save)

        self.behind.submit(task)
        if taken == 0:
            self.drain()  # an idle step leaves nothing in the air
            # Its settle may have learned of acknowledgements the save above did not
            # cover: saved too, so that a stage reporting itself done has saved its final
            # position (a rerun then produces nothing again; its repacked events would
            # not be absorbed by the edge, docs/semantics/pipeline.md §3.1).
            late = self._checkpoint(now=True)
            if late is not None:
                self.behind.submit(lambda: self.behind.checkpoint(late))
                self.drain()
            self._release()
        return taken

    def drain(self) -> None:
        """Wait for the last step's writes and every save handed over, raising their
        error."""
        self.behind.flush()
        self._count_landed()

    def join(self) -> None:
        """Wait for the last step's writes (not for their save), raising their error or
        a save's that failed meanwhile."""
        self.behind.join()
        self._count_landed()

    def _count_landed(self) -> None:
        if self._landed_ms:
            self.stats.latencies_ms += self._landed_ms
            self._landed_ms = []

    def _release(self) -> None:
        """Delete the input a landed save acknowledged (docs/semantics/pipeline.md §3.6)."""
        durable, self._durable = self._durable, None
        if self.input is not None and durable is not None:
            self.input.release(durable)

    def close(self) -> None:
        """Let the last step's writes finish (ignoring their error); the instance is
        being dropped."""
        self.behind.close()

    def _branch(self, records: InFlight, i: int) -> InFlight:
        """What output edge ``i`` gets: the records themselves when it is the only one;
        else a copy of its own (each edge places its records), whose ids end with
        ``/<stage>><edge>`` past the first edge, so branches that meet again in one sink
        topic are not taken for repeats (docs/semantics/pipeline.md §5.1)."""
        if len(self.outputs) == 1:
            return records
        if i == 0:
            return records.copy()
        edge = self.outputs[i].name
        return records.branch(b"/%s>%s" % (_encode(self.name)[1:-1], _encode(edge)[1:-1]))

    def _checkpoint(self, *, now: bool = True) -> Callable[[], None] | None:
        """The save of how far the input is fully acknowledged downstream
        (docs/semantics/pipeline.md §4.1), or None when none is due: when the position
        moved, at most every ``checkpoint_interval_ms`` unless ``now`` (an idle step
        saves what it has at once, so the last acknowledgements never wait). A sink's
        position covers what it read: the save runs after the sink write."""
        origins = [o for out in self.outputs if (o := out.oldest_origin()) is not None]
        oldest = min(origins, default=None)
        state = self.state
        if self.input is None:
            state.source_offset = oldest.seq if oldest is not None else self.next_event
        elif oldest is not None:
            state.input = Position(oldest.generation, oldest.seq - 1)
        else:
            state.input = self.input.cursor
        moved = (state.input, state.source_offset) != self._saved
        clock_ms = self.clock.now_ms()
        since = None if self._saved_ms is None else clock_ms - self._saved_ms
        interval = self.checkpoint_interval_ms
        credit = self.save_every is not None and self._unsaved >= self.save_every
        due = since is None or since >= interval or credit
        # A save also tells a superseded instance that it is
        # (docs/semantics/pipeline.md §4.4): at least every
        # second even when nothing moved.
        heartbeat = since is None or since >= max(interval, 1000)
        if interval and not (moved and (now or due)) and not heartbeat:
            return None  # less often only replays more (docs/semantics/pipeline.md §4.1)
        self._saved, self._saved_ms = (state.input, state.source_offset), clock_ms
        self._unsaved = 0
        snapshot = msgspec.structs.replace(state)  # the stage goes on changing its own

        def save() -> None:
            if self.output is not None:
                downstream = self.states.load(self.output.consumer)
                snapshot.output = downstream.input if downstream is not None else None
            self.states.save(snapshot)
            self._durable = snapshot.input

        return save

    def finished(self) -> bool:
        """A source stage is done once every event is produced and acknowledged."""
        return (
            self.events is not None
            and self.next_event >= self.events
            and not any(out.unacked for out in self.outputs)
        )
