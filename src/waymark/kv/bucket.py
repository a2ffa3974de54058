"""A named bucket and the three roles it vends: reader, writer, watcher.

``KvStore`` holds no socket of its own; it borrows the connection's client.
Every NATS operation runs under the connection's timeout.
"""

from __future__ import annotations

import asyncio
import calendar
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import nats.js.errors
from nats.js import api

from waymark.kv.consumer import (
    END,
    HEARTBEAT,
    ConsumerLost,
    ConsumerSpec,
    Failed,
    OrderedFeed,
    update_op,
)
from waymark.kv.deadline import timed
from waymark.kv.errors import AlreadyExists, BucketNotFound, KvError, RevisionMismatch, Timeout
from waymark.kv.types import KvEntry, KvUpdate, Op, VersionToken

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from waymark.kv.connection import Connection
    from waymark.kv.watcher import KvWatcher

_WRONG_LAST_SEQUENCE = (10071, 10164)
_STREAM_EXISTS = 10058
_LISTING_ATTEMPTS = 5
"""Fresh consumers a scan/keys tries, each after losing the last, before it fails."""


@dataclass(frozen=True)
class StoreConfig:
    """Bucket settings, used only when the bucket is created; an existing bucket is used as is."""

    max_bytes: int | None = 10 * 1024 * 1024
    max_history: int = 1
    num_replicas: int = 1
    max_age: float | None = None


class KvStore:
    def __init__(
        self,
        connection: Connection,
        name: str,
        js: JetStreamContext,
        *,
        direct: bool,
        replicas: int = 1,
    ) -> None:
        self.connection = connection
        self.direct = direct
        self.replicas = (
            replicas  # copies a cluster keeps of the bucket (docs/kv.md, "On a NATS cluster")
        )
        self.name = name
        self.stream = f"KV_{name}"
        self.subject_prefix = f"$KV.{name}."
        self.js = js
        self.timeout = connection.config.timeout
        self.reset_attempts = connection.config.reset_attempts

    @classmethod
    async def open(
        cls, connection: Connection, name: str, config: StoreConfig, *, create: bool = True
    ) -> KvStore:
        js = connection.client.jetstream(timeout=connection.config.timeout)
        t = connection.config.timeout
        try:
            info = await timed(js.stream_info(f"KV_{name}"), t, f"open bucket {name}")
        except nats.js.errors.NotFoundError:
            if not create:
                raise BucketNotFound(f"bucket {name} does not exist") from None
            kv_config = api.KeyValueConfig(
                bucket=name,
                history=config.max_history,
                max_bytes=config.max_bytes or -1,
                replicas=config.num_replicas,
                ttl=config.max_age,
            )
            try:
                await timed(js.create_key_value(config=kv_config), t, f"create bucket {name}")
            except nats.js.errors.BadRequestError as e:
                if e.err_code != _STREAM_EXISTS:  # a concurrent creator won: use theirs
                    raise KvError(f"cannot create bucket {name}: {e}") from e
            info = await timed(js.stream_info(f"KV_{name}"), t, f"open bucket {name}")
        return cls(
            connection,
            name,
            js,
            direct=bool(info.config.allow_direct),
            replicas=info.config.num_replicas or 1,
        )

    def reader(self) -> KvReader:
        return KvReader(self)

    def writer(self) -> KvWriter:
        return KvWriter(self)

    def watcher(self) -> KvWatcher:
        from waymark.kv.watcher import KvWatcher

        return KvWatcher(self)

    async def generation(self) -> int:
        """This instance of the bucket: its stream's creation time in microseconds.
        A bucket deleted and recreated under the same name is a new generation, whose
        revisions start over (docs/semantics/kv.md §11.2)."""
        info = await timed(self.js.stream_info(self.stream), self.timeout, "stream info")
        created = info.created
        if created is None:
            return 0
        return calendar.timegm(created.utctimetuple()) * 1_000_000 + created.microsecond

    async def stream_bounds(self) -> tuple[int, int]:
        """(first_sequence, last_sequence) of the bucket's stream."""
        info = await timed(self.js.stream_info(self.stream), self.timeout, "stream info")
        return info.state.first_seq, info.state.last_seq

    def filters(self, prefixes: Sequence[str]) -> tuple[str, ...]:
        if not prefixes:
            return (f"{self.subject_prefix}>",)
        return tuple(f"{self.subject_prefix}{p}>" for p in prefixes)


def _is_tombstone(headers: dict[str, str] | None, value: bytes) -> bool:
    return update_op(headers) is not Op.PUT or not value


class KvReader:
    """Point-in-time reads. ``get``/``scan``/``keys`` hide tombstones; ``entry`` shows them."""

    def __init__(self, store: KvStore) -> None:
        self._s = store

    async def _last_msg(self, key: str) -> tuple[dict[str, str] | None, bytes, int] | None:
        s = self._s
        try:
            msg = await timed(
                s.js.get_msg(s.stream, subject=f"{s.subject_prefix}{key}", direct=s.direct),
                s.timeout,
                f"get {key}",
            )
        except nats.js.errors.NotFoundError:
            return None
        # A message read back from the stream always has its seq (the stubs allow None).
        return msg.headers, msg.data or b"", cast(int, msg.seq)

    async def get(self, key: str) -> KvEntry | None:
        hit = await self._last_msg(key)
        if hit is None or _is_tombstone(hit[0], hit[1]):
            return None
        return KvEntry(key, hit[1], VersionToken.from_u64(hit[2]))

    async def entry(self, key: str) -> KvEntry | None:
        """The key's latest message, tombstones included (empty value), for CAS callers."""
        hit = await self._last_msg(key)
        if hit is None:
            return None
        value = b"" if _is_tombstone(hit[0], hit[1]) else hit[1]
        return KvEntry(key, value, VersionToken.from_u64(hit[2]))

    async def scan(self, prefix: str | Sequence[str] = "") -> list[KvEntry]:
        """Live entries under the prefix(es), in stream order, from one consumer."""
        return [
            KvEntry(u.key, u.value, u.version)
            for u in await self._last_per_subject(prefix, headers_only=False)
        ]

    async def keys(self, prefix: str | Sequence[str] = "") -> list[str]:
        """Live keys under the prefix(es); headers only, so no value bytes cross the wire."""
        return [u.key for u in await self._last_per_subject(prefix, headers_only=True)]

    async def _last_per_subject(
        self, prefix: str | Sequence[str], *, headers_only: bool
    ) -> list[KvUpdate]:
        s = self._s
        prefixes = [prefix] if isinstance(prefix, str) else list(prefix)
        spec = ConsumerSpec(
            s.stream,
            s.subject_prefix,
            s.filters([p for p in prefixes if p]),
            api.DeliverPolicy.LAST_PER_SUBJECT,
            headers_only=headers_only,
        )
        # A lost consumer cannot be resumed from a sequence (that would list
        # every later revision, not the last per key): discard what it listed
        # and list again from a fresh one.
        lost: ConsumerLost | None = None
        for _ in range(_LISTING_ATTEMPTS):
            try:
                return await self._list(spec)
            except ConsumerLost as e:
                lost = e
        raise KvError(
            f"listing failed: {_LISTING_ATTEMPTS} consumers lost in a row ({lost})"
        ) from lost

    async def _list(self, spec: ConsumerSpec) -> list[KvUpdate]:
        """One point-in-time listing through one last-per-subject consumer."""
        s = self._s
        headers_only = spec.headers_only
        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=64)
        # Heartbeats well within the timeout: an idle one finds a listing stuck on
        # messages removed under it (consumer.listing_stuck), and the listing starts
        # over, before the wait for the next chunk gives up (docs/semantics/kv.md §4.4).
        feed = OrderedFeed(
            s.js,
            spec,
            queue,
            chunk_max=1024,
            timeout=s.timeout,
            heartbeat=min(HEARTBEAT, s.timeout / 4),
            resumable=False,
        )
        await feed.start()
        out: list[KvUpdate] = []
        try:
            # The consumer starts with one pending message per matching key;
            # once that many arrived the point-in-time listing is complete.
            remaining = feed.initial_pending
            while remaining > 0:
                try:  # not wait_for: it can swallow a cancel (deadline.timed)
                    async with asyncio.timeout(s.timeout):
                        item = await queue.get()
                except TimeoutError:
                    raise Timeout(f"scan stalled for {s.timeout:g}s") from None
                if isinstance(item, Failed):
                    raise item.error
                if item is END:
                    break
                chunk: list[KvUpdate] = item  # type: ignore[assignment]
                remaining -= len(chunk)
                out.extend(u for u in chunk if u.op is Op.PUT and (headers_only or u.value))
        finally:
            await feed.stop()
        return out


class KvWriter:
    """Writes, soft deletes and CAS. No multi-key transactions."""

    def __init__(self, store: KvStore) -> None:
        self._s = store

    async def _publish(self, key: str, value: bytes, headers: dict[str, str] | None) -> int:
        s = self._s
        try:
            ack = await timed(
                s.js.publish(f"{s.subject_prefix}{key}", value, headers=headers),
                s.timeout,
                f"write {key}",
            )
        except nats.js.errors.APIError as e:
            if e.err_code in _WRONG_LAST_SEQUENCE:
                raise RevisionMismatch(f"{key}: {e.description}") from e
            raise KvError(f"write {key} failed: {e}") from e
        return ack.seq

    async def put(self, key: str, value: bytes) -> VersionToken:
        return VersionToken.from_u64(await self._publish(key, value, None))

    async def delete(self, key: str) -> bool:
        """Soft delete: a ``KV-Operation: DEL`` marker. Always True."""
        await self._publish(key, b"", {"KV-Operation": "DEL"})
        return True

    async def update(self, key: str, value: bytes, version: VersionToken) -> VersionToken:
        """Write only if the key's latest revision is ``version``; else RevisionMismatch."""
        expected = version.as_u64()
        if expected is None:
            raise RevisionMismatch(f"{key}: version {version.raw!r} is not a NATS revision")
        headers: dict[str, str] = {api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(expected)}
        return VersionToken.from_u64(await self._publish(key, value, headers))

    async def create(self, key: str, value: bytes) -> VersionToken:
        """Write only if the key has no live value (absent, deleted or CAS-tombstoned)."""
        try:
            return await self.update(key, value, VersionToken.from_u64(0))
        except RevisionMismatch:
            current = await KvReader(self._s).entry(key)
            if current is None or current.value:
                raise AlreadyExists(key) from None
            try:  # the key holds a tombstone: take its place, still by CAS
                return await self.update(key, value, current.version)
            except RevisionMismatch:
                raise AlreadyExists(key) from None

    async def delete_with_version(self, key: str, version: VersionToken) -> bool:
        """CAS delete: an empty value written by CAS, so concurrent writers see the conflict."""
        await self.update(key, b"", version)
        return True
