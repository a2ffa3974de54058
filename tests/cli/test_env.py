"""Every command reads a shared setting from the same environment variable
(docs/cli.md): ``--nats`` from NATS_URL as ``waymark kv`` does, ``--token`` from
WAYMARK_TOKEN, so an exported variable reaches ``fold`` as it reaches ``kv``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer

from waymark.cli import app

SHARED = {"--nats": "NATS_URL", "--token": "WAYMARK_TOKEN"}


def options(command: Any, path: str = "waymark") -> Iterator[tuple[str, Any]]:
    """Every option of ``command`` and its subcommands (typer's own click classes)."""
    for param in command.params:
        if param.param_type_name == "option":
            yield path, param
    for name, sub in getattr(command, "commands", {}).items():
        yield from options(sub, f"{path} {name}")


def test_a_shared_option_reads_its_environment_variable_everywhere() -> None:
    found = [(path, opt) for path, opt in options(typer.main.get_command(app))
             if set(opt.opts) & set(SHARED)]  # fmt: skip
    assert {path for path, _ in found} >= {"waymark kv get", "waymark fold", "waymark fold restore"}
    wrong = {
        f"{path} {opt.opts[0]}": opt.envvar
        for path, opt in found
        if opt.envvar != SHARED[next(o for o in opt.opts if o in SHARED)]
    }
    assert wrong == {}
