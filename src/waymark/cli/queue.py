"""``waymark queue claim|ack|nack|stats|redrive``: a queue's jobs from the shell
(docs/queues.md; docs/cli.md, "Data commands")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from waymark.cli.connect import (
    DEFAULT_URL,
    Ca,
    Json,
    Token,
    Url,
    client,
    print_fields,
    print_json,
    print_table,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

Queue = Annotated[
    str, typer.Argument(help="The queue (a topic of type queue).", show_default=False)
]
Node = Annotated[
    str, typer.Option(help="The worker's name: the lease is held by it.", show_default=False)
]
Seqs = Annotated[list[int], typer.Argument(help="The jobs' seqs.", show_default=False)]
LeaseIds = Annotated[
    list[str] | None,
    typer.Option(
        "--lease-id",
        show_default=False,
        help="The claim's lease id of each seq, in the same order: then only the claim "
        "that holds that lease can settle the job (docs/queues.md).",
    ),
]


def _lease_ids(seqs: Sequence[int], lease_ids: list[str] | None) -> list[str] | None:
    if lease_ids and len(lease_ids) != len(seqs):
        raise typer.BadParameter(
            f"{len(lease_ids)} lease ids for {len(seqs)} seqs", param_hint="--lease-id"
        )
    return lease_ids or None


def _report_skipped(verb: str, skipped: Sequence[int]) -> None:
    """Seqs the server skipped (no live lease of this node, or another lease id): never
    an error (a retry is safe), but said, so that nothing is taken as done unseen."""
    if skipped:
        typer.echo(
            f"waymark queue: not {verb} (no live lease of this node and lease id): "
            + " ".join(map(str, skipped)),
            err=True,
        )


def register(app: typer.Typer) -> None:
    queue = typer.Typer(
        help="Queues: claim jobs under a lease, ack, nack, stats, redrive.",
        no_args_is_help=True,
    )
    app.add_typer(queue, name="queue")

    @queue.command()
    def claim(
        name: Queue,
        node: Node,
        max_: Annotated[int, typer.Option("--max", min=1, help="Jobs to claim at most.")] = 1,
        lease_ms: Annotated[
            int | None, typer.Option(min=1, help="The lease (default: the queue's lease_ms).")
        ] = None,
        url: Url = DEFAULT_URL,
        token: Token = None,
        ca: Ca = None,
        json: Annotated[
            bool, typer.Option("--json", help="Each job as a JSON line, with its lease.")
        ] = False,
    ) -> None:
        """Lease up to --max jobs of QUEUE for worker --node; none ready: nothing printed.

        Settle each with `queue ack` or `queue nack` (same --node, and --lease-id)
        before its deadline, or it is claimed again."""
        import msgspec

        with client(url, token, ca) as c:
            jobs = c.claim(name, node, max_, lease_ms=lease_ms)
        if json:
            for job in jobs:
                print_json(job)
            return
        print_table(
            f"jobs of {name}",
            ["seq", "lease_id", "delivery", "deadline", "tag", "data"],
            [
                (j.seq, j.lease_id, j.delivery, j.deadline, j.tag,
                 msgspec.json.encode(j.data).decode())
                for j in jobs
            ],
        )  # fmt: skip

    @queue.command()
    def ack(
        name: Queue,
        seqs: Seqs,
        node: Node,
        lease_ids: LeaseIds = None,
        url: Url = DEFAULT_URL,
        token: Token = None,
        ca: Ca = None,
        json: Json = False,
    ) -> None:
        """Ack jobs SEQS of QUEUE: done, deleted from the queue.

        Seqs whose live lease this node does not hold are skipped, and listed on stderr."""
        with client(url, token, ca) as c:
            result = c.ack(name, node, seqs, lease_ids=_lease_ids(seqs, lease_ids))
        if json:
            print_json(result)
        else:
            typer.echo(" ".join(map(str, result.acked)))
        _report_skipped("acked", result.skipped)

    @queue.command()
    def nack(
        name: Queue,
        seqs: Seqs,
        node: Node,
        lease_ids: LeaseIds = None,
        delay_ms: Annotated[
            int, typer.Option(min=0, help="Claimable again only after this delay.")
        ] = 0,
        url: Url = DEFAULT_URL,
        token: Token = None,
        ca: Ca = None,
        json: Json = False,
    ) -> None:
        """Give jobs SEQS of QUEUE back, to be claimed again (after --delay-ms).

        Seqs whose live lease this node does not hold are skipped, and listed on stderr."""
        with client(url, token, ca) as c:
            result = c.nack(
                name, node, seqs, lease_ids=_lease_ids(seqs, lease_ids), delay_ms=delay_ms
            )
        if json:
            print_json(result)
        else:
            typer.echo(" ".join(map(str, result.released)))
        _report_skipped("released", result.skipped)

    @queue.command()
    def stats(
        name: Queue, url: Url = DEFAULT_URL, token: Token = None, ca: Ca = None, json: Json = False
    ) -> None:
        """QUEUE's jobs: ready, in flight, dead-lettered, parked, and the oldest lease."""
        from waymark.client import ApiError, ErrorCode

        with client(url, token, ca) as c:
            state = c.get_topic(name, touch=False)
        if state.queue is None:  # what every queue route answers for a log topic
            raise ApiError(ErrorCode.NOT_A_QUEUE.status, ErrorCode.NOT_A_QUEUE,
                           f"topic {name!r} is not a queue", {})  # fmt: skip
        q = state.queue
        if json:
            print_json(q)
            return
        print_fields(
            f"queue {name}",
            [
                ("ready", q.ready),
                ("in_flight", q.in_flight),
                ("dead_lettered", q.dead_lettered),
                ("dead_letter_parked", q.dead_letter_parked),
                ("dead_letter_error", q.dead_letter_error and q.dead_letter_error.message),
                ("earliest_lease_deadline", q.earliest_lease_deadline),
                ("dead_letter", state.config.dead_letter or None),
                ("max_deliveries", state.config.max_deliveries),
                ("lease_ms", state.config.lease_ms),
            ],
        )

    @queue.command()
    def redrive(
        name: Queue,
        max_: Annotated[
            int, typer.Option("--max", min=1, help="Dead letters to move back at most.")
        ] = 1000,
        url: Url = DEFAULT_URL,
        token: Token = None,
        ca: Ca = None,
        json: Json = False,
    ) -> None:
        """Move dead letters of QUEUE (read from its dead_letter topic) back into it."""
        with client(url, token, ca) as c:
            result = c.redrive(name, max_)
        if json:
            print_json(result)
        else:
            typer.echo(f"redriven {result.redriven} jobs into {name}", err=True)
