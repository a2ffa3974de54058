"""``waymark version``."""

from __future__ import annotations

import typer

import waymark


def register(app: typer.Typer) -> None:
    @app.command()
    def version() -> None:
        """Print waymark's version."""
        typer.echo(waymark.__version__)
