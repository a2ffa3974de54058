"""What every data command shares (docs/cli.md, "Data commands"): the server options
(``--url``/``WAYMARK_URL`` and ``--token``/``WAYMARK_TOKEN`` of
:mod:`waymark.cli.options`, and ``--ca``/``WAYMARK_CA``), the
client they open, and how state is printed: a rich table on a terminal, plain
tab-separated lines in a pipe, JSON with ``--json``.

No ``register``: this module adds no command of its own. The client is imported inside
:func:`client` so that ``--help`` stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

# One spelling of the address and token for every command (docs/cli.md).
from waymark.cli.options import ServerUrl as Url
from waymark.cli.options import Token

if TYPE_CHECKING:
    from waymark.client import Client

__all__ = ["DEFAULT_URL", "Ca", "Json", "Token", "Url", "client"]

# The address `waymark serve` listens on by default (its --port 8080 on 127.0.0.1).
DEFAULT_URL = "http://127.0.0.1:8080"

Ca = Annotated[
    str | None,
    typer.Option(
        "--ca",
        envvar="WAYMARK_CA",
        show_envvar=True,
        help="CA certificate file to verify an https:// server with (default: the system's).",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print the state as JSON.")]


def client(url: str, token: str | None, ca: str | None) -> Client:
    """The shipped client on the server the options name. Its errors (ApiError,
    TransportError) propagate: the CLI's error handling turns them into messages."""
    from waymark.client import Client

    # token="" (an empty WAYMARK_TOKEN) means none; None would let the client read
    # WAYMARK_TOKEN again itself, which is what typer already did.
    return Client(url, token=token or "", ca_file=ca)


def print_json(value: Any) -> None:
    """``value`` (msgspec structs, lists, dicts) as one line of JSON on stdout."""
    import msgspec

    sys.stdout.buffer.write(msgspec.json.encode(value) + b"\n")
    sys.stdout.flush()


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A rich table when stdout is a terminal; else a header line and one line per row,
    tab-separated, for ``cut``/``awk``."""
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in cells:
            table.add_row(*row)
        Console().print(table)
        return
    lines = ["\t".join(columns), *("\t".join(row) for row in cells)]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def print_fields(title: str, fields: Sequence[tuple[str, object]]) -> None:
    """``name  value`` pairs: a two-column rich table on a terminal, ``name<TAB>value``
    lines in a pipe."""
    cells = [(name, "" if v is None else str(v)) for name, v in fields]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for name, value in cells:
            table.add_row(name, value)
        Console().print(table)
        return
    sys.stdout.write("".join(f"{name}\t{value}\n" for name, value in cells))
    sys.stdout.flush()
