"""Ticket lifecycle: misuse errors, dropped tickets, stop and drain."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings

import pytest

from waymark.checkpoint import (
    Committed,
    DrainIncomplete,
    DroppedTicketWarning,
    Outcome,
    QueuedTicket,
    SendingTicket,
    TicketSpentError,
    Tracker,
    TrackerStopped,
)


def test_out_of_order_acks_commit_only_the_resolved_prefix() -> None:
    tracker: Tracker[int] = Tracker()
    first, second, third = (tracker.create_batch("s", cp).begin_send() for cp in (10, 20, 30))
    receipt = third.ack()
    assert receipt.outcome is Outcome.ACKED and not receipt.advanced
    assert tracker.committed("s") is None
    assert tracker.view("s").pending_acks == {3: 30}
    assert second.reject().outcome is Outcome.REJECTED
    assert tracker.committed("s") is None
    assert tracker.version == 0
    assert first.ack().advanced
    assert tracker.committed("s") == Committed(3, 30)
    assert tracker.version == 1, "one advance, however many batches it consumed"
    assert tracker.view("s").rejected == 1


def test_failed_batch_freezes_the_checkpoint_until_its_retry_resolves() -> None:
    tracker: Tracker[int] = Tracker()
    first = tracker.create_batch("s", 10).begin_send()
    tracker.create_batch("s", 20).begin_send().ack()
    retry = first.fail()
    assert isinstance(retry, QueuedTicket) and retry.attempts == 1
    assert tracker.committed("s") is None
    assert tracker.view("s").queued == {1: 10}
    again = retry.begin_send()
    assert again.attempts == 1
    again.ack()
    assert tracker.committed("s") == Committed(2, 20)


def test_unsent_batch_holds_the_checkpoint() -> None:
    tracker: Tracker[int] = Tracker()
    unsent = tracker.create_batch("s", 10)
    tracker.create_batch("s", 20).begin_send().ack()
    assert tracker.committed("s") is None
    unsent.begin_send().ack()
    assert tracker.committed("s") == Committed(2, 20)


def test_sources_are_independent() -> None:
    tracker: Tracker[int] = Tracker()
    a = tracker.create_batch("a", 1).begin_send()
    b = tracker.create_batch("b", 7).begin_send()
    assert a.batch_id == b.batch_id == 1
    b.ack()
    assert tracker.committed("b") == Committed(1, 7)
    assert tracker.committed("a") is None
    a.ack()


def test_ticket_types_are_distinct() -> None:
    tracker: Tracker[int] = Tracker()
    queued = tracker.create_batch("s", 1)
    assert not hasattr(queued, "ack") and not hasattr(queued, "fail")
    sending = queued.begin_send()
    assert isinstance(sending, SendingTicket)
    assert not hasattr(sending, "begin_send") and not hasattr(sending, "abandon")
    sending.ack()


@pytest.mark.parametrize("first", ["ack", "reject", "fail"])
@pytest.mark.parametrize("second", ["ack", "reject", "fail"])
def test_a_resolved_sending_ticket_is_unusable(first: str, second: str) -> None:
    tracker: Tracker[int] = Tracker()
    sending = tracker.create_batch("s", 1).begin_send()
    result = getattr(sending, first)()
    with pytest.raises(TicketSpentError, match=rf"cannot {second} batch 1 .* spent by {first}"):
        getattr(sending, second)()
    if isinstance(result, QueuedTicket):
        result.abandon()
    assert tracker.drained


def test_a_sent_queued_ticket_is_unusable() -> None:
    tracker: Tracker[int] = Tracker()
    queued = tracker.create_batch("s", 1)
    sending = queued.begin_send()
    with pytest.raises(TicketSpentError, match="spent by begin_send"):
        queued.begin_send()
    with pytest.raises(TicketSpentError):
        queued.abandon()
    sending.ack()
    assert tracker.committed("s") == Committed(1, 1)


def test_abandoned_batch_is_never_committed_past() -> None:
    tracker: Tracker[int] = Tracker()
    tracker.create_batch("s", 10).begin_send().fail().abandon()
    tracker.create_batch("s", 20).begin_send().ack()
    assert tracker.drained
    assert tracker.committed("s") is None
    assert tracker.view("s").abandoned == 1
    assert tracker.view("s").pending_acks == {2: 20}


def test_dropped_sending_ticket_warns_counts_and_releases_the_batch() -> None:
    tracker: Tracker[int] = Tracker()
    tracker.create_batch("s", 10).begin_send().ack()
    sending = tracker.create_batch("s", 20).begin_send()
    later = tracker.create_batch("s", 30).begin_send()
    with pytest.warns(DroppedTicketWarning, match="batch 2 of source 's'.*1 dropped so far"):
        del sending
    assert tracker.dropped_tickets == 1
    later.ack()
    # The drop is visible and safe: the checkpoint stays below the dropped batch,
    # and drain can still complete.
    assert tracker.committed("s") == Committed(1, 10)
    assert tracker.drained
    assert tracker.view("s").abandoned == 1


def test_dropped_tickets_in_a_cycle_are_found_by_the_collector() -> None:
    tracker: Tracker[int] = Tracker()
    holder: list[object] = [tracker.create_batch("s", 1).begin_send()]
    holder.append(holder)
    del holder
    with pytest.warns(DroppedTicketWarning):
        gc.collect()
    assert tracker.dropped_tickets == 1
    assert tracker.drained


def test_mass_drop_warns_logarithmically_but_counts_all() -> None:
    tracker: Tracker[int] = Tracker()
    tickets = [tracker.create_batch("s", n).begin_send() for n in range(100)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DroppedTicketWarning)
        tickets.clear()
    assert tracker.dropped_tickets == 100
    assert len(caught) == 7  # the 1st, 2nd, 4th, ... 64th drop
    assert tracker.drained


def test_stop_requires_every_batch_resolved() -> None:
    tracker: Tracker[int] = Tracker()
    sending = tracker.create_batch("s", 1).begin_send()
    queued = tracker.create_batch("s", 2)
    with pytest.raises(DrainIncomplete, match="'s': 1 queued, 1 in flight"):
        tracker.stop()
    assert tracker.stopping and not tracker.stopped
    with pytest.raises(TrackerStopped):
        tracker.create_batch("s", 3)
    sending.fail().begin_send().ack()
    queued.begin_send().reject()
    assert tracker.stop() == {"s": Committed(2, 2)}
    assert tracker.stopped


async def test_drain_waits_for_the_last_ack() -> None:
    tracker: Tracker[int] = Tracker()
    tickets = [tracker.create_batch("s", n).begin_send() for n in (1, 2, 3)]
    drain = asyncio.ensure_future(tracker.drain())
    await asyncio.sleep(0)
    assert not drain.done() and tracker.stopping
    for ticket in reversed(tickets):
        ticket.ack()
        await asyncio.sleep(0)
    assert await asyncio.wait_for(drain, 1) == {"s": Committed(3, 3)}
    assert tracker.stopped


async def test_drain_wakes_on_an_ack_from_another_thread() -> None:
    tracker: Tracker[int] = Tracker()
    ticket = tracker.create_batch("s", 1).begin_send()
    drain = asyncio.ensure_future(tracker.drain())
    await asyncio.sleep(0)
    worker = threading.Thread(target=ticket.ack)
    worker.start()
    assert await asyncio.wait_for(drain, 1) == {"s": Committed(1, 1)}
    worker.join()


async def test_drain_completes_when_the_last_ticket_is_dropped() -> None:
    tracker: Tracker[int] = Tracker()
    box = [tracker.create_batch("s", 1).begin_send()]
    drain = asyncio.ensure_future(tracker.drain())
    await asyncio.sleep(0)
    with pytest.warns(DroppedTicketWarning):
        box.clear()
    assert await asyncio.wait_for(drain, 1) == {}
