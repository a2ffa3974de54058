"""Expected failures of any ``waymark`` command as one line and an exit code (docs/cli.md,
"Exit codes").

:func:`guarded` runs the typer app; an exception that escapes a command is looked up
here (by the client's HTTP status and error code, by kind for the packages' errors)
and, when it is an expected failure (a refusal, an unreachable server, a busy port,
something absent, damaged data), printed as ``waymark: <what> — <hint>`` on stderr
with its exit code. Anything else is a bug: its traceback is shown, exit 1.

No package is imported to classify an exception: a class is only looked up when its
module is already loaded (an exception of a module never imported cannot be raised),
so the start-up stays light (docs/cli.md, "Start-up").
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

EXIT_UNEXPECTED = 1  # a bug: the traceback is shown
EXIT_USAGE = 2  # bad arguments or options (click's own code), a bad file given
EXIT_DATA_LOSS = 3  # data lost or damaged: announced, never skipped silently
EXIT_NOT_FOUND = 4  # a topic, router, artifact... that does not exist
EXIT_REFUSED = 5  # refused: auth, invalid request, conflict, a limit, a busy port
EXIT_UNAVAILABLE = 6  # no answer: connection refused, a timeout, 503; retrying may help

TOKEN_HINT = "pass --token or set WAYMARK_TOKEN"
URL_HINT = "is a waymark server running there? (--url or WAYMARK_URL)"

# The server a command talks to, set by the shared --url option (waymark.cli.options):
# a refusal names it.
server_url: str | None = None


class Failure(Exception):
    """An expected failure a command raises itself: ``message`` (with its hint) and
    ``code``, printed as one line."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.message, self.code = message, code


@contextmanager
def guarded() -> Iterator[None]:
    """Run the body (the typer app); turn an expected failure into one line on stderr
    and its exit code, let anything else through with its traceback."""
    try:
        yield
    except Exception as exc:
        found = explain(exc)
        if found is None:
            raise
        code, line = found
        sys.stderr.write(f"waymark: {line}\n")
        sys.stderr.flush()
        raise SystemExit(code) from None


def explain(exc: BaseException) -> tuple[int, str] | None:
    """``(exit code, message)`` for an expected failure, None for a bug. An exception
    group is explained by its first member when all its members are expected; an
    exception raised ``from`` an expected one, by the cause."""
    if isinstance(exc, BaseExceptionGroup):
        members = [explain(e) for e in exc.exceptions]
        return None if not members or None in members else members[0]
    for explainer in _EXPLAINERS:
        found = explainer(exc)
        if found is not None:
            return found
    if exc.__cause__ is not None and exc.__cause__ is not exc:
        return explain(exc.__cause__)
    return None


def _loaded(module: str, name: str) -> type[BaseException] | None:
    """The class ``module.name`` if that module is imported already, else None."""
    found = sys.modules.get(module)
    cls: Any = getattr(found, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None


def _is(exc: BaseException, module: str, name: str) -> bool:
    cls = _loaded(module, name)
    return cls is not None and isinstance(exc, cls)


def _where() -> str:
    return f" by {server_url}" if server_url else ""


def _failure(exc: BaseException) -> tuple[int, str] | None:
    return (exc.code, exc.message) if isinstance(exc, Failure) else None


def _api(exc: BaseException) -> tuple[int, str] | None:
    """A refusal by the server: its status decides the exit code, its code and message
    are shown, with a hint where there is an obvious next step."""
    if not _is(exc, "waymark.client.errors", "ApiError"):
        return None
    status: int = getattr(exc, "status", 0)
    code = str(getattr(exc, "code", "http_error"))
    message: str = getattr(exc, "message", "")
    what = f"{code}: {message}" if message else code
    if status == 401:
        return EXIT_REFUSED, f"refused{_where()}: {what} — {TOKEN_HINT}"
    if status == 403:
        return EXIT_REFUSED, f"refused{_where()}: {what} — the token lacks this scope"
    if status == 404:
        return EXIT_NOT_FOUND, f"not found{_where()}: {what}"
    if status in (408, 429) and code not in ("too_many_topics", "staging_full"):
        return EXIT_UNAVAILABLE, f"unavailable{_where()}: {what} — try again later"
    if status >= 500:
        hint = "see the server's log" if status == 500 else "try again later"
        return EXIT_UNAVAILABLE, f"unavailable{_where()}: {status} {what} — {hint}"
    return EXIT_REFUSED, f"refused{_where()}: {what}"


def _transport(exc: BaseException) -> tuple[int, str] | None:
    """No answer from the server (the client's TransportError), or a connection refused
    or reset in any library. Not a BrokenPipeError: that is our stdout's reader gone."""
    client = _is(exc, "waymark.client.errors", "TransportError")
    peer = (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError)
    if not client and not isinstance(exc, peer):
        return None
    where = f" {server_url}" if server_url else " the server"
    if _is(exc, "waymark.client.errors", "TransportTimeout"):
        return EXIT_UNAVAILABLE, f"no answer from{where} in time: {exc} — try again later"
    return EXIT_UNAVAILABLE, f"cannot reach{where}: {exc} — {URL_HINT}"


def _bind(exc: BaseException) -> tuple[int, str] | None:
    """A listening socket that cannot be bound (``serve --port``, ``--metrics-port``)."""
    if not isinstance(exc, OSError):
        return None
    if exc.errno == errno.EADDRINUSE:
        return EXIT_REFUSED, f"{exc.strerror}: another process listens there — pick another port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return EXIT_REFUSED, f"{exc.strerror}: not an address of this machine (--host)"
    return None


def _packages(exc: BaseException) -> tuple[int, str] | None:
    """The packages' own expected failures, by kind (each module's docs say when)."""
    name = type(exc).__name__
    # damaged or lost data (docs/semantics/kv.md §9.3, the log's recovery)
    for module, cls in (("waymark.kv.errors", "ArtifactInvalid"),
                        ("waymark.kv.errors", "CursorExpired"),
                        ("waymark.kv.errors", "Corrupted"),
                        ("waymark.kv.errors", "InvalidFormat"),
                        ("waymark.log.storage.segment", "SegmentError"),
                        ("waymark.log.storage.frames", "CorruptFrame")):  # fmt: skip
        if _is(exc, module, cls):
            return EXIT_DATA_LOSS, f"{name}: {exc}"
    for module, cls in (("waymark.kv.errors", "ArtifactUnavailable"),
                        ("waymark.kv.errors", "BucketNotFound"),
                        ("waymark.objstore.types", "ObjectNotFound")):  # fmt: skip
        if _is(exc, module, cls):
            return EXIT_NOT_FOUND, f"{name}: {exc}"
    for module, cls in (("waymark.kv.errors", "KvConnectionError"),
                        ("waymark.kv.errors", "Timeout"),
                        ("waymark.objstore.types", "ObjectStoreError"),
                        ("waymark.checkpoint.shipper", "RetriesExhausted"),
                        ("waymark.pipeline.placement", "EdgeUnavailable"),
                        ("waymark.pipeline.stage", "SinkUnavailable")):  # fmt: skip
        if _is(exc, module, cls):
            return EXIT_UNAVAILABLE, f"{name}: {exc} — try again later"
    for module, cls in (("waymark.kv.errors", "StoreInUse"),
                        ("waymark.recovery.types", "RecoveryError")):  # fmt: skip
        if _is(exc, module, cls):
            return EXIT_REFUSED, f"{name}: {exc}"
    if _is(exc, "waymark.server.auth", "TokenFileError"):  # a file the user named
        return EXIT_USAGE, f"{name}: {exc}"
    return None


_EXPLAINERS = (_failure, _api, _transport, _bind, _packages)
