"""The options every command that talks to a waymark server spells the same way
(docs/cli.md, "Server address and token"): ``--url``/``WAYMARK_URL`` and
``--token``/``WAYMARK_TOKEN``."""

from __future__ import annotations

from typing import Annotated

import typer

from waymark.cli import errors


def _remember(value: str | None) -> str | None:
    # A refusal or an unreachable server is reported with the address (waymark.cli.errors).
    if value:
        errors.server_url = value
    return value


ServerUrl = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="WAYMARK_URL",
        show_envvar=True,
        callback=_remember,
        help="The waymark server, e.g. http://127.0.0.1:8080.",
    ),
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="WAYMARK_TOKEN", show_envvar=True, help="Bearer token (a read scope)."
    ),
]


def server(value: str | None) -> str | None:
    """Remember an address given another way (a positional argument, ``--report-to``)
    for the error messages; returns it."""
    return _remember(value)
