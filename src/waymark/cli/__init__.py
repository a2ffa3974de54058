"""The ``waymark`` command.

Each module in this package adds its own subcommand(s) through a ``register(app)``
function, so parts can grow the CLI without editing a shared file. Heavy imports
(Spark, NATS) stay inside the command functions to keep ``--help`` instant.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

app = typer.Typer(
    name="waymark",
    help="waymark: durable topics, ordered checkpoints, KV folds and exactly-once Spark pipelines.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """waymark: durable topics, ordered checkpoints, KV folds and exactly-once Spark pipelines."""


# Modules that add no command: not imported at start (some import the client or
# rich.progress, which a command loads only when it runs; docs/cli.md, "Start-up").
_HELPERS = frozenset(
    {"errors", "extras", "fold_progress", "fold_report", "nats_wait", "options", "startup"}
)


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in _HELPERS:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_commands()


def main() -> None:
    """The ``waymark`` entry point: an expected failure of any command is one line and
    its exit code (:mod:`waymark.cli.errors`), never a traceback."""
    from waymark.cli.errors import guarded
    from waymark.cli.startup import install

    install()  # pydantic only when a value needs it
    with guarded():
        app()
