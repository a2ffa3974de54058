"""Start ``waymark serve`` processes fast, for tests that kill and restart one hundreds
of times: this process imports the server once, then forks a child per start that runs
the ``waymark serve`` command itself (the same code, in a process of its own, killed
with a real SIGKILL). A start costs a fork and a restore, not an interpreter and its
imports (~1 s on the test machine).

Protocol, one line each way per start: the test writes the command's arguments as a
JSON list; the child writes ``pid N``, then the command's own ``waymark listening on
URL`` line.
"""

from __future__ import annotations

import json
import os
import signal
import sys

# The imports a server start needs, loaded once here instead of in every child (what
# a start imported, found by comparing sys.modules before and after one).
import pydantic  # noqa: F401  (typer's parameter handling)
import typer._adapters  # noqa: F401
import uvicorn.lifespan.on
import uvicorn.loops.uvloop
import uvicorn.protocols.websockets.auto
import uvicorn.protocols.websockets.websockets_sansio_impl  # noqa: F401
import uvloop  # noqa: F401
from typer.main import get_command

import waymark.log.storage.restore
import waymark.server
import waymark.server.serving  # noqa: F401
from waymark.cli import app


def main() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped as they end
    command = get_command(app)  # typer builds the click command once, not per start
    for line in sys.stdin:
        args = json.loads(line)
        sys.stdout.flush()
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            print(f"pid {os.getpid()}", flush=True)
            try:
                command.main(["serve", *args], standalone_mode=False)
            finally:
                sys.stdout.flush()
                os._exit(0)


if __name__ == "__main__":
    main()
