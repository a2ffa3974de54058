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


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_commands()


def main() -> None:
    app()
