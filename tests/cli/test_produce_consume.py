"""``waymark produce`` and ``waymark consume`` through the shipped command against a real
server: round trips, --follow, and losses announced, never passed over
(docs/cli.md, "Data commands")."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.cli.conftest import WAYMARK, run, said
from tests.conftest import LongPolls, ServerProcess, readable

from waymark.client import Client, ConfigPatch, Discard, RecordIn


def test_raw_lines_round_trip_byte_for_byte(server: ServerProcess, tmp_path: Path) -> None:
    """10 000 raw lines, quotes, backslashes, non-ASCII and blank lines among them, read
    back exactly, in appends of --batch lines."""
    lines = [f'line {i} "q" \\ é ✓' if i % 7 else "" for i in range(10_000)]
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    produced = run(server.url, "produce", "cli.raw", str(source), "--format", "raw",
                   "--batch", "4000")  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert b"produced 10000 records to cli.raw (seqs 1..10000)" in produced.stderr
    consumed = run(server.url, "consume", "cli.raw", "--format", "raw")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.decode("utf-8").split("\n")[:-1] == lines
    assert consumed.stderr == b""


def test_json_lines_with_tag_field_split_into_appends(server: ServerProcess) -> None:
    """More lines than the server takes in one write: produce splits them (one append of
    10 001 would be refused with too_many_records); --id-field makes a re-run safe."""
    count = 10_001
    stdin = "".join(
        json.dumps({"n": i, "user": f"u{i % 4}"}, separators=(",", ":")) + "\n"
        for i in range(count)
    )
    produced = run(server.url, "produce", "cli.json", "--tag-field", "user",
                   "--id-field", "n", stdin=stdin.encode())  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    # With ids, a re-run (say after an append that got no answer) appends nothing twice.
    again = run(server.url, "produce", "cli.json", "--tag-field", "user",
                "--id-field", "n", stdin=stdin.encode())  # fmt: skip
    assert again.returncode == 0, again.stderr
    consumed = run(server.url, "consume", "cli.json", "--from-seq", "10000")
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [(r["$seq"], r["$tag"], r["data"]) for r in records] == [
        (10_000, "u3", {"n": 9_999, "user": "u3"}),
        (10_001, "u0", {"n": 10_000, "user": "u0"}),
    ]
    with Client(server.url) as c:
        assert c.get_topic("cli.json").count == count


def test_bad_line_stops_and_says_where(server: ServerProcess) -> None:
    produced = run(server.url, "produce", "cli.bad", stdin=b'{"a":1}\n2\n{oops\n{"a":4}\n')
    assert produced.returncode == 2
    assert "stdin line 3: not JSON" in said(produced)
    with Client(server.url) as c:  # what came before the bad line is appended, no more
        assert [r.data for r in c.diff("cli.bad", 0).records] == [{"a": 1}, 2]


def test_follow_receives_a_record_appended_after_it_started(
    server: ServerProcess, long_polls: Callable[[str], LongPolls]
) -> None:
    with Client(server.url) as c:
        c.append("cli.follow", [RecordIn.of("before")])
    consumer = subprocess.Popen(
        [WAYMARK, "consume", "cli.follow", "--follow", "--format", "raw", "--url", server.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ},
    )  # fmt: skip
    try:
        assert consumer.stdout is not None
        assert readable(consumer.stdout, 30), "consume printed nothing"
        assert consumer.stdout.readline() == b"before\n"
        long_polls(server.url).wait_for(1, timeout=30)  # it waits at the head now
        with Client(server.url) as c:
            c.append("cli.follow", [RecordIn.of("after")])
        assert readable(consumer.stdout, 30), "the appended record never came"
        assert consumer.stdout.readline() == b"after\n"
        assert consumer.poll() is None  # still following
    finally:
        consumer.kill()
        consumer.wait()


def test_eviction_before_the_read_is_announced_and_fails_on_loss(server: ServerProcess) -> None:
    """A capped topic whose oldest records were evicted before the consumer read them:
    the loss goes to stderr with its range and reason, --fail-on-loss exits 3 without
    printing what comes after the gap; without it the reader goes on after the gap."""
    assert run(server.url, "topic", "create", "cli.capped", "-c", "cap_records=10").returncode == 0
    produced = run(server.url, "produce", "cli.capped", "--format", "raw",
                   stdin="".join(f"{i}\n" for i in range(1, 101)).encode())  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    loss = b"LOSS in cli.capped: seqs 1..90 are gone (reason cap, about 90 records)"

    failed = run(server.url, "consume", "cli.capped", "--format", "raw", "--fail-on-loss")
    assert failed.returncode == 3
    assert loss in failed.stderr
    assert failed.stdout == b""

    went_on = run(server.url, "consume", "cli.capped", "--from-seq", "50",
                  "--format", "template", "--template", "{seq}:{data}")  # fmt: skip
    assert went_on.returncode == 0
    assert b"LOSS in cli.capped: seqs 50..90" in went_on.stderr
    assert went_on.stdout.split() == [f"{i}:{i}".encode() for i in range(91, 101)]


def test_deleted_records_are_not_a_loss(server: ServerProcess) -> None:
    """Records deleted by request are absent, not lost: no LOSS line, and --fail-on-loss
    passes (a reader is never told of a loss that did not happen)."""
    with Client(server.url) as c:
        c.append("cli.deleted", [RecordIn.of(i, tag="odd" if i % 2 else "even")
                                 for i in range(10)])  # fmt: skip
    assert run(server.url, "topic", "delete", "cli.deleted", "--tag", "odd").returncode == 0
    assert run(server.url, "topic", "delete", "cli.deleted", "--before-seq", "3").returncode == 0
    read = run(server.url, "consume", "cli.deleted", "--format", "raw", "--fail-on-loss")
    assert read.returncode == 0, read.stderr
    assert read.stderr == b""
    assert read.stdout.split() == [b"2", b"4", b"6", b"8"]


def test_refused_append_stops_and_names_the_first_line_not_appended(
    server: ServerProcess,
) -> None:
    """Appends are atomic: with room for 5, the second append of 3 is refused whole
    (topic_full), and stderr says where the stored lines end."""
    with Client(server.url) as c:
        c.put_topic("cli.full", ConfigPatch(cap_records=5, discard=Discard.REJECT))
    produced = run(server.url, "produce", "cli.full", "--batch", "3",
                   stdin="".join(f"{i}\n" for i in range(1, 9)).encode())  # fmt: skip
    assert produced.returncode != 0
    assert b"topic_full" in produced.stderr
    assert b"stdin line 4 and those after it were not appended" in produced.stderr
    with Client(server.url) as c:
        assert [r.data for r in c.diff("cli.full", 0).records] == [1, 2, 3]


def test_a_start_past_the_head_is_refused_not_reported_as_a_loss(server: ServerProcess) -> None:
    """The server reads a cursor past the head as an older instance's (a `recreated`
    tombstone): consume refuses such a --from-seq instead of announcing a false loss."""
    with Client(server.url) as c:
        c.append("cli.short", [RecordIn.of(1), RecordIn.of(2)])
    past = run(server.url, "consume", "cli.short", "--from-seq", "50")
    assert past.returncode == 2
    assert "past the head of cli.short: the next record appended gets seq 3" in said(past)
    assert b"LOSS" not in past.stderr and past.stdout == b""
