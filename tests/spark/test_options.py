"""The source and sink options named like Spark's Kafka connector's, on a real local
Spark session (docs/spark.md, "Options", "Batch queries")."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest


def test_a_stream_takes_kafkas_option_names_and_refuses_a_typo(
    spark: Any, server: Any, topics: Any, run: Any, topic: str
) -> None:
    """``subscribePattern`` reads the topics whose whole name matches (not a third that
    only contains the prefix), ``maxOffsetsPerTrigger`` caps every micro-batch (it was
    ignored as unknown: one batch of everything), and a misspelt option fails the
    query naming the option meant."""
    a, b, other = f"{topic}-a", f"{topic}-b", f"x-{topic}-c"
    topics.write(a, list(range(7)))
    topics.write(b, list(range(100, 106)))
    topics.write(other, ["not read"])
    name = f"q_{uuid.uuid4().hex[:8]}"
    stream = (
        spark.readStream.format("waymark").option("URL", server.url)
        .option("subscribePattern", f"{topic}-[ab]").option("maxOffsetsPerTrigger", 5).load()
    )  # fmt: skip
    query = run(stream.select("topic", "data").writeStream.format("memory").queryName(name))
    assert [p["numInputRows"] for p in query.recentProgress] == [5, 5, 3]
    rows = spark.table(name).collect()
    assert sorted((r.topic, int(r.data)) for r in rows) == sorted(
        [(a, i) for i in range(7)] + [(b, i) for i in range(100, 106)]
    )
    typo = (
        spark.readStream.format("waymark").option("url", server.url).option("subscribe", a)
        .option("maxOffsetPerTrigger", 5).load().writeStream.format("noop")
    )  # fmt: skip
    with pytest.raises(Exception, match="did you mean 'maxOffsetsPerTrigger'"):
        run(typo)


def test_a_batch_query_reads_between_offsets_and_follows_fail_on_data_loss(
    spark: Any, server: Any, http: Any, topics: Any, topic: str
) -> None:
    """``spark.read``: earliest to latest by default; seqs in the JSON as Kafka's offsets
    (start: the first read, end: the first not read); a start below what the topic
    still holds is a loss, failing the query naming it, or with
    ``failOnDataLoss=false`` one gaps row and the rest read."""
    topics.write(topic, list(range(1, 11)))  # seqs 1..10 hold 1..10

    def read(**options: Any) -> list[int]:
        reader = spark.read.format("waymark").option("url", server.url)
        for key, value in {"subscribe": topic, **options}.items():
            reader = reader.option(key, value)
        return sorted(int(r.data) for r in reader.load().select("data").collect())

    assert read() == list(range(1, 11))
    between = read(startingOffsets=f'{{"{topic}": 3}}', endingOffsets=f'{{"{topic}": 8}}')
    assert between == [3, 4, 5, 6, 7]
    epoch = http.get(f"/v0/topics/{topic}").json()["epoch"]
    exact = f'{{"{topic}": {{"epoch": {epoch}, "seq": 4}}}}'  # as Spark's offset log has it
    assert read(endingOffsets=exact) == [1, 2, 3, 4]
    with pytest.raises(Exception, match=r"'latest' .* not valid for a batch query"):
        read(startingOffsets="latest")

    capped = f"{topic}-cap"
    http.put(f"/v0/topics/{capped}", json={"cap_records": 5}).raise_for_status()
    topics.write(capped, list(range(1, 13)))  # cap 5: seqs 1..7 are gone
    with pytest.raises(Exception, match=rf"'{capped}' lost records \[2, 7\] \(reason: cap\)"):
        read(subscribe=capped, startingOffsets=f'{{"{capped}": 2}}')
    skipped = read(subscribe=capped, startingOffsets=f'{{"{capped}": 2}}',
                   failOnDataLoss="false", gapsTopic=f"{capped}-gaps")  # fmt: skip
    assert skipped == [8, 9, 10, 11, 12]
    gaps = [r["data"] for r in topics.read(f"{capped}-gaps")]
    assert [(g["gap_from"], g["gap_to"], g["reason"]) for g in gaps] == [(2, 7, "cap")]
    assert read(subscribe=capped) == [8, 9, 10, 11, 12]  # earliest: what is held at start


def test_a_batch_write_publishes_once_per_run_and_a_named_batch_once(
    spark: Any, server: Any, topics: Any, topic: str
) -> None:
    """``df.write.format("waymark").save()``: every row once per run (a second run writes
    them again, as Kafka's batch write); with ``writerId`` and ``batchId`` a second run
    of the same batch appends nothing."""
    df = spark.createDataFrame([(f'{{"n": {i}}}',) for i in range(5)], "data STRING")

    def save(**options: str) -> None:
        writer = df.write.format("waymark").mode("append").option("url", server.url)
        for key, value in {"topic": topic, **options}.items():
            writer = writer.option(key, value)
        writer.save()

    save()
    assert sorted(r["data"]["n"] for r in topics.read(topic)) == list(range(5))
    save()
    assert len(topics.read(topic)) == 10
    named = f"{topic}-named"
    save(topic=named, writerId="job", batchId="7")
    save(topic=named, writerId="job", batchId="7")
    assert sorted(r["data"]["n"] for r in topics.read(named)) == list(range(5))
    with pytest.raises(Exception, match=r"unknown option 'bachid'.*did you mean 'batchId'"):
        save(writerID="job", bachId="1")  # writerID is writerId: names ignore case


def test_a_query_started_while_its_server_is_down_waits_for_it(
    spark: Any, tmp_path: Path, topic: str
) -> None:
    """``serverBudgetMs`` (default 60 s): the driver's requests wait out a server that is
    restarting instead of failing the query at once (docs/spark.md, "Server outages").
    Here the query starts while the port only refuses (a listener closing every
    connection it accepts, counting them); once the driver was refused twice the real
    server comes back on its data and port, and the query reads everything."""
    from tests.conftest import start_server

    from waymark.client import Client, RecordIn

    first = start_server(tmp_path / "data")
    with Client(first.url) as client:
        client.append(topic, [RecordIn.of(i) for i in range(5)], create=True)
    assert first.stop() == 0
    port = int(first.url.rsplit(":", 1)[1])
    refusing = socket.create_server(("127.0.0.1", port))
    refused = threading.Semaphore(0)

    def refuse() -> None:
        while True:
            try:
                conn, _ = refusing.accept()
            except OSError:
                return
            conn.close()
            refused.release()

    threading.Thread(target=refuse, daemon=True).start()
    name = f"q_{uuid.uuid4().hex[:8]}"
    query = (
        spark.readStream.format("waymark").option("url", first.url).option("subscribe", topic)
        .load().select("data").writeStream.format("memory").queryName(name)
        .trigger(availableNow=True).start()
    )  # fmt: skip
    try:
        deadline, seen = time.monotonic() + 60, 0
        while seen < 2:  # the driver waits: refused twice, the query still running
            assert query.isActive, f"the query ended: {query.exception()}"
            assert time.monotonic() < deadline, "the driver never asked the server again"
            seen += refused.acquire(timeout=0.2)
        refusing.close()
        second = start_server(tmp_path / "data", port=port)
        try:
            assert query.awaitTermination(120), "the availableNow query did not stop"
            assert sorted(int(r.data) for r in spark.table(name).collect()) == list(range(5))
        finally:
            second.stop()
    finally:
        refusing.close()
        query.stop()


def test_server_budget_is_a_number_of_milliseconds(spark: Any, server: Any, topic: str) -> None:
    reader = (
        spark.read.format("waymark").option("url", server.url).option("subscribe", topic)
        .option("serverBudgetMs", "soon")
    )  # fmt: skip
    with pytest.raises(Exception, match="'serverBudgetMs' is a number of milliseconds"):
        reader.load().collect()
