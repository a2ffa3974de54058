"""The engine's sections of the server's configuration (docs/architecture.md, "Where a
new thing goes"): where its data lives, what it enforces, and its change checkpoints.

:class:`waymark.server.config.ServerConfig` holds them beside the HTTP sections;
:func:`waymark.log.storage.restore.open_engine` takes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..protocol import Limits, TopicConfig


@dataclass(frozen=True)
class StorageConfig:
    """Where the engine keeps its data and how it seals it (docs/durability.md)."""

    data_dir: Path = Path("waymark-data")  # the WAL, segments and catalog
    wal_shards: int = 2  # WAL files written in parallel; a topic always uses one
    cold_dir: Path | None = None  # sealed segments past hot_segments move here
    hot_segments: int = 4  # segments per topic kept in data_dir when cold_dir is set
    seal_interval_s: float = 10.0  # between seals, taken only when something was written


@dataclass(frozen=True)
class EngineConfig:
    """What the engine enforces. ``limits`` are the wire contract's
    (docs/semantics/topics.md §1.2): the values a client may also need to know."""

    limits: Limits = field(default_factory=Limits)
    defaults: TopicConfig | None = None  # a new topic's config (None: the protocol's)
    # An idle topic's seq ceiling is lowered to its head this often (docs/durability.md).
    ceiling_trim_s: float = 0.05


@dataclass(frozen=True)
class ChangesConfig:
    """Change checkpoints (docs/semantics/recovery.md §1)."""

    checkpoint_interval_s: float = 1.0  # one per interval that committed something; 0: none
    recovery_window_s: float = 86_400.0  # how long checkpoints are kept

    @property
    def tracked(self) -> bool:
        """Whether the engine notes committed changes at all."""
        return self.checkpoint_interval_s > 0

    @property
    def window_ms(self) -> int:
        return int(self.recovery_window_s * 1000)
