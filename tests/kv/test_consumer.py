"""The delivery callback of the hand-built ordered consumer, driven message by message.

The subscription is a stand-in (``pending_msgs`` set by the test): the order in
which the server's control messages land behind data in the client's queue is
a race a real server cannot be made to reproduce on demand.
"""

from __future__ import annotations

import asyncio

import nats.errors
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg
from nats.js import api

from waymark.kv import KvUpdate, Op, VersionToken
from waymark.kv.consumer import ConsumerSpec, OrderedFeed, update_op


class _Sub:
    pending_msgs = 0


class _JetStream:
    _nc = None


def _feed(queue: asyncio.Queue[object]) -> tuple[OrderedFeed, _Sub]:
    spec = ConsumerSpec("KV_b", "$KV.b.", ("$KV.b.>",), api.DeliverPolicy.ALL)
    feed = OrderedFeed(_JetStream(), spec, queue, chunk_max=100, timeout=1)  # type: ignore[arg-type]
    sub = _Sub()
    feed._sub = sub  # type: ignore[assignment]
    return feed, sub


def _data(seq: int, key: str, value: bytes, headers: dict[str, str] | None = None) -> Msg:
    reply = f"$JS.ACK.KV_b.c.1.{seq}.{seq}.1700000000000000000.0"
    return Msg(None, subject=f"$KV.b.{key}", reply=reply, data=value, headers=headers)  # type: ignore[arg-type]


async def test_updates_are_chunked_until_nothing_is_pending() -> None:
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
    feed, sub = _feed(queue)
    sub.pending_msgs = 2
    await feed._on_msg(feed._gen, _data(1, "a", b"1"))
    await feed._on_msg(feed._gen, _data(2, "b", b"", {"KV-Operation": "DEL"}))
    assert queue.empty()
    sub.pending_msgs = 0
    await feed._on_msg(feed._gen, _data(3, "c", b""))  # a CAS tombstone stays a put here
    assert queue.get_nowait() == [
        KvUpdate.put("a", b"1", 1),
        KvUpdate.delete("b", 2),
        KvUpdate(Op.PUT, "c", b"", VersionToken.from_u64(3)),
    ]
    assert feed.frontier == 3 and feed.delivered == 3


async def test_a_heartbeat_behind_the_last_update_hands_its_chunk_over() -> None:
    """Without this the burst's last chunk waited for the next update, maybe forever."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
    feed, sub = _feed(queue)
    sub.pending_msgs = 1  # the heartbeat is already queued behind this update
    await feed._on_msg(feed._gen, _data(1, "a", b"1"))
    assert queue.empty()
    sub.pending_msgs = 0
    heartbeat = Msg(
        None,  # type: ignore[arg-type]
        subject="inbox",
        reply="",
        data=b"",
        headers={"Status": "100", "Description": "Idle Heartbeat", "Nats-Last-Consumer": "1"},
    )
    await feed._on_msg(feed._gen, heartbeat)
    assert queue.get_nowait() == [KvUpdate.put("a", b"1", 1)]


@settings(max_examples=50, deadline=None)
@given(reason=st.text(min_size=1, max_size=20))
async def test_every_marker_is_delivered_as_a_removal(reason: str) -> None:
    """Whatever its reason, known or not, a marker is handed over (a listing counts
    it) as a removal with no value, never skipped or read as a put."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
    feed, _ = _feed(queue)
    await feed._on_msg(feed._gen, _data(1, "k", b"", {"Nats-Marker-Reason": reason}))
    [update] = queue.get_nowait()  # type: ignore[misc]
    assert update.op in (Op.DELETE, Op.PURGE) and update.value == b"" and feed.delivered == 1
    assert update_op({"Nats-Marker-Reason": reason}) is update.op


class _Reconnecting:
    """Fault injector: a client reconnecting with its outbound buffer full."""

    def __init__(self) -> None:
        self.full = True
        self.sent: list[str] = []

    async def publish(self, subject: str) -> None:
        if self.full:
            raise nats.errors.OutboundBufferLimitError
        self.sent.append(subject)


async def test_a_flow_control_answer_lost_to_a_reconnect_is_given_again() -> None:
    """A failed delivery fails the feed, but a flow-control answer the reconnecting client
    cannot buffer is no failure: the server, still stalled, asks again in its heartbeat."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
    feed, _ = _feed(queue)
    nc = _Reconnecting()
    feed._nc = nc  # type: ignore[assignment]
    control = {"Status": "100", "Description": "FlowControl Request"}
    await feed._on_msg(feed._gen, Msg(None, subject="i", reply="$FC.1", data=b"", headers=control))  # type: ignore[arg-type]
    nc.full = False
    heartbeat = {
        "Status": "100",
        "Description": "Idle Heartbeat",
        "Nats-Last-Consumer": "0",
        "Nats-Consumer-Stalled": "$FC.1",
    }
    await feed._on_msg(feed._gen, Msg(None, subject="i", reply="", data=b"", headers=heartbeat))  # type: ignore[arg-type]
    assert nc.sent == ["$FC.1"]
    assert queue.empty() and not feed._stopped
