"""``waymark demo``: a server, a sample stream, a tombstone and a silent deletion.

Until the Spark pipeline demo exists this is what ``./run demo`` shows: it starts
``waymark serve`` as a subprocess on a free port and talks to it over HTTP with
:class:`waymark.client.Client`, exactly as a producer and a consumer would.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from waymark.client import Client

STREAM_RECORDS = 5_000
BATCH = 100


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        records: Annotated[
            int, typer.Option(help="Records in the sample stream.")
        ] = STREAM_RECORDS,
    ) -> None:
        """Start a server, write and read a sample stream, show a tombstone and a deletion."""
        from rich.console import Console

        console = Console()
        with _server() as url:
            console.print(f"[bold]waymark[/bold] serving on {url}")
            rows = _run(url, records, console)
        _report(rows, console)


@contextmanager
def _server() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="waymark-demo-") as data_dir:
        process = subprocess.Popen(
            [sys.executable, "-c", "from waymark.cli import main; main()", "serve",
             "--port", "0", "--data-dir", data_dir],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line.startswith("waymark listening on "):
                raise typer.Exit(f"the server did not start: {line!r}")
            yield line.split()[-1]
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(10)


def _run(url: str, records: int, console: Console) -> list[tuple[str, str, str]]:
    from rich.progress import Progress

    from waymark.client import Client, ConfigPatch, RecordIn

    rows: list[tuple[str, str, str]] = []
    with Client(url) as client:
        _wait_ready(client)

        # 1. A sample stream, written in batches and read back by cursor.
        with Progress(console=console) as progress:
            task = progress.add_task("writing demo.clicks", total=records)
            start = time.perf_counter()
            for base in range(0, records, BATCH):
                batch = [RecordIn.of({"click": i, "user": f"u{i % 17}"}, tag=f"user:u{i % 17}")
                         for i in range(base, min(base + BATCH, records))]  # fmt: skip
                client.append("demo.clicks", batch)
                progress.advance(task, len(batch))
            wrote = time.perf_counter() - start
            read_task = progress.add_task("reading demo.clicks", total=records)
            cursor, seen, start = 0, 0, time.perf_counter()
            while True:
                page = client.diff("demo.clicks", cursor, limit=1000)
                if [r.seq for r in page.records] != list(
                    range(seen + 1, seen + 1 + len(page.records))
                ):
                    raise typer.Exit("records came back out of order or with holes")
                seen += len(page.records)
                progress.advance(read_task, len(page.records))
                cursor = page.next_from_seq
                if page.caught_up:
                    break
            read = time.perf_counter() - start
        rows.append(("write", f"{records:,} records in batches of {BATCH}",
                     f"seqs 1..{cursor:,} in {wrote:.2f}s"))  # fmt: skip
        rows.append(("read", "diff pages of 1000 from from_seq=0",
                     f"{seen:,} records in order in {read:.2f}s"))  # fmt: skip

        # 2. A capped topic evicts what a slow reader has not read: it gets a tombstone.
        client.put_topic("demo.capped", ConfigPatch(cap_records=100))
        client.append("demo.capped", [RecordIn.of(i) for i in range(100)])
        first = client.diff("demo.capped", 0, limit=10)
        for i in range(100, 400, 50):
            client.append("demo.capped", [RecordIn.of(j) for j in range(i, i + 50)])
        late = client.diff("demo.capped", first.next_from_seq, limit=1000)
        tomb = late.tombstone
        assert tomb is not None
        rows.append(("tombstone", "cap_records=100; a reader stalls at seq 10 while 300 more "
                     "are written", f"reason={tomb.reason} gap {tomb.gap_from}..{tomb.gap_to}, "
                     f"then {len(late.records)} live records from {tomb.seq}"))  # fmt: skip

        # 3. A deletion is voluntary, so it is silent: no tombstone, the seqs just vanish.
        chat = [RecordIn.of(f"message {i}", tag=f"chat-{42 if i % 2 else 7}:{i}")
                for i in range(10)]  # fmt: skip
        client.append("demo.chat", chat)
        deleted = client.delete("demo.chat", match=("tag", "Glob", "chat-42:*"))
        after = client.diff("demo.chat", 0)
        rows.append(("deletion", 'match ["tag","Glob","chat-42:*"]',
                     f"{deleted.deleted} deleted; reader sees seqs "
                     f"{[r.seq for r in after.records]}, tombstone={after.tombstone}"))  # fmt: skip

        # 4. The same stream over SSE, resumed from a cursor.
        events = client.watch("demo.capped", cursor=f"{late.epoch}:{late.head_seq - 3}")
        tail = [next(events) for _ in range(3)]
        events.close()
        rows.append(("watch (SSE)", f"resume with Last-Event-ID {late.epoch}:{late.head_seq - 3}",
                     "ids " + ", ".join(e.cursor for e in tail)))  # fmt: skip
    return rows


def _wait_ready(client: Client) -> None:
    import httpx

    for _ in range(100):
        try:
            client.health()
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise typer.Exit("the server never became ready")


def _report(rows: list[tuple[str, str, str]], console: Console) -> None:
    from rich.table import Table

    table = Table(title="what happened")
    for column in ("step", "action", "result"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)
