"""Scopes: what a bearer token may do (docs/security.md).

A token holds scopes ``read:<glob>``, ``write:<glob>``, ``delete:<glob>``,
``queue:<glob>`` (each over topic names, in the one glob syntax of
:mod:`waymark.protocol.globs`, docs/globs.md) and
``admin``. Every endpoint of the table names the one scope kind it needs
(``Endpoint.scope``); a route with a ``{topic}`` needs that kind with a glob matching
the topic, a route without one needs that kind for some topic. Two kinds are not held
but describe who may call: ``open`` (anyone, no token) and ``token`` (any valid token).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from msgspec import Struct

from waymark.protocol.globs import glob_matches


class ScopeKind(StrEnum):
    OPEN = "open"  # no token needed
    TOKEN = "token"  # any valid token
    READ = "read"
    WRITE = "write"
    DELETE = "delete"
    QUEUE = "queue"  # claim, ack, nack, extend, redrive, /work
    ADMIN = "admin"  # topic config, drop, routers, /metrics


TOPIC_KINDS = (ScopeKind.READ, ScopeKind.WRITE, ScopeKind.DELETE, ScopeKind.QUEUE)
ALL_SCOPES = ("admin", "read:*", "write:*", "delete:*", "queue:*")
"""What a caller may do when the server runs without tokens."""


@dataclass(frozen=True)
class Grant:
    """One parsed scope: a kind and, for topic kinds, a glob over topic names."""

    kind: ScopeKind
    glob: str = ""

    @classmethod
    def parse(cls, text: str) -> Grant:
        """``admin`` or ``<kind>:<glob>``; ValueError for anything else."""
        if text == ScopeKind.ADMIN:
            return cls(ScopeKind.ADMIN)
        kind, sep, glob = text.partition(":")
        if not sep or not glob or kind not in {k.value for k in TOPIC_KINDS}:
            raise ValueError(
                f"a scope is admin or read|write|delete|queue:<topic glob>, not {text!r}"
            )
        return cls(ScopeKind(kind), glob)

    def __str__(self) -> str:
        return self.kind.value if self.kind is ScopeKind.ADMIN else f"{self.kind}:{self.glob}"


def allows(grants: tuple[Grant, ...], kind: ScopeKind, topic: str | None) -> bool:
    """Whether ``grants`` permit an endpoint needing ``kind``, on ``topic`` if it names
    one (else on some topic)."""
    if kind is ScopeKind.OPEN or kind is ScopeKind.TOKEN:
        return True
    for grant in grants:
        if grant.kind is ScopeKind.ADMIN:  # every scope, like Kafka's super users
            return True
        if grant.kind is kind and (topic is None or glob_matches(grant.glob, topic)):
            return True
    return False


class WhoAmI(Struct):
    """``GET /v0/auth/whoami``: the calling token. With auth off: no name, every scope."""

    name: str | None
    scopes: list[str]
    auth: bool
