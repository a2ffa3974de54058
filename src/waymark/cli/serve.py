"""``waymark serve``: the /v0 HTTP API on uvicorn (uvloop + httptools)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one.")] = 8080,
        data_dir: Annotated[
            Path,
            typer.Option(
                help="Directory for durable storage. It is created now, but records stay "
                "in memory until durable storage lands (a later issue): every durability "
                "class is accepted and reported, and nothing survives a restart yet."
            ),
        ] = Path("waymark-data"),
        heartbeat_s: Annotated[
            float, typer.Option(help="Seconds of silence before an SSE heartbeat comment.")
        ] = 15.0,
    ) -> None:
        """Serve the topic log over HTTP until SIGINT or SIGTERM."""
        from waymark.server import App, Settings
        from waymark.server.serving import Server, listen

        data_dir.mkdir(parents=True, exist_ok=True)
        sock = listen(host, port)
        server = Server(App(settings=Settings(heartbeat_s=heartbeat_s)))
        shown = f"[{host}]" if ":" in host else host
        # Printed once the socket is bound, so a parent process can wait for this line.
        typer.echo(f"waymark listening on http://{shown}:{sock.getsockname()[1]}")
        server.run(sockets=[sock])
        typer.echo("waymark stopped")
