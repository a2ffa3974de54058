"""Connection lifecycle: connect, health, shutdown, and the bucket factory.

NEW -> connect() -> CONNECTED -> shutdown() -> SHUTDOWN -> connect() again.
Health follows nats-py's connection events, so ``is_healthy`` is a plain read.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client, RawCredentials

from waymark.kv.bucket import KvStore, StoreConfig
from waymark.kv.deadline import timed
from waymark.kv.errors import KvConnectionError, Timeout

DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class NatsConnectionConfig:
    """Where and how to connect.

    ``url`` may name several servers of one cluster, comma-separated: the client
    connects to any of them and moves to another when its server goes away
    (docs/kv.md, "On a NATS cluster").

    Credentials priority: ``creds`` (base64 of a .creds file, for containers
    without a file mount) > ``creds_file`` > ``user:pass@`` in the URL > none.

    ``reset_attempts``: how many times a watch tries to recreate a lost consumer
    while the attempts fail transiently (a timeout, no responders, a cluster
    electing a leader) before it fails with ``WatchError``; None, the default,
    tries until it succeeds, as nats.go's ordered consumer does (docs/kv.md,
    "On a NATS cluster").
    """

    url: str = "nats://127.0.0.1:4222"
    creds: str | None = None
    creds_file: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    name: str = "waymark-kv"
    reset_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.reset_attempts is not None and self.reset_attempts < 1:
            raise ValueError(
                f"reset_attempts must be at least 1 (or None), not {self.reset_attempts}"
            )


@dataclass(frozen=True)
class ConnectionCapabilities:
    """Advisory feature flags, for callers that branch on what the backend offers."""

    cas: bool = True
    streaming_watch: bool = True
    resume_from_revision: bool = True
    multi_prefix_watch: bool = True


class Connection:
    """A NATS connection with JetStream; vends :class:`KvStore` handles for buckets."""

    capabilities = ConnectionCapabilities()

    def __init__(self, config: NatsConnectionConfig | None = None) -> None:
        self.config = config or NatsConnectionConfig()
        self._nc: Client | None = None
        self._healthy = False
        self._lock = asyncio.Lock()

    @property
    def servers(self) -> list[str]:
        """The server URLs ``url`` names."""
        return [u.strip() for u in self.config.url.split(",") if u.strip()]

    def _credentials(self) -> dict[str, Any]:
        if self.config.creds:
            text = base64.b64decode(self.config.creds).decode()
            return {"user_credentials": RawCredentials(text)}
        if self.config.creds_file:
            return {"user_credentials": self.config.creds_file}
        return {}

    async def connect(self) -> None:
        # The lock closes the concurrent-connect race: the second caller finds
        # the first one's connection instead of dialling its own.
        async with self._lock:
            if self._nc is not None and self._nc.is_connected:
                return

            async def on_disconnect() -> None:
                self._healthy = False

            async def on_reconnect() -> None:
                self._healthy = True

            async def on_error(e: Exception) -> None:
                return None  # surfaced through operation errors and health instead

            try:
                self._nc = await timed(
                    nats.connect(
                        self.servers,
                        name=self.config.name,
                        connect_timeout=min(self.config.timeout, 5.0),
                        max_reconnect_attempts=-1,
                        disconnected_cb=on_disconnect,
                        reconnected_cb=on_reconnect,
                        closed_cb=on_disconnect,
                        error_cb=on_error,
                        **self._credentials(),
                    ),
                    self.config.timeout,
                    f"connect to {self.config.url}",
                )
            except Timeout:
                raise
            except Exception as e:
                raise KvConnectionError(f"cannot connect to {self.config.url}: {e}") from e
            self._healthy = True

    def is_healthy(self) -> bool:
        return self._healthy and self._nc is not None and self._nc.is_connected

    @property
    def client(self) -> Client:
        if self._nc is None or self._nc.is_closed:
            raise KvConnectionError("not connected (call connect() first)")
        return self._nc

    async def store(
        self, bucket: str, config: StoreConfig | None = None, *, create: bool = True
    ) -> KvStore:
        """Open the bucket, creating it with ``config`` if it does not exist; with
        ``create=False`` a missing bucket raises BucketNotFound instead."""
        return await KvStore.open(self, bucket, config or StoreConfig(), create=create)

    async def shutdown(self) -> None:
        async with self._lock:
            nc, self._nc = self._nc, None
            self._healthy = False
            if nc is not None and not nc.is_closed:
                try:
                    await timed(nc.drain(), self.config.timeout, "drain")
                except Exception:
                    await nc.close()

    async def __aenter__(self) -> Connection:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()
