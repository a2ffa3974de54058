"""KvWatch resets against a real nats-server, as a hypothesis state machine.

A fold (``watch_applied`` into an append-log store, All scope, resuming from a
cursor) runs while the machine writes bursts, holds and releases the reader
(apply blocks: the feed backpressures), forces resets (the fault injector
``force_reset``, what the heartbeat monitor, a sequence gap or a stall end in),
evicts the stream's head (retention, done by purge) and restarts the server
(the client reconnects; the consumer, in memory, is gone), also while a resync's
re-list runs, and overtakes a re-list held at the server's flow-control window. The
model: every revision is applied once and in order, or a resync ran (then the re-list
is in order) — and once quiet the fold holds every key whose last write the stream
still holds as that write left it; a key whose last write was evicted may be kept
with a value it had (a listing said it was live; the fold keeps what it applied).
A fold that failed (the live floor guard) is restarted from its store's cursor, as
``waymark fold`` would be. A reset's consumer create may also fail transiently a few
times (the fault injector ``fail_next_creates``: a timeout, sometimes after the server
did create the consumer, its answer lost): the reset tries again after a backoff whose
waits the machine injects (no real sleep), and such a failure never ends the fold.
Breaking the reset's resume point (delivered instead of handed over), dropping the chunk
a reset finds in the channel, letting a listing wait on messages removed under it,
giving up on a transient failure, or retrying only the create from the first attempt's
resume point must be caught.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)
from nats.js import api

from waymark.kv import (
    BatchConfig,
    Connection,
    KvUpdate,
    NatsConnectionConfig,
    StoreConfig,
    Timeout,
    WatchCursor,
    WatchError,
    WatchScope,
    watch_applied,
)
from waymark.kv import consumer as consumer_module
from waymark.kv import watcher as watcher_module
from waymark.kv.consumer import OrderedFeed
from waymark.kv.errors import CursorExpired
from waymark.kv.guards import reset_resume_point
from waymark.kv.server import EmbeddedNats
from waymark.kv.stores.append_log import AppendLogStore
from waymark.kv.transient import transient

pytestmark = pytest.mark.timeout(120)

FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None
KEYS = [f"k{i:02}" for i in range(12)]
BIG = b"g" * 16_384  # ~128 of them fill the server's 2 MB flow-control window
HEARTBEAT = 0.25  # the feed's idle heartbeat here: a lost consumer is noticed in 0.75 s
_buckets = itertools.count()


@pytest.fixture(scope="module")
def restartable_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A nats-server of this module's own: the machine kills and restarts it."""
    with EmbeddedNats(tmp_path_factory.mktemp("nats-restart")) as server:
        yield server


def force_reset(feed: OrderedFeed) -> None:
    """Fault injector: recreate the feed's consumer now, as its monitors would."""
    feed._reset()


INJECTED = "fault injector"  # in the message of every failure fail_next_creates injects


class FeedResets(RuleBasedStateMachine):
    server: EmbeddedNats
    create_faults_injected = True  # the rule fail_next_creates runs

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="model-feed-", dir=FAST_TMP))
        self.feeds: list[OrderedFeed] = []
        self.relist_at: list[int] = []  # len(applied) when a re-list feed was created
        # ... and the last revision the expired feed had handed over, all applied by then
        self.handed_before_relist: list[int | None] = []
        self.folds = 0  # watch_applied runs: a failed one is restarted
        self.applied: list[int | None] = []
        self.held = False
        self.release = asyncio.Event()
        self.release.set()
        self.restarts = 0
        self.log: list[tuple[int, str, bytes | None]] = []  # every write: revision, key, value
        self.evicted_below = 1  # retention took every revision below this
        self.hold_relist = False  # hold the reader as the next re-list starts
        self.overtaken = 0  # relist_overtaken runs
        self.stuck = False
        self.create_faults = 0  # re-creations of a consumer still to fail (fail_next_creates)
        self.answer_lost = False  # ... after the server created the consumer
        self.backoffs: list[float] = []  # the delays a reset waited between attempts
        self.fold: asyncio.Task[WatchCursor] | None = None
        self.run(self._setup())

    def run(self, coro: Any, timeout: float = 20.0) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    async def _setup(self) -> None:
        self.conn = Connection(NatsConnectionConfig(url=self.server.url, timeout=5.0))
        await self.conn.connect()
        # The client waits 2 s before it tries a server it just tried again: here
        # that server is back within milliseconds.
        self.conn.client.options["reconnect_time_wait"] = 0.02
        self.kv = await self.conn.store(
            f"feed{next(_buckets)}", StoreConfig(max_bytes=None, max_history=64)
        )
        self.writer = self.kv.writer()
        rev = await self._publish("start", b"0")
        self.store = AppendLogStore(self.dir / "fold.log")
        self.store.apply([KvUpdate.put("start", b"0", rev)], WatchCursor.from_u64(rev))
        self.start_cursor = rev
        await self._start_fold()

    async def _start_fold(self) -> None:
        machine = self
        started = len(self.feeds)

        self.folds += 1
        fold_run = self.folds

        class Recorded(OrderedFeed):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs["heartbeat"] = HEARTBEAT
                feed = self
                kwargs["sleep"] = lambda delay: machine._backoff_wait(feed, delay)
                kwargs["rng"] = random.Random(0)
                super().__init__(*args, **kwargs)
                self.fold_run = fold_run
                if self._spec.deliver_policy == api.DeliverPolicy.LAST_PER_SUBJECT:
                    # The resync acknowledged: all that came before has been applied.
                    machine.relist_at.append(len(machine.applied))
                    expired = machine.feeds[-1]
                    # A restarted fold resumes from its store's cursor: what its
                    # failed predecessor handed over but never applied is not owed.
                    same_run = getattr(expired, "fold_run", None) == fold_run
                    owed = expired.handed if same_run else None
                    machine.handed_before_relist.append(owed)
                    if machine.hold_relist:
                        machine.hold_relist = False
                        machine.release.clear()
                machine.feeds.append(self)

            async def _create(self, policy: api.DeliverPolicy, start_seq: int | None) -> None:
                if self._gen == 0 or machine.create_faults == 0:  # the watch's start, or no fault
                    await super()._create(policy, start_seq)
                    return
                machine.create_faults -= 1
                if machine.answer_lost:  # the server creates it; its answer never comes
                    await super()._create(policy, start_seq)
                    self._consumer = None  # the client never learned its name
                raise Timeout(f"create consumer timed out ({INJECTED})")

        async def apply(batch: list[KvUpdate]) -> None:
            await self.release.wait()
            self.applied += [u.revision for u in batch]

        watcher_module.OrderedFeed = Recorded  # type: ignore[misc]
        self.shutdown = asyncio.Event()
        self.fold = self.loop.create_task(
            watch_applied(
                self.kv.watcher(),
                WatchScope.all(),
                apply,
                store=self.store,
                reader=self.kv.reader(),
                config=BatchConfig(window=0.002, max=20, channel_capacity=8),
                shutdown=self.shutdown,
            )
        )
        fold = self.fold
        await self._wait(lambda: len(self.feeds) > started or fold.done())

    async def _wait(self, condition: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError("the fold did not settle")
            await asyncio.sleep(0.005)

    async def _restart_failed_fold(self) -> None:
        """A fold that stopped with WatchError (the floor guard) restarts from its cursor."""
        if self.fold is not None and self.fold.done():
            error = self.fold.exception()
            assert isinstance(error, WatchError), f"the fold failed with {error!r}"
            assert INJECTED not in str(error), (
                f"a transient failure to recreate the consumer ended the fold: {error}"
            )
            await self._start_fold()

    async def _backoff_wait(self, feed: OrderedFeed, delay: float) -> None:
        """A reset's wait between attempts: no real sleep, but what would happen meanwhile
        does. A consumer the failed attempt left subscribed (the server created it, its
        answer was lost) delivers whatever the stream holds past the feed's frontier."""
        self.backoffs.append(delay)
        assert 0 < delay <= consumer_module.RESET_BACKOFF.cap_s, f"a backoff of {delay} s"
        _, last = await self.kv.stream_bounds()
        sub = feed._sub
        if sub is None or feed.frontier >= last:
            return
        deadline = time.monotonic() + 1.0
        while sub.delivered == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    # --- rules ---------------------------------------------------------------------

    async def _publish(self, key: str, value: bytes | None) -> int:
        headers = None if value is not None else {"KV-Operation": "DEL"}
        ack = await self.kv.js.publish(
            f"{self.kv.subject_prefix}{key}", value or b"", headers=headers
        )
        self.log.append((ack.seq, key, value))
        return ack.seq

    @rule(ops=st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=1, max_size=8))
    def write(self, ops: list[tuple[str, bool]]) -> None:
        async def go() -> None:
            for key, put in ops:
                await self._publish(key, b"v" if put else None)

        self.run(go())

    @rule(
        n=st.integers(min_value=50, max_value=400),
        hold=st.booleans(),
        then=st.sampled_from(["-", "reset", "evict past the reader, reset"]),
    )
    def burst(self, n: int, hold: bool, then: str) -> None:
        """More than the channels hold; with the reader held, the feed then blocks.
        ``then`` the compound faults: a reset of the blocked feed, or retention
        overtaking the reader first."""
        if hold:
            self.held = True
            self.release.clear()

        async def go() -> None:
            js, prefix = self.kv.js, self.kv.subject_prefix
            acks = [await js.publish_async(f"{prefix}b{i:03}", b"x") for i in range(n)]
            for i, ack in enumerate(acks):
                self.log.append(((await ack).seq, f"b{i:03}", b"x"))
            await self._settle()
            if then.startswith("evict"):
                await self._evict(self.feeds[-1].handed + 2)
            if then != "-":
                force_reset(self.feeds[-1])

        self.run(go())

    @precondition(lambda self: self.held)
    @rule()
    def release_reader(self) -> None:
        self.held = False
        self.release.set()

    @rule()
    def idle(self) -> None:
        self.run(self._settle())

    async def _settle(self) -> None:
        """Time passes: a held reader's feed fills its channel; a free one catches up."""
        _, last = await self.kv.stream_bounds()
        feed = self.feeds[-1]
        fold = self.fold
        assert fold is not None
        if self.held:  # the feed blocks on its full channel, or has all there is
            await self._wait(lambda: feed._out.full() or feed.frontier >= last or fold.done())
        else:
            await self._wait(lambda: (self.store.cursor.as_u64() or 0) >= last or fold.done())

    @rule()
    def reset(self) -> None:
        async def go() -> None:
            force_reset(self.feeds[-1])

        self.run(go())

    @precondition(lambda self: self.create_faults_injected)
    @rule(n=st.integers(min_value=1, max_value=3), answer_lost=st.booleans(), now=st.booleans())
    def fail_next_creates(self, n: int, answer_lost: bool, now: bool) -> None:
        """Fault injector: the next ``n`` consumer creates of resets time out, as on a
        cluster electing a leader; with ``answer_lost`` the server created each consumer
        and only its answer was lost. ``now``: a reset comes at once (else the next one
        the machine or the feed's monitors cause meets them)."""
        self.create_faults, self.answer_lost = n, answer_lost
        if now:

            async def go() -> None:
                force_reset(self.feeds[-1])
                await self._settle()

            self.run(go())

    @rule(back=st.integers(min_value=0, max_value=60), past_reader=st.booleans())
    def evict_head(self, back: int, past_reader: bool) -> None:
        """Retention: everything below ``last - back`` is gone, or (``past_reader``)
        everything up to a little past what the feed has handed over; a resync or its
        re-list may be running."""

        async def go() -> None:
            _, last = await self.kv.stream_bounds()
            below = max(1, last - back)
            if past_reader:
                below = min(below, self.feeds[-1].handed + 2)
            await self._evict(below)

        self.run(go())

    async def _evict(self, below: int) -> None:
        """Evict every revision below ``below``, the last one excepted: a purge of all
        moves the stream's last sequence past any message a fold could reach."""
        _, last = await self.kv.stream_bounds()
        below = min(below, last)
        await self.kv.js.purge_stream(self.kv.stream, seq=below)
        self.evicted_below = max(self.evicted_below, below)

    @precondition(lambda self: self.restarts < 1)
    @rule()
    def restart_server(self) -> None:
        """The server dies and comes back: the client reconnects, the consumer is gone."""
        self.restarts += 1
        nc = self.conn.client
        before = nc.stats["reconnects"]
        self.server.stop()
        self.server.start()

        async def reconnected() -> None:
            await self._wait(lambda: nc.stats["reconnects"] > before and nc.is_connected)
            await self.kv.stream_bounds()  # JetStream answers again

        self.run(reconnected())

    # --- the check, once quiet -----------------------------------------------------

    def teardown(self) -> None:
        try:
            self.release.set()
            self.held = False
            if not self.stuck:
                self.run(self._quiesce(), timeout=60)
                self._check()
        finally:
            self.loop.run_until_complete(self._close())
            self.loop.close()
            watcher_module.OrderedFeed = OrderedFeed  # type: ignore[misc]

    async def _quiesce(self) -> None:
        self.create_faults = 0  # what the machine injected is over
        while True:
            await self._restart_failed_fold()
            _, last = await self.kv.stream_bounds()
            fold = self.fold
            assert fold is not None

            def caught_up(last: int = last, fold: asyncio.Task[WatchCursor] = fold) -> bool:
                return (self.store.cursor.as_u64() or 0) >= last or fold.done()

            with contextlib.suppress(AssertionError):
                await self._wait(caught_up)
                if not fold.done():
                    return
            if not fold.done():
                raise AssertionError(
                    f"fold stuck at {self.store.cursor.as_u64()} of {last}; "
                    f"applied tail {self.applied[-5:]}"
                )

    def _check(self) -> None:
        bounds = [0, *self.relist_at, len(self.applied)]
        segments = [self.applied[a:b] for a, b in itertools.pairwise(bounds)]
        first = [r for r in segments[0] if r is not None]
        expected = list(range(self.start_cursor + 1, self.start_cursor + 1 + len(first)))
        assert first == expected, "before any resync every revision is applied once, in order"
        for seg in segments[1:]:
            revs = [r for r in seg if r is not None]
            assert revs == sorted(set(revs)), "a re-list applies each revision once, in order"
        for at, owed in zip(self.relist_at, self.handed_before_relist, strict=True):
            before = [r for r in self.applied[:at] if r is not None]
            if owed is not None:
                assert (before[-1] if before else self.start_cursor) == owed, (
                    "every revision handed over before a resync is applied before it "
                    "(every revision is applied once, in order, or resynced)"
                )
        # A key whose last write the stream still holds is as that write left it: the
        # fold applied it, live or in a re-list. One whose last write was evicted may be
        # kept with a value it had (the fold keeps what it applied, and what a resync's
        # listing said was live; docs/kv.md, "How it is tested"), or be gone.
        fold = {e.key: e.value for e in self.store.range()}
        last_write: dict[str, tuple[int, bytes | None]] = {}
        values: dict[str, set[bytes]] = {}
        for rev, key, value in sorted(self.log):
            last_write[key] = (rev, value)
            if value is not None:
                values.setdefault(key, set()).add(value)
        for key, (rev, value) in last_write.items():
            if rev >= self.evicted_below:
                assert fold.get(key) == value, f"{key}: its last write, {rev}, not in the fold"
            elif key in fold:
                assert fold[key] in values.get(key, set()), f"{key}: a value it never had"
        assert set(fold) <= set(last_write), "the fold holds keys never written"
        if not self.relist_at:  # no resync: every revision applied, the fold is their replay
            replay = {k: v for k, (_, v) in last_write.items() if v is not None}
            assert fold == replay, "without a resync the fold is every write replayed"

    async def _close(self) -> None:
        self.shutdown.set()
        if self.fold is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.fold, 10)
        with contextlib.suppress(BaseException):
            await self.conn.shutdown()
        self.store.close()


class FeedResetsOvertaken(FeedResets):
    """The same machine, with a rule that makes retention overtake a re-list. Its own
    class: the rule writes megabytes, so it runs in a few examples of its own, without
    failing creates (they made its examples slower, and are the other class's part)."""

    create_faults_injected = False

    @precondition(lambda self: self.overtaken < 1)
    @rule(n=st.integers(min_value=140, max_value=200))
    def relist_overtaken(self, n: int) -> None:
        """Retention overtakes a resync's re-list: a resync is forced (the reader held,
        evict past it, reset), ``n`` big values are written, the reader is held again as
        the re-list starts, the server stops at its flow-control window, and everything
        but the last revision is evicted before the reader goes on. The re-list owes
        messages the stream no longer holds; it must not wait for them. Once per run:
        it writes megabytes."""
        self.overtaken += 1
        self.held = True
        self.release.clear()
        fold = self.fold
        assert fold is not None

        async def go() -> None:
            js, prefix = self.kv.js, self.kv.subject_prefix
            for i in range(60):
                await self._publish(f"s{i:02}", b"s")
            await self._settle()
            await self._evict(self.feeds[-1].handed + 2)
            before = len(self.feeds)
            force_reset(self.feeds[-1])
            acks = [await js.publish_async(f"{prefix}g{i:03}", BIG) for i in range(n)]
            for i, ack in enumerate(acks):
                self.log.append(((await ack).seq, f"g{i:03}", BIG))
            big = self.log[-1][0]
            self.hold_relist = True
            self.release.set()  # the resync's deletes go through, then the re-list starts

            def relisting() -> bool:
                return len(self.feeds) > before or fold.done()

            await self._wait(lambda: relisting() or (self.store.cursor.as_u64() or 0) >= big)
            if fold.done() or not relisting():  # failed, or the reset found nothing evicted
                return
            feed, arrived = self.feeds[-1], -1
            await self._wait(lambda: feed._sub is not None or fold.done())
            while feed._sub is not None and feed._sub.delivered != arrived:
                arrived = feed._sub.delivered  # until the server stops at its window
                await asyncio.sleep(0.05)
            _, last = await self.kv.stream_bounds()
            await self._evict(last)
            self.release.set()
            try:
                await self._wait(
                    lambda: (self.store.cursor.as_u64() or 0) >= last or fold.done(), timeout=3
                )
            except AssertionError:
                self.stuck = True  # teardown need not wait for it again
                raise AssertionError(
                    f"fold stuck at {self.store.cursor.as_u64()} of {last} in a re-list"
                ) from None

        try:
            self.run(go())
        finally:  # the reader goes on, and no later re-list is held
            self.hold_relist, self.held = False, False
            self.release.set()


def _machine(server: EmbeddedNats, base: type[FeedResets] = FeedResets) -> type[FeedResets]:
    return type("FeedResetsOn", (base,), {"server": server})


MACHINE_SETTINGS = settings(
    max_examples=12,
    stateful_step_count=14,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


OVERTAKEN_SETTINGS = settings(MACHINE_SETTINGS, max_examples=4, stateful_step_count=8)


def test_every_revision_is_applied_once_in_order_or_resynced(
    restartable_nats: EmbeddedNats, fixed_constants: None
) -> None:
    run_state_machine_as_test(_machine(restartable_nats), settings=MACHINE_SETTINGS)


# --- mutants: each broken, the machine fails -----------------------------------------


def _resume_after_delivered(delivered: int, handed: int) -> int:
    return delivered


async def _recreate_dropping_the_channel(self: OrderedFeed) -> None:
    while not self._out.empty():  # the chunk handed over but not yet read, thrown away
        self._out.get_nowait()
    await _RECREATE(self)


_RECREATE = OrderedFeed._recreate


@pytest.mark.parametrize("mutant", ["resume_after_delivered", "reset_drops_the_channel"])
def test_a_broken_reset_is_caught(
    mutant: str,
    restartable_nats: EmbeddedNats,
    monkeypatch: pytest.MonkeyPatch,
    fixed_constants: None,
) -> None:
    if mutant == "resume_after_delivered":
        monkeypatch.setattr(consumer_module, "reset_resume_point", _resume_after_delivered)
    else:
        monkeypatch.setattr(OrderedFeed, "_recreate", _recreate_dropping_the_channel)
    with pytest.raises(AssertionError, match="every revision is applied once, in order"):
        run_state_machine_as_test(
            _machine(restartable_nats),
            settings=settings(MACHINE_SETTINGS, max_examples=40),
        )


def test_a_relist_overtaken_by_retention_neither_stalls_nor_skips(
    restartable_nats: EmbeddedNats, fixed_constants: None
) -> None:
    run_state_machine_as_test(
        _machine(restartable_nats, FeedResetsOvertaken), settings=OVERTAKEN_SETTINGS
    )


def test_a_listing_waiting_on_removed_messages_is_caught(
    restartable_nats: EmbeddedNats, monkeypatch: pytest.MonkeyPatch, fixed_constants: None
) -> None:
    """Mutant: the feed ignores an idle heartbeat its last-per-subject listing still owes
    messages at; the re-list crawls on, one removed message per heartbeat."""
    monkeypatch.setattr(consumer_module, "listing_stuck", lambda listed, listing: False)
    with pytest.raises(AssertionError, match=r"fold stuck at .* in a re-list"):
        run_state_machine_as_test(
            _machine(restartable_nats, FeedResetsOvertaken), settings=OVERTAKEN_SETTINGS
        )


async def _recreate_retrying_only_the_create(self: OrderedFeed) -> None:
    """Mutant: the naive retry. The resume point is taken once, and only the consumer's
    create is tried again; a failed attempt's consumer (which the server may have
    created) is not abandoned, so what it delivers during the backoff is taken, and
    then delivered again by the next attempt's consumer."""
    try:
        async with self._creating:
            handing = self._handing
            if handing is not None:
                handing.cancel()
                await asyncio.gather(handing, return_exceptions=True)
            self._chunk = []
            await self._drop_consumer()
            after = self.frontier = reset_resume_point(self.frontier, self.handed)
            if after:
                await self._check_window(after)
            attempt = 0
            while True:
                attempt += 1
                try:
                    if after == 0:
                        await self._create(self._spec.deliver_policy, self._spec.start_seq)
                    else:
                        await self._create(api.DeliverPolicy.BY_START_SEQUENCE, after + 1)
                    break
                except Exception as e:
                    if not transient(e):
                        raise
                    await self._sleep(self._reset_backoff.delay(attempt, self._rng))
            self._last_activity = time.monotonic()
    except CursorExpired as e:
        await self.fail(e)
    except Exception as e:
        await self.fail(WatchError(f"watch consumer lost and could not be recreated: {e}"))
    finally:
        self._resetting = False


@pytest.mark.parametrize(
    ("mutant", "caught"),
    [
        ("gives_up_on_a_transient_failure", "a transient failure to recreate the consumer"),
        ("retries_only_the_create", "once, in order"),
    ],
)
def test_a_broken_retry_of_a_reset_is_caught(
    mutant: str,
    caught: str,
    restartable_nats: EmbeddedNats,
    monkeypatch: pytest.MonkeyPatch,
    fixed_constants: None,
) -> None:
    if mutant == "gives_up_on_a_transient_failure":
        monkeypatch.setattr(consumer_module, "transient", lambda error: False)
    else:
        monkeypatch.setattr(OrderedFeed, "_recreate", _recreate_retrying_only_the_create)
    with pytest.raises(AssertionError, match=caught):
        run_state_machine_as_test(
            _machine(restartable_nats),
            settings=settings(MACHINE_SETTINGS, max_examples=40),
        )
