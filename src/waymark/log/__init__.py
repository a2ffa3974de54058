"""The topic log: records, topics, seq, watermarks, eviction, tombstones, deletion."""

from .config import ConfigPatch, Discard, Durability, TopicConfig, TopicType
from .deletion import TagMatch
from .engine import Engine
from .errors import ErrorCode, TopicError
from .records import Limits, RecordIn, check_topic_name
from .results import AppendResult, DeleteResult, DiffResult, Tombstone, TombstoneReason, TopicState

__all__ = [
    "AppendResult",
    "ConfigPatch",
    "DeleteResult",
    "DiffResult",
    "Discard",
    "Durability",
    "Engine",
    "ErrorCode",
    "Limits",
    "RecordIn",
    "TagMatch",
    "Tombstone",
    "TombstoneReason",
    "TopicConfig",
    "TopicError",
    "TopicState",
    "TopicType",
    "check_topic_name",
]
