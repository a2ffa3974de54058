"""Python client for the waymark HTTP /v0 API: :class:`Client` (blocking) and
:class:`AsyncClient` (asyncio), with the same typed calls, SSE included.

It stands alone: it loads the wire contract (:mod:`waymark.protocol`) and httpx,
never the engine or the server. The contract's types are re-exported here.
"""

from ..protocol import (
    AckResponse,
    AppendResponse,
    ConfigPatch,
    ConfigView,
    DeleteResponse,
    DiffResponse,
    ErrorCode,
    ExtendResponse,
    Health,
    Job,
    NackResponse,
    OpenWriterResponse,
    PublishResponse,
    Record,
    RecordIn,
    RedriveResponse,
    RouterFilter,
    RouterOut,
    StagedPart,
    StageResponse,
    Tombstone,
    TombstoneReason,
    TopicState,
    TopicType,
)
from .aio import AsyncClient
from .errors import ApiError
from .events import RecordEvent, TombstoneEvent, WatchEvent
from .sync import Client
from .tables import TopicGap

__all__ = [
    "AckResponse",
    "ApiError",
    "AppendResponse",
    "AsyncClient",
    "Client",
    "ConfigPatch",
    "ConfigView",
    "DeleteResponse",
    "DiffResponse",
    "ErrorCode",
    "ExtendResponse",
    "Health",
    "Job",
    "NackResponse",
    "OpenWriterResponse",
    "PublishResponse",
    "Record",
    "RecordEvent",
    "RecordIn",
    "RedriveResponse",
    "RouterFilter",
    "RouterOut",
    "StageResponse",
    "StagedPart",
    "Tombstone",
    "TombstoneEvent",
    "TombstoneReason",
    "TopicGap",
    "TopicState",
    "TopicType",
    "WatchEvent",
]
