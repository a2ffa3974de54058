"""SSE watch over HTTP: framing, cursors, Last-Event-ID resume, tombstones, node filter,
heartbeats, wake-up on append, recreate, slow consumers."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx


@dataclass
class Event:
    event: str
    id: str
    data: dict


@dataclass
class Stream:
    lines: Iterator[str]
    comments: list[str] = field(default_factory=list)

    def next(self) -> Event:
        fields: dict[str, str] = {}
        for line in self.lines:
            if line.startswith(":"):
                self.comments.append(line)
            elif line:
                name, _, value = line.partition(": ")
                fields[name] = value
            elif fields:
                return Event(fields["event"], fields["id"], json.loads(fields["data"]))
        raise AssertionError("stream ended")

    def take(self, n: int) -> list[Event]:
        return [self.next() for _ in range(n)]


@contextmanager
def watch(http: httpx.Client, topic: str, headers: dict | None = None,
          **params: object) -> Iterator[Stream]:  # fmt: skip
    timeout = httpx.Timeout(10, read=5)
    with http.stream("GET", f"/v0/topics/{topic}/watch", params=params, headers=headers,
                     timeout=timeout) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["cache-control"] == "no-cache"
        yield Stream(response.iter_lines())


def test_records_stream_with_epoch_seq_ids(http, api, topic) -> None:
    api.append(topic, {"data": "a", "tag": "t"}, {"data": {"b": 1}, "node": "n"})
    epoch = api.state(topic)["epoch"]
    with watch(http, topic) as stream:
        first, second = stream.take(2)
    assert (first.event, first.id) == ("record", f"{epoch}:1")
    assert first.data == {"$seq": 1, "$ts": first.data["$ts"], "$tag": "t", "data": "a"}
    assert (second.id, second.data["$node"], second.data["data"]) == (f"{epoch}:2", "n", {"b": 1})


def test_from_seq_is_exclusive(http, api, topic) -> None:
    api.write(topic, *range(5))
    with watch(http, topic, from_seq=3) as stream:
        assert [e.data["$seq"] for e in stream.take(2)] == [4, 5]


def test_live_appends_wake_the_stream(http, api, topic) -> None:
    api.write(topic, 0)
    with watch(http, topic, from_seq=1) as stream:
        # The stream took its change future before its head was sent: a commit from
        # now on wakes it, so no delay is needed to make this write a live one.
        api.write(topic, "live")
        event = stream.next()
    assert event.data["data"] == "live"


def test_resume_from_last_event_id(http, api, topic) -> None:
    api.write(topic, *range(6))
    with watch(http, topic) as stream:
        cursor = stream.take(3)[-1].id
    with watch(http, topic, {"last-event-id": cursor}) as stream:
        assert [e.data["$seq"] for e in stream.take(3)] == [4, 5, 6]


def test_last_event_id_wins_over_from_seq_and_may_be_a_plain_seq(http, api, topic) -> None:
    api.write(topic, *range(6))
    with watch(http, topic, {"last-event-id": "4"}, from_seq=1) as stream:
        assert stream.next().data["$seq"] == 5


def test_bad_cursors_are_400(http, api, topic) -> None:
    api.write(topic, 1)
    for bad in ("x", "1:x", "-1", "1:2:3", ":"):
        api.error(http.get(f"/v0/topics/{topic}/watch", headers={"last-event-id": bad}), 400,
                  "invalid_request")  # fmt: skip
    api.error(http.get(f"/v0/topics/{topic}/watch", params={"from_seq": "abc"}), 400,
              "invalid_request")  # fmt: skip


def test_watching_a_missing_topic_is_404(http, api, topic) -> None:
    api.error(http.get(f"/v0/topics/{topic}/watch"), 404, "topic_not_found")


def test_cap_tombstone_event_comes_first_and_its_id_resumes_after_the_gap(http, api, topic) -> None:
    api.put(topic, 201, cap_records=2)
    for i in range(5):
        api.write(topic, i)
    epoch = api.state(topic)["epoch"]
    with watch(http, topic) as stream:
        tomb, *records = stream.take(3)
    assert tomb.event == "tombstone"
    assert tomb.data["$type"] == "tombstone" and tomb.data["reason"] == "cap"
    assert (tomb.data["gap_from"], tomb.data["gap_to"], tomb.data["$seq"]) == (1, 3, 4)
    assert tomb.id == f"{epoch}:3"  # earliest_seq - 1: the post-gap cursor
    assert [r.data["$seq"] for r in records] == [4, 5]
    # Resuming from the tombstone's id neither repeats the gap nor skips seq 4.
    with watch(http, topic, {"last-event-id": tomb.id}) as stream:
        event = stream.next()
    assert (event.event, event.data["$seq"]) == ("record", 4)


def test_a_crash_hole_mid_topic_has_an_id_that_resumes_after_it(spawn_server, tmp_path) -> None:
    # A disk topic's first append syncs a seq ceiling above it: after a SIGKILL the seqs
    # past the records up to that ceiling read as a `lost` gap in mid-topic (the records
    # before it stay, so earliest_seq is 1, far below the gap). The idle trim would lower
    # the ceiling to the head 50-100 ms after the append (no gap at all) if the kill came
    # later than that, as it can on a loaded machine: it is kept off here.
    server = spawn_server(tmp_path, "--ceiling-trim-s", "3600")
    with httpx.Client(base_url=server.url, timeout=10) as http:
        http.post("/v0/topics/t/records", json={"records": [{"data": i} for i in range(3)]})
    server.stop(signal.SIGKILL)
    server = spawn_server(tmp_path)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        epoch = http.get("/v0/topics/t").json()["epoch"]
        with watch(http, "t") as stream:
            *records, tomb = stream.take(4)
        assert [r.data["$seq"] for r in records] == [1, 2, 3]
        assert (tomb.event, tomb.data["reason"], tomb.data["gap_from"]) == ("tombstone", "lost", 4)
        gap_to = tomb.data["gap_to"]
        assert tomb.data["earliest_seq"] == 1 and tomb.data["$seq"] == gap_to + 1
        assert tomb.id == f"{epoch}:{gap_to}"  # the cursor right after the gap
        # diff agrees: its cursor goes on from the end of the gap.
        page = http.post("/v0/topics/t/diff", json={"from_seq": 3}).json()
        assert page["tombstone"] == tomb.data and page["next_from_seq"] == gap_to
        written = http.post("/v0/topics/t/records", json={"records": [{"data": "new"}]})
        (new,) = written.json()["seqs"]
        # A reconnect from the tombstone's id replays nothing and reports no gap again.
        with watch(http, "t", {"last-event-id": tomb.id}) as stream:
            event = stream.next()
        assert (event.event, event.data["$seq"]) == ("record", new)
        page = http.post("/v0/topics/t/diff", json={"from_seq": 3}).json()
        assert [r["$seq"] for r in page["records"]] == [new] and page["next_from_seq"] == new


def test_deleted_and_node_filtered_records_are_skipped_silently(http, api, topic) -> None:
    api.append(topic, {"data": 0, "tag": "gone"}, {"data": 1, "node": "me"}, {"data": 2},
               {"data": 3, "node": "x"})  # fmt: skip
    api.delete(topic, match="gone")
    with watch(http, topic, node="me") as stream:
        events = stream.take(2)
    assert [(e.event, e.data["$seq"]) for e in events] == [("record", 3), ("record", 4)]


def test_node_filter_takes_several_ids(http, api, topic) -> None:
    api.append(topic, {"data": 1, "node": "a"}, {"data": 2, "node": "b"}, {"data": 3})
    with watch(http, topic, node=["a", "b"]) as stream:
        assert stream.next().data["$seq"] == 3


def test_idle_streams_get_heartbeat_comments(http, api, topic) -> None:
    api.write(topic, 1)
    with watch(http, topic, from_seq=1) as stream:
        # The test server beats every 0.2 s: take two beats, then the stream still works.
        beats: list[str] = []
        for line in stream.lines:
            if line:
                beats.append(line)
            if len(beats) == 2:
                break
        api.write(topic, "after")
        event = stream.next()
    assert event.data["data"] == "after"
    assert beats == [": heartbeat"] * 2


def test_recreate_while_watching_yields_a_recreated_tombstone(http, api, topic) -> None:
    api.write(topic, *range(3))
    with watch(http, topic) as stream:
        old = stream.take(3)
        http.delete(f"/v0/topics/{topic}")
        api.write(topic, "new")
        tomb, record = stream.take(2)
    new_epoch = api.state(topic)["epoch"]
    assert old[-1].id.split(":")[0] != str(new_epoch)
    assert (tomb.event, tomb.data["reason"]) == ("tombstone", "recreated")
    assert tomb.id == f"{new_epoch}:0"
    assert (record.id, record.data["data"]) == (f"{new_epoch}:1", "new")


def test_resuming_with_a_stale_epoch_reports_the_recreate(http, api, topic) -> None:
    api.write(topic, *range(3))
    stale = f"{api.state(topic)['epoch']}:1"
    http.delete(f"/v0/topics/{topic}")
    api.write(topic, *range(5))
    with watch(http, topic, {"last-event-id": stale}) as stream:
        tomb = stream.next()
        assert tomb.data["reason"] == "recreated"
        assert stream.next().data["$seq"] == 1


def test_data_with_line_breaks_stays_one_event(http, api, topic) -> None:
    body = b'{"records": [{"data": {"a":\n [1,\r\n 2]}}, {"data": "x"}]}'
    assert (
        http.post(
            f"/v0/topics/{topic}/records",
            content=body,
            headers={"content-type": "application/json"},
        ).status_code
        == 200
    )
    with watch(http, topic) as stream:
        first, second = stream.take(2)
    assert first.data["data"] == {"a": [1, 2]} and second.data["data"] == "x"


def test_a_slow_consumer_gets_every_record_in_order(http, api, topic) -> None:
    # 20 000 records of ~1 KiB: far more than socket buffers hold, so the stream must
    # wait on flow control while the consumer sleeps, then deliver everything.
    payload = "p" * 1000
    for _ in range(4):
        api.append(topic, *[{"data": payload}] * 5000)
    with watch(http, topic) as stream:
        first = stream.next()
        time.sleep(1.0)
        rest = stream.take(19_999)
    assert [e.data["$seq"] for e in [first, *rest]] == list(range(1, 20_001))


def test_a_consumer_left_behind_by_the_cap_gets_a_tombstone(http, api, topic) -> None:
    api.put(topic, 201, cap_records=1000)
    api.append(topic, *[{"data": "x" * 2000}] * 1000)
    # 20 MB more than the reader takes: more than loopback socket buffers hold (a few MB
    # each way), so the server cannot push everything before the cap evicts it.
    batches = 10
    with watch(http, topic) as stream:
        assert stream.next().data["$seq"] == 1
        # While this reader stalls, the cap evicts everything it has not been sent.
        for _ in range(batches):
            api.append(topic, *[{"data": "y" * 2000}] * 1000)
        events = []
        while not events or events[-1].event != "tombstone":
            events.append(stream.next())
        tomb = events[-1]
        assert tomb.data["reason"] == "cap"
        assert tomb.data["gap_to"] == batches * 1000
        assert stream.next().data["$seq"] == batches * 1000 + 1
    seen = [e.data["$seq"] for e in events[:-1]]
    assert seen == list(range(2, 2 + len(seen)))  # in order, no duplicates, before the gap
    assert seen[-1] < tomb.data["gap_from"]


def test_disconnected_streams_are_released(http, api, topic) -> None:
    api.write(topic, 1)

    def streams() -> float:
        for line in http.get("/metrics").text.splitlines():
            if line.startswith("waymark_sse_streams "):
                return float(line.split()[1])
        raise AssertionError("no waymark_sse_streams")

    base = streams()
    with watch(http, topic) as stream:
        stream.next()
        assert streams() == base + 1
    deadline = time.monotonic() + 5
    while streams() != base:
        assert time.monotonic() < deadline, "the server kept a closed stream"
        time.sleep(0.05)


def test_a_node_filtered_watch_on_a_busy_topic_still_gets_heartbeats(http, api, topic) -> None:
    # The filtered node's own commits wake the stream but send it nothing: silence is what
    # counts, so a proxy still sees a heartbeat every 0.2 s (the test server's interval).
    api.write(topic, 1)
    beat = threading.Event()

    def busy() -> None:
        body = {"records": [{"data": 0, "node": "me"}]}
        with httpx.Client(base_url=http.base_url) as other:
            while not beat.is_set():
                other.post(f"/v0/topics/{topic}/records", json=body).raise_for_status()

    writer = threading.Thread(target=busy)
    with watch(http, topic, from_seq=1, node="me") as stream:
        writer.start()
        try:
            line = next(line for line in stream.lines if line)
        finally:
            beat.set()
            writer.join()
        assert line == ": heartbeat"
        api.write(topic, "other")
        assert stream.next().data["data"] == "other"


def test_woken_streams_take_turns_and_other_work_runs_between() -> None:
    """One commit wakes every stream of its topic at once; 2,000 of them reading and
    sending in one turn of the event loop held every other request (a health check
    p99 of ~1 s). They now take turns, ``per_turn`` a turn, and what else is ready
    (a request's I/O) runs between the turns; a few streams go at once."""
    import asyncio

    from waymark.log import Engine
    from waymark.server.delivery import Deliveries
    from waymark.server.notify import Notifier

    async def run() -> list[object]:
        notifier = Notifier(Deliveries(Engine()), per_turn=2)
        order: list[object] = []

        async def stream(i: int) -> None:
            await notifier.turn()
            order.append(i)

        async def request() -> None:  # ready in the loop's next turn, as I/O would be
            await asyncio.sleep(0)
            order.append("request")

        await asyncio.gather(*(stream(i) for i in range(6)), request())
        await stream(6)  # alone: its turn at once
        return order

    assert asyncio.run(run()) == [0, 1, "request", 2, 3, 4, 5, 6]

    async def waiting() -> list[int]:
        """Streams waiting for a change are not all woken by it in one turn either."""
        notifier = Notifier(Deliveries(Engine()), per_turn=2)
        loop = asyncio.get_running_loop()
        turns = [0]

        def tick() -> None:  # counts the turns of the loop
            turns[0] += 1
            loop.call_soon(tick)

        tick()
        never = loop.create_future()
        woken: list[int] = []

        async def stream() -> None:
            changed = notifier.next_change("t")
            assert await notifier.wait_turn("t", 30, never, changed)
            woken.append(turns[0])

        streams = [asyncio.create_task(stream()) for _ in range(6)]
        while len(notifier._streams.get("t", ())) < 6:  # noqa: SLF001 -- all waiting
            await asyncio.sleep(0)
        notifier.notify("t")
        await asyncio.gather(*streams)
        return woken

    woken = asyncio.run(waiting())
    assert len(woken) == 6 and max(woken.count(turn) for turn in woken) == 2, woken
