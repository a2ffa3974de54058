"""``waymark consume TOPIC``: a topic's records on stdout, in the habits of ``kcat -C``
(docs/cli.md, "Data commands").

A loss is never passed over in silence: a tombstone (records evicted, expired, lost in
a crash, or the topic recreated; docs/topics.md, "Two kinds of missing records") is
written to stderr with its range and reason, and ``--fail-on-loss`` stops there with
exit status 3 before any record after the gap is printed. Deleted records are not a
loss: the reader is not told of them (docs/semantics/topics.md §7).
"""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from waymark.cli.connect import DEFAULT_URL, Ca, Token, Url, client

# a consume that met a loss under --fail-on-loss exits with it (docs/cli.md, exit codes)
from waymark.cli.errors import EXIT_DATA_LOSS

if TYPE_CHECKING:
    import msgspec

    from waymark.client import Record, Tombstone


# How long one long-poll of --follow waits for a record (at most MAX_WAIT_MS).
FOLLOW_WAIT_MS = 30_000


class OutFormat(StrEnum):
    JSON = "json"  # the whole record as read: {"$seq", "$ts", ..., "data"}
    RAW = "raw"  # data alone: a string as its text, any other value as its JSON
    TEMPLATE = "template"  # --template with the record's fields filled in


def loss_message(topic: str, tombstone: Tombstone) -> str:
    """The stderr line for a tombstone: which seqs are gone, why, where reading goes on."""
    return (
        f"waymark consume: LOSS in {topic}: seqs {tombstone.gap_from}..{tombstone.gap_to} "
        f"are gone (reason {tombstone.reason}, about {tombstone.missed_estimate} records); "
        f"reading resumes at seq {tombstone.seq}"
    )


def _text(data: bytes) -> bytes:
    """A record's data as text: a JSON string as the string, any other value as its JSON."""
    import msgspec

    return msgspec.json.decode(data, type=str).encode() if data.startswith(b'"') else data


def _render(record: Record[msgspec.Raw], fmt: OutFormat, template: str) -> bytes:
    import msgspec

    if fmt is OutFormat.JSON:
        return msgspec.json.encode(record)
    if fmt is OutFormat.RAW:
        return _text(bytes(record.data))
    fields = {
        "seq": record.seq, "ts": record.ts, "node": record.node or "", "tag": record.tag or "",
        "meta": msgspec.json.encode(record.meta).decode() if record.meta else "",
        "data": _text(bytes(record.data)).decode(),
    }  # fmt: skip
    return template.format_map(fields).encode()


TEMPLATE_FIELDS = ("seq", "ts", "node", "tag", "meta", "data")


def register(app: typer.Typer) -> None:
    @app.command()
    def consume(
        topic: Annotated[str, typer.Argument(help="The topic to read.", show_default=False)],
        from_seq: Annotated[
            int | None,
            typer.Option(
                min=0, help="Start at this seq (the first record printed has a seq at least this)."
            ),
        ] = None,
        from_beginning: Annotated[
            bool, typer.Option(help="Start at the earliest record kept (the default).")
        ] = False,
        tail: Annotated[
            bool, typer.Option(help="Only records appended from now on; implies --follow.")
        ] = False,
        follow: Annotated[
            bool,
            typer.Option(
                "--follow",
                "-f",
                help="Wait for new records instead of exiting "
                "at the head (the head when the command started).",
            ),
        ] = False,
        fmt: Annotated[
            OutFormat,
            typer.Option(
                "--format",
                help="json: each record as a JSON line with its seq, "
                "ts, node, tag, meta; raw: its data alone (a string as its text); "
                "template: --template filled in.",
            ),
        ] = OutFormat.JSON,
        template: Annotated[
            str,
            typer.Option(
                help="With --format template: a Python format string of "
                "{seq} {ts} {node} {tag} {meta} {data}, e.g. '{seq}\\t{tag}\\t{data}'; "
                "\\t and \\n are a tab and a newline."
            ),
        ] = "{seq}\t{data}",
        count: Annotated[
            int | None,
            typer.Option("--count", "-n", min=1, help="Exit after this many records."),
        ] = None,
        fail_on_loss: Annotated[
            bool,
            typer.Option(
                help=f"Exit with status {EXIT_DATA_LOSS} at the first loss, before "
                "printing any record after it."
            ),
        ] = False,
        url: Url = DEFAULT_URL,
        token: Token = None,
        ca: Ca = None,
    ) -> None:
        """Print TOPIC's records on stdout, one a line, oldest first.

        Lost records (evicted, expired, lost in a crash, or the topic recreated) are
        announced on stderr with their seq range and reason."""
        from waymark.protocol.limits import MAX_DIFF_LIMIT

        if sum((from_seq is not None, from_beginning, tail)) > 1:
            raise typer.BadParameter("give one of --from-seq, --from-beginning, --tail")
        follow = follow or tail
        template = template.replace("\\t", "\t").replace("\\n", "\n")
        if fmt is OutFormat.TEMPLATE:
            try:  # a bad template is a usage error now, not at the first record
                template.format_map(dict.fromkeys(TEMPLATE_FIELDS, ""))
            except (KeyError, ValueError, IndexError) as exc:
                raise typer.BadParameter(
                    f"{exc!r}; the fields are {', '.join(TEMPLATE_FIELDS)}",
                    param_hint="--template",
                ) from exc
        out = sys.stdout.buffer
        printed = 0
        with client(url, token, ca) as c:
            state = c.get_topic(topic, touch=False)
            # Every read names the epoch the start was chosen in: a topic recreated
            # since is then told as such (docs/http-api.md, "Tombstones").
            epoch = state.epoch
            if tail:
                cursor = state.head_seq
            else:
                # The API's cursor is exclusive: records after it (docs/http-api.md).
                cursor = max((from_seq or 0) - 1, 0)
                if cursor > state.assigned_head_seq:
                    # The server would read such a cursor as one of an older instance
                    # and announce a `recreated` loss that never happened.
                    raise typer.BadParameter(
                        f"seq {from_seq} is past the head of {topic}: the next record "
                        f"appended gets seq {state.next_seq}",
                        param_hint="--from-seq",
                    )
            end: int | None = None  # without --follow: the head when reading began
            wait = False
            try:
                while True:
                    page = c.diff_raw(
                        topic,
                        cursor,
                        limit=MAX_DIFF_LIMIT,
                        epoch=epoch,
                        wait_ms=FOLLOW_WAIT_MS if wait else 0,
                    )
                    epoch = page.epoch  # after a `recreated` tombstone, the new one's
                    end = page.head_seq if end is None else end
                    if page.tombstone is not None:
                        out.flush()
                        typer.echo(loss_message(topic, page.tombstone), err=True)
                        if fail_on_loss:
                            raise typer.Exit(EXIT_DATA_LOSS)
                    for record in page.records:
                        out.write(_render(record, fmt, template) + b"\n")
                        printed += 1
                        if count is not None and printed >= count:
                            out.flush()
                            return
                    out.flush()
                    cursor = page.next_from_seq
                    if (page.caught_up or cursor >= end) and not follow:
                        return
                    wait = page.caught_up
            except BrokenPipeError:
                # The reader went away (`| head`): end quietly, and keep Python from
                # reporting the pipe again when it flushes stdout at exit.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
