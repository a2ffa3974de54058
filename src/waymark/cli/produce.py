"""``waymark produce TOPIC``: lines from stdin or files appended as records, in the habits
of ``kcat -P`` (docs/cli.md, "Data commands").

Lines go out in appends of up to the server's records per write (each atomic,
docs/topics.md, Limits). If one is refused, what went before stays appended and the
command says how far it got before the error propagates.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated

import typer

from waymark.cli.connect import DEFAULT_URL, Ca, Token, Url, client

if TYPE_CHECKING:
    from waymark.client import RecordIn

# Appends stay well below the server's default 64 MiB body limit (docs/topics.md, Limits).
BATCH_BYTES = 16 << 20
# Without a terminal for a progress bar, a line on stderr this often (s) on long input.
PROGRESS_EVERY_S = 5.0


class LineFormat(StrEnum):
    JSON = "json"  # each line is a JSON value, the record's data
    RAW = "raw"  # each line is the record's data as a JSON string


class BadLine(ValueError):
    """An input line that cannot be a record."""


def _lines(files: list[Path]) -> Iterator[tuple[str, int, bytes]]:
    """(source name, line number, line without its end) of every file in turn; no
    file, or ``-``, is stdin."""
    for path in files or [Path("-")]:
        name = "stdin" if str(path) == "-" else str(path)
        stream: IO[bytes] = sys.stdin.buffer if name == "stdin" else path.open("rb")
        try:
            for number, line in enumerate(stream, 1):
                yield name, number, line.removesuffix(b"\n").removesuffix(b"\r")
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()


@dataclass(frozen=True)
class LineRule:
    """How an input line becomes a record (the options of ``produce``)."""

    fmt: LineFormat
    tag: str | None = None
    tag_field: str | None = None
    id_field: str | None = None
    node: str | None = None


def _field_text(value: object) -> str:
    import msgspec

    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def to_record(line: bytes, rule: LineRule) -> RecordIn | None:
    """The record of one input line (None: a blank JSON line, skipped)."""
    import msgspec

    from waymark.client import RecordIn

    if rule.fmt is LineFormat.RAW:
        try:
            text = line.decode()
        except UnicodeDecodeError as exc:
            raise BadLine(f"not UTF-8 ({exc.reason})") from exc
        return RecordIn(msgspec.Raw(msgspec.json.encode(text)), rule.tag, rule.node)
    line = line.strip()
    if not line:
        return None
    try:
        value = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise BadLine(f"not JSON ({exc})") from exc
    fields = value if isinstance(value, dict) else {}
    tag = rule.tag
    if rule.tag_field is not None and fields.get(rule.tag_field) is not None:
        tag = _field_text(fields[rule.tag_field])
    record_id = None
    if rule.id_field is not None:
        if fields.get(rule.id_field) is None:
            # A record without its id would not be deduplicated on a re-run.
            raise BadLine(f"no field {rule.id_field!r} for --id-field")
        record_id = _field_text(fields[rule.id_field])
    return RecordIn(msgspec.Raw(line), tag, rule.node, None, record_id)


class Progress:
    """How far a long input got, on stderr: a rich bar on a terminal, else a line every
    ``PROGRESS_EVERY_S``."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.records = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self._next_line = time.monotonic() + PROGRESS_EVERY_S
        self._bar = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import Progress as Bar
            from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

            self._bar = Bar(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self._text())

    def _text(self) -> str:
        return f"produced {self.records} records to {self.topic}"

    def appended(self, seqs: list[int]) -> None:
        self.records += len(seqs)
        if seqs:
            self.first_seq = seqs[0] if self.first_seq is None else self.first_seq
            self.last_seq = seqs[-1]
        if self._bar is not None:
            self._bar.update(self._task, description=self._text())
        elif time.monotonic() >= self._next_line:
            self._next_line = time.monotonic() + PROGRESS_EVERY_S
            typer.echo(self._text() + " ...", err=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        seqs = f" (seqs {self.first_seq}..{self.last_seq})" if self.records else ""
        typer.echo(f"{self._text()}{seqs}", err=True)


def register(app: typer.Typer) -> None:
    @app.command()
    def produce(
        topic: Annotated[str, typer.Argument(help="The topic to append to.", show_default=False)],
        files: Annotated[
            list[Path] | None,
            typer.Argument(help="Files to read, in turn; none or - is stdin.", show_default=False),
        ] = None,
        fmt: Annotated[
            LineFormat,
            typer.Option(
                "--format",
                help="json: each line is a JSON value (blank lines "
                "are skipped); raw: each line is a string.",
            ),
        ] = LineFormat.JSON,
        tag: Annotated[str | None, typer.Option(help="The records' tag.")] = None,
        tag_field: Annotated[
            str | None,
            typer.Option(
                help="json: take each record's tag from this top-level field of "
                "its object (a line without it gets --tag, if any)."
            ),
        ] = None,
        id_field: Annotated[
            str | None,
            typer.Option(
                help="json: each record's idempotency id is this top-level field of its "
                "object (required on every line): a re-run within the topic's "
                "idempotency window appends nothing twice."
            ),
        ] = None,
        node: Annotated[str | None, typer.Option(help="The records' $node.")] = None,
        batch: Annotated[
            int | None,
            typer.Option(
                min=1, help="Records per append (at most the server's records per write, 10 000)."
            ),
        ] = None,
        url: Url = DEFAULT_URL,
        token: Token = None,
        ca: Ca = None,
    ) -> None:
        """Append lines from stdin or FILES to TOPIC, one record per line.

        Records go out in atomic appends of up to --batch records; a refused append
        stops the command, and stderr says which line it stopped at: the lines before
        it are appended, it and those after are not."""
        from waymark.client import ApiError
        from waymark.protocol.limits import Limits

        if fmt is LineFormat.RAW and (tag_field or id_field):
            raise typer.BadParameter("--tag-field and --id-field read JSON objects: --format json")
        rule = LineRule(fmt, tag, tag_field, id_field, node)
        per_write = min(batch or Limits().max_records_per_write, Limits().max_records_per_write)
        progress = Progress(topic)
        pending: list[RecordIn] = []
        pending_bytes = 0
        # Where the first pending line came from, to name it if its append is refused.
        first_pending = ("", 0)
        sending = False  # an append is on the wire, its answer not yet read
        with client(url, token, ca) as c:

            def flush() -> None:
                nonlocal pending, pending_bytes, sending
                if pending:
                    sending = True
                    progress.appended(c.append(topic, pending).seqs)
                    sending = False
                pending, pending_bytes = [], 0

            try:
                for source, number, line in _lines(files or []):
                    try:
                        record = to_record(line, rule)
                    except BadLine as exc:
                        flush()
                        raise typer.BadParameter(
                            f"{source} line {number}: {exc}; the lines before it were "
                            "appended, it and those after it were not"
                        ) from exc
                    if record is None:
                        continue
                    if not pending:
                        first_pending = (source, number)
                    pending.append(record)
                    pending_bytes += len(record.data) + 64
                    if len(pending) >= per_write or pending_bytes >= BATCH_BYTES:
                        flush()
                flush()
            except BaseException as exc:
                progress.close()
                if pending:
                    source, number = first_pending
                    if sending and not isinstance(exc, ApiError):
                        # No answer to the append: it may or may not have been applied.
                        said = (f"whether {source} line {number} and the rest of its "
                                f"append ({len(pending)} lines) were appended is unknown "
                                "(no answer); the lines after them were not sent")  # fmt: skip
                    else:  # refused (an append is atomic), or never sent
                        said = f"{source} line {number} and those after it were not appended"
                    typer.echo(f"waymark produce: stopped; {said}", err=True)
                raise
        progress.close()
