"""Topic configuration (docs/semantics/topics.md §2.2): the fields, their defaults, validation
and upsert.

A :class:`ConfigPatch` is what a client sends (every field optional); a
:class:`TopicConfig` is the resolved configuration a topic runs with.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

NonNegative = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Positive = Annotated[int, Meta(ge=1, le=2**63 - 1)]
# A dead-letter target is an ordinary topic, named by the same rule as any topic.
TopicName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$")]


class Discard(StrEnum):
    OLD = "old"
    REJECT = "reject"


class Durability(StrEnum):
    """The four commit classes, weakest first."""

    EPHEMERAL = "ephemeral"
    MEMORY = "memory"
    DISK = "disk"
    FSYNC = "fsync"


class TopicType(StrEnum):
    LOG = "log"
    QUEUE = "queue"


class ConfigPatch(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Config fields a request sets; absent fields keep their current value."""

    ttl_ms: NonNegative | UnsetType = UNSET
    cap_records: NonNegative | UnsetType = UNSET
    cap_bytes: NonNegative | UnsetType = UNSET
    discard: Discard | UnsetType = UNSET
    durable: bool | UnsetType = UNSET
    durability: Durability | UnsetType | None = UNSET
    priority: Annotated[int, Meta(ge=-2 ** 31, le=2 ** 31 - 1)] | UnsetType | None = UNSET
    auto_priority: bool | UnsetType = UNSET
    auto_create: bool | UnsetType = UNSET
    idempotency_window_ms: NonNegative | UnsetType = UNSET
    dedupe_node: bool | UnsetType = UNSET
    # --- queues (docs/semantics/topics.md §10); accepted on any topic, used only by "queue" ---
    lease_ms: Positive | UnsetType = UNSET
    max_deliveries: NonNegative | UnsetType = UNSET
    dead_letter: TopicName | UnsetType | None = UNSET
    claim_jitter_ms: NonNegative | UnsetType = UNSET
    leases_durable: bool | UnsetType = UNSET


class TopicConfig(msgspec.Struct, frozen=True):
    """The resolved configuration of one topic."""

    ttl_ms: int = 0
    cap_records: int = 0
    cap_bytes: int = 0
    discard: Discard = Discard.OLD
    durability: Durability = Durability.DISK
    priority: int | None = None
    auto_priority: bool = True
    auto_create: bool = True
    idempotency_window_ms: int = 120_000
    dedupe_node: bool = True
    # --- queues (docs/semantics/topics.md §10) ---
    lease_ms: int = 30_000  # a claim's lease (the visibility timeout) unless it names one
    max_deliveries: int = 0  # 0: reclaimed indefinitely; n: the (n+1)-th delivery dead-letters
    dead_letter: str | None = None
    claim_jitter_ms: int = 0  # 0: greedy claims; > 0: the coalescing window of a cohort
    leases_durable: bool = False  # the leases log follows the jobs' class instead of memory

    @property
    def durable(self) -> bool:
        # docs/semantics/topics.md §2.2: durable is normalised to "the class is fsync".
        return self.durability is Durability.FSYNC

    def apply(self, patch: ConfigPatch) -> TopicConfig:
        """This config with ``patch`` applied (upsert semantics)."""
        changes: dict[str, Any] = {
            f: getattr(patch, f)
            for f in patch.__struct_fields__
            if f not in ("durable", "durability") and getattr(patch, f) is not UNSET
        }
        # An explicit durability wins; a bare `durable` picks fsync or disk
        # (docs/semantics/topics.md §2.2).
        if patch.durability is not UNSET and patch.durability is not None:
            changes["durability"] = patch.durability
        elif patch.durable is not UNSET:
            changes["durability"] = Durability.FSYNC if patch.durable else Durability.DISK
        elif patch.durability is None:
            changes["durability"] = Durability.DISK
        return msgspec.structs.replace(self, **changes) if changes else self

    def to_wire(self) -> dict[str, Any]:
        return {
            "ttl_ms": self.ttl_ms,
            "cap_records": self.cap_records,
            "cap_bytes": self.cap_bytes,
            "discard": str(self.discard),
            "durable": self.durable,
            "durability": str(self.durability),
            "priority": self.priority,
            "auto_priority": self.auto_priority,
            "auto_create": self.auto_create,
            "idempotency_window_ms": self.idempotency_window_ms,
            "dedupe_node": self.dedupe_node,
        }

    def queue_wire(self) -> dict[str, Any]:
        """The queue fields (docs/semantics/topics.md §10), reported on queue topics only."""
        return {
            "lease_ms": self.lease_ms,
            "max_deliveries": self.max_deliveries,
            "dead_letter": self.dead_letter,
            "claim_jitter_ms": self.claim_jitter_ms,
            "leases_durable": self.leases_durable,
        }
