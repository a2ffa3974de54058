"""The client the Spark source and sinks talk to a waymark server with.

Its own module (re-exported as ``waymark.spark.connect``) so that the source and the
sinks import it without importing the package that imports them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..client import Client, Patience
from .options import SERVER_BUDGET, milliseconds

SERVER_BUDGET_MS = 60_000  # as Kafka's default.api.timeout.ms


def connect(
    url: str, token: str | None = None, ca_file: str | None = None, budget_s: float = 0.0
) -> Client:
    """The waymark client the source and the sinks talk to ``url`` with (driver and
    executors alike): a page or a stage may take a while, a dead server should not.
    ``token`` and ``ca_file`` are the ``token`` and ``caFile`` options, for a server
    with tokens or TLS (docs/security.md); without ``token`` the WAYMARK_TOKEN
    environment variable is used. ``budget_s`` (the ``serverBudgetMs`` option) is how
    long a request waits out a server that is down, restarting or refusing for now
    before the task or the query fails (docs/spark.md, "Server outages"); 0 fails at once."""
    patience = Patience(budget_s) if budget_s > 0 else None
    return Client(
        url, timeout=60.0, connect_timeout=10.0, token=token, ca_file=ca_file, patience=patience
    )


def server_budget_s(options: Mapping[str, str]) -> float:
    """The ``serverBudgetMs`` option in seconds (milliseconds, 0 or more)."""
    return milliseconds(options, SERVER_BUDGET, SERVER_BUDGET_MS) / 1000


def token_option(options: Mapping[str, str]) -> str | None:
    """The ``token`` option, else the driver's ``WAYMARK_TOKEN``: resolved where the
    options are read (the driver) and carried to the tasks with the plan, because an
    executor on another machine does not have the driver's environment (docs/spark.md,
    "Running on a cluster")."""
    return options.get("token") or os.environ.get("WAYMARK_TOKEN") or None
