"""``waymark router list|create|delete``: routers that forward one topic into another
(docs/routers.md; docs/cli.md, "Data commands")."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, cast

import typer

from waymark.cli.connect import DEFAULT_URL, Ca, Json, Token, Url, client, print_json, print_table
from waymark.cli.errors import Failure
from waymark.cli.topic import tag_match

if TYPE_CHECKING:
    from waymark.client import Client, RouterOut
    from waymark.protocol.routers import Guarantee as GuaranteeName


class Guarantee(StrEnum):
    """A router's delivery guarantee (docs/routers.md)."""

    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE = "exactly_once"


Name = Annotated[str, typer.Argument(help="The router's name.", show_default=False)]


def _rows(routers: list[RouterOut]) -> list[tuple[object, ...]]:
    import msgspec

    return [
        (r.name, r.source, r.dest, r.guarantee, r.cursor, r.source_trimmed,
         msgspec.json.encode(r.filter).decode() if r.filter else None)
        for r in routers
    ]  # fmt: skip


COLUMNS = ["name", "source", "dest", "guarantee", "cursor", "source_trimmed", "filter"]


def _exists(c: Client, name: str) -> bool:
    from waymark.client import ApiError, ErrorCode

    try:
        c.get_router(name)
    except ApiError as exc:
        if exc.code is ErrorCode.ROUTER_NOT_FOUND:
            return False
        raise
    return True


def register(app: typer.Typer) -> None:
    router = typer.Typer(
        help="Routers: forward every record of one topic into another.", no_args_is_help=True
    )
    app.add_typer(router, name="router")

    @router.command("list")
    def list_(
        url: Url = DEFAULT_URL, token: Token = None, ca: Ca = None, json: Json = False
    ) -> None:
        """Every router, with how far it has forwarded (cursor, a source seq)."""
        with client(url, token, ca) as c:
            routers = c.list_routers()
        if json:
            print_json(routers)
            return
        print_table("routers", COLUMNS, _rows(routers))

    @router.command()
    def create(
        name: Name,
        source: Annotated[str, typer.Option(help="The topic read.", show_default=False)],
        dest: Annotated[str, typer.Option(help="The topic written.", show_default=False)],
        guarantee: Annotated[
            Guarantee, typer.Option(help="exactly_once: copies carry an idempotency key.")
        ] = Guarantee.AT_LEAST_ONCE,
        preserve_node: Annotated[bool, typer.Option(help="Copies keep their $node.")] = True,
        preserve_tag: Annotated[bool, typer.Option(help="Copies keep their $tag.")] = True,
        allow_cycle: Annotated[
            bool, typer.Option(help="Allow a cycle of routers (docs/routers.md).")
        ] = False,
        create_dest: Annotated[bool, typer.Option(help="Create DEST if missing.")] = True,
        filter_tag: Annotated[
            str | None,
            typer.Option(
                help="Forward only records with this tag, or matching this glob "
                "(*, ?, [...]: docs/globs.md)."
            ),
        ] = None,
        filter_node: Annotated[
            list[str] | None,
            typer.Option(help="Forward only records of this $node; repeat for several."),
        ] = None,
        filter_not_node: Annotated[
            list[str] | None,
            typer.Option(help="Forward no record of this $node; repeat for several."),
        ] = None,
        url: Url = DEFAULT_URL,
        token: Token = None,
        ca: Ca = None,
        json: Json = False,
    ) -> None:
        """Create router NAME from --source into --dest (exit 5, refused, if it exists)."""
        from waymark.client import RouterFilter

        rule = None
        if filter_tag is not None or filter_node or filter_not_node:
            rule = RouterFilter(
                tag=None if filter_tag is None else tag_match(filter_tag),
                node=filter_node or None,
                not_node=filter_not_node or None,
            )
        with client(url, token, ca) as c:
            if _exists(c, name):
                raise Failure(f"router {name} exists — `waymark router delete` it first")
            made = c.put_router(
                name, source, dest,
                preserve_node=preserve_node, preserve_tag=preserve_tag,
                allow_cycle=allow_cycle, guarantee=cast("GuaranteeName", guarantee.value),
                create_dest=create_dest, filter=rule,
            )  # fmt: skip
        if json:
            print_json(made)
            return
        print_table(f"router {name}", COLUMNS, _rows([made]))

    @router.command()
    def delete(name: Name, url: Url = DEFAULT_URL, token: Token = None, ca: Ca = None) -> None:
        """Delete router NAME: forwarding stops; both topics keep their records."""
        with client(url, token, ca) as c:
            c.delete_router(name)
        typer.echo(f"deleted router {name}", err=True)
