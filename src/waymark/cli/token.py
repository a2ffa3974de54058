"""``waymark token new`` and ``revoke``: the tokens file of ``waymark serve --tokens``
(docs/security.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from waymark.cli.extras import require

token_app = typer.Typer(help="Bearer tokens for `waymark serve --tokens FILE`.",
                        no_args_is_help=True)  # fmt: skip


@token_app.command("new")
def new(
    name: Annotated[str, typer.Argument(help="The token's name (shown by whoami, in 403s).")],
    scope: Annotated[
        list[str],
        typer.Option(
            help="admin, or read|write|delete|queue:<topic glob> (e.g. write:logs.*); "
            "repeat for several.",
        ),
    ],
    tokens: Annotated[Path, typer.Option(help="The tokens file; created (mode 0600) if missing.")],
    expires_in: Annotated[
        str | None,
        typer.Option(help="Expire after this long: 90s, 30m, 1h, 7d (401 token_expired after)."),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(help="Requests per second the server admits (429 rate_limited past it)."),
    ] = None,
) -> None:
    """Add token NAME to the file and print its secret once, alone on the last line.

    The file keeps only a salted hash: the secret cannot be shown again. A running
    server picks the new token up on SIGHUP.
    """
    require("token", "server")
    from waymark.server.auth import TokenFileError, new_token, parse_duration

    try:
        expires_in_s = None if expires_in is None else parse_duration(expires_in)
        secret = new_token(tokens, name, scope, expires_in_s=expires_in_s, rate_per_s=rate)
    except (TokenFileError, ValueError) as exc:
        typer.echo(f"waymark: {exc}", err=True)
        raise typer.Exit(2) from exc
    limits = (f", expiring in {expires_in}" if expires_in else "") + (
        f", at most {rate:g} requests/s" if rate else ""
    )
    typer.echo(f"token {name!r} added to {tokens} with scopes {', '.join(scope)}{limits}",
               err=True)  # fmt: skip
    typer.echo(secret)


@token_app.command("revoke")
def revoke(
    name: Annotated[str, typer.Argument(help="The token's name.")],
    tokens: Annotated[Path, typer.Option(help="The tokens file.")],
) -> None:
    """Remove token NAME from the file. A running server refuses it after SIGHUP, and
    ends the streams (watch, /work, changes) it holds open within a second."""
    require("token", "server")
    from waymark.server.auth import TokenFileError, revoke_token

    try:
        revoke_token(tokens, name)
    except (TokenFileError, ValueError) as exc:
        typer.echo(f"waymark: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"token {name!r} removed from {tokens}; send the server SIGHUP", err=True)


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")
