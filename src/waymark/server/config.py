"""One frozen configuration of a server, in sections (docs/architecture.md, "Where a
new thing goes").

``waymark serve`` maps each flag onto one field of one section, as uvicorn's
command line maps onto its ``Config``; :class:`~waymark.server.App` takes the whole
``ServerConfig`` and :func:`~waymark.log.storage.restore.open_engine` the engine's
sections (:mod:`waymark.log.config`). A new knob is a field of the section of the part
that reads it, with the flag's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..log.config import ChangesConfig, EngineConfig, StorageConfig
from .browser import BrowserPolicy
from .delivery import ROUND_BUDGET


@dataclass(frozen=True)
class HttpConfig:
    """The listening socket, TLS, and what bounds a connection (docs/security.md, Limits;
    enforced by :mod:`waymark.server.limits`)."""

    host: str = "127.0.0.1"
    port: int = 8080  # 0 picks a free one
    tls_cert: Path | None = None  # a certificate chain (PEM): serve https
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # a client certificate signed by it is required
    header_timeout_s: float = 10.0  # 408 request_timeout; also the TLS handshake's
    max_header_bytes: int = 64 << 10  # a request line and headers larger: 431
    # 408 too: a body must arrive within this, plus a second per MIN_BODY_RATE bytes
    body_timeout_s: float = 10.0
    keep_alive_s: float = 5.0  # an idle kept-alive connection is closed after this
    max_connections: int = 1000  # 503 server_busy past this
    # 503 server_busy too: one client address holds at most this many of them
    max_connections_per_address: int = 256
    # Host and Origin checks (docs/security.md, "Browsers"); None: none (embedded apps)
    browser: BrowserPolicy | None = None


@dataclass(frozen=True)
class StreamConfig:
    """SSE streams and the delivery work that feeds them (docs/topics.md, Priority)."""

    heartbeat_s: float = 15.0  # SSE comment line when a stream is idle this long
    sse_batch: int = 500  # records read from the engine per SSE chunk
    max_streams: int = 500  # open SSE streams (watch, /work, checkpoints); 429 past it
    delivery_budget: int = ROUND_BUDGET  # delivery work per round, highest priority first


@dataclass(frozen=True)
class ConsoleConfig:
    """The web console's server side (docs/console.md)."""

    history_interval_s: float = 5.0  # append-rate history sampling ("Rate history")


@dataclass(frozen=True)
class AuthConfig:
    """Who may do what, and the record of refusals (docs/security.md)."""

    tokens: Path | None = None  # a tokens file: every route but the open ones needs one
    insecure_no_auth: bool = False  # serve a non-loopback host without tokens
    open_metrics: bool = False  # /metrics without a token
    audit_log: Path | None = None  # a JSON line per refusal and admin action ("Audit log")
    audit_log_max_bytes: int = 10 << 20  # rotated past this size


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``waymark serve`` is told, by section."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    changes: ChangesConfig = field(default_factory=ChangesConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    streams: StreamConfig = field(default_factory=StreamConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
