"""The export lease: at most one node of a fleet performs each export round.

A NATS KV key holds a :class:`LeaseRecord` whose expiry lives in the value
(no server TTL), so acquiring and taking over are plain CAS writes on any
bucket: create-only wins an empty key; an expired or unparseable record is
taken with a CAS update on the version read; a live one naming this node is
renewed the same way (its next round, or its restart with the same node id);
any other live one is someone else's.
``complete(cursor)`` stamps the exported cursor on the key (the fleet-visible
record of the last export) and ``abandon()`` frees the round early with a CAS
delete. The lease only de-duplicates work: clock skew or a takeover mid-round
can make two nodes export at once, which the pointer's monotonic swap makes
harmless. The rules: docs/semantics/kv.md §10.1 (the lease), §10.2 (not a gate).
"""

from __future__ import annotations

import logging
import math

import msgspec

from waymark.clock import Clock, SystemClock
from waymark.kv.bucket import KvReader, KvWriter
from waymark.kv.errors import AlreadyExists, RevisionMismatch
from waymark.kv.types import VersionToken, WatchCursor

log = logging.getLogger("waymark.kv")

_ACQUIRE_ATTEMPTS = 3
"""Creates tried when the lease keeps being freed between a create and the read after it."""


class LeaseRecord(msgspec.Struct, frozen=True):
    """The lease key's value (JSON). Times are Unix seconds from the holder's clock."""

    holder_id: str
    acquired_at_unix: int
    expires_at_unix: int
    completed_cursor_hex: str | None = None
    completed_at_unix: int | None = None

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def parse(cls, raw: bytes) -> LeaseRecord | None:
        """The record, or None for a value that is not one (a corrupt lease is taken over)."""
        try:
            return msgspec.json.decode(raw, type=cls)
        except msgspec.DecodeError:
            return None

    def expired(self, now_unix: int) -> bool:
        return now_unix >= self.expires_at_unix


class LeaseGuard:
    """A won round. ``complete`` or ``abandon`` it; dropped, it simply expires."""

    def __init__(
        self, lease: ExportLease, record: LeaseRecord, version: VersionToken, took_over: bool
    ) -> None:
        self.lease = lease
        self.record = record
        self.version = version
        self.took_over = took_over

    async def complete(self, cursor: WatchCursor) -> None:
        """CAS-rewrite the lease with the exported cursor; RevisionMismatch if it was taken over."""
        record = msgspec.structs.replace(
            self.record,
            completed_cursor_hex=cursor.raw.hex(),
            completed_at_unix=self.lease.now_unix(),
        )
        self.version = await self.lease.writer.update(self.lease.key, record.encode(), self.version)
        self.record = record

    async def abandon(self) -> None:
        """CAS-delete the lease so the next trigger elects a node at once."""
        await self.lease.writer.delete_with_version(self.lease.key, self.version)


class ExportLease:
    """The lease key ``key`` of a bucket, contended for as ``holder_id`` for ``ttl_s`` seconds."""

    def __init__(
        self,
        reader: KvReader,
        writer: KvWriter,
        key: str,
        holder_id: str,
        ttl_s: float,
        clock: Clock | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("the lease TTL must be positive")
        self.reader = reader
        self.writer = writer
        self.key = key
        self.holder_id = holder_id
        self.ttl_s = ttl_s
        self.clock = clock or SystemClock()

    def now_unix(self) -> int:
        return self.clock.now_ms() // 1000

    def _fresh(self) -> LeaseRecord:
        now = self.now_unix()
        return LeaseRecord(self.holder_id, now, now + math.ceil(self.ttl_s))

    async def current(self) -> LeaseRecord | None:
        entry = await self.reader.get(self.key)
        return None if entry is None else LeaseRecord.parse(entry.value)

    async def try_acquire(self) -> LeaseGuard | None:
        """The round if this node wins it; None while another holder's lease is live."""
        record = self._fresh()
        for _ in range(_ACQUIRE_ATTEMPTS):
            try:
                version = await self.writer.create(self.key, record.encode())
                return LeaseGuard(self, record, version, took_over=False)
            except AlreadyExists:
                pass
            entry = await self.reader.entry(self.key)
            if entry is None or not entry.value:
                continue  # freed since the create: contend again
            held = LeaseRecord.parse(entry.value)
            # The lease names a node, not a process: a live one naming this node is
            # renewed (its next round, or a restart with the same node id), keeping
            # the record of its last export (docs/semantics/kv.md §10.1).
            own = held is not None and held.holder_id == self.holder_id
            if held is not None and not own and not held.expired(self.now_unix()):
                return None
            if own:
                assert held is not None
                record = msgspec.structs.replace(
                    record,
                    completed_cursor_hex=held.completed_cursor_hex,
                    completed_at_unix=held.completed_at_unix,
                )
            try:
                version = await self.writer.update(self.key, record.encode(), entry.version)
            except RevisionMismatch:
                return None  # another node took it over first
            if own:
                return LeaseGuard(self, record, version, took_over=False)
            log.info(
                "export lease %s taken over from %s",
                self.key,
                "a corrupt value" if held is None else f"{held.holder_id} (expired)",
            )
            return LeaseGuard(self, record, version, took_over=True)
        return None
