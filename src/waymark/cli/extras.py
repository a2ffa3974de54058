"""Subcommands whose code is in an extra say so before they import it.

``pip install waymark`` gives the client, the protocol, the shipper and this command;
``waymark serve`` needs ``[server]``, ``waymark fold`` ``[kv]``, ``waymark demo`` all of
them (README.md, "Install"). Without the check a missing extra shows as an
ImportError traceback naming some third-party module instead of what to install.
"""

from __future__ import annotations

import re

import typer

_EXTRA = re.compile(r"""extra\s*==\s*['"]([\w-]+)['"]""")


def require(command: str, *extras: str) -> None:
    """Exit with status 2 and the pip command to run if a distribution that one of
    ``extras`` declares is not installed."""
    missing = [extra for extra in extras if not _installed(extra)]
    if missing:
        spec = ",".join(missing)
        typer.echo(
            f"waymark {command} needs the [{spec}] extra: pip install 'waymark[{spec}]'", err=True
        )
        raise typer.Exit(2)


def _installed(extra: str) -> bool:
    from importlib import metadata  # here: 13 ms at every start otherwise

    try:
        requirements = metadata.requires("waymark") or []
    except metadata.PackageNotFoundError:  # run from a source tree: the imports will tell
        return True
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        declared = _EXTRA.search(marker)
        if declared is None or declared.group(1) != extra:
            continue
        name = re.split(r"[^A-Za-z0-9._-]", spec.strip(), maxsplit=1)[0]
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return False
    return True
