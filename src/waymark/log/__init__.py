"""The topic log: records, topics, seq, watermarks, eviction, tombstones, deletion.

Its inputs and the results that are wire shapes are :mod:`waymark.protocol` types,
re-exported here for code that embeds the engine.
"""

from ..protocol import (
    ConfigPatch,
    DeleteResponse,
    Discard,
    Durability,
    ErrorCode,
    Limits,
    RecordIn,
    Tombstone,
    TombstoneReason,
    TopicConfig,
    TopicState,
    TopicType,
)
from .changes import CHANGES_TOPIC
from .deletion import TagMatch
from .engine import Engine
from .errors import TopicError
from .records import EncodedRecord, check_topic_name
from .results import AppendResult, DeleteResult, DiffResult

__all__ = [
    "CHANGES_TOPIC",
    "AppendResult",
    "ConfigPatch",
    "DeleteResponse",
    "DeleteResult",
    "DiffResult",
    "Discard",
    "Durability",
    "EncodedRecord",
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
