"""The client the Spark source and sinks talk to a waymark server with.

Its own module (re-exported as ``waymark.spark.connect``) so that the source and the
sinks import it without importing the package that imports them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..client import Client


def connect(url: str, token: str | None = None, ca_file: str | None = None) -> Client:
    """The waymark client the source and the sinks talk to ``url`` with (driver and
    executors alike): a page or a stage may take a while, a dead server should not.
    ``token`` and ``ca_file`` are the ``token`` and ``caFile`` options, for a server
    with tokens or TLS (docs/security.md); without ``token`` the WAYMARK_TOKEN
    environment variable is used."""
    return Client(url, timeout=60.0, connect_timeout=10.0, token=token, ca_file=ca_file)


def token_option(options: Mapping[str, str]) -> str | None:
    """The ``token`` option, else the driver's ``WAYMARK_TOKEN``: resolved where the
    options are read (the driver) and carried to the tasks with the plan, because an
    executor on another machine does not have the driver's environment (docs/spark.md,
    "Running on a cluster")."""
    return options.get("token") or os.environ.get("WAYMARK_TOKEN") or None
