"""Python client for the waymark HTTP /v0 API: :class:`Client` (blocking) and
:class:`AsyncClient` (asyncio), with the same typed calls, SSE included.

It stands alone: it loads the wire contract (:mod:`waymark.protocol`) and speaks
HTTP/1.1 itself (docs/client.md, "Transport"), never loading the engine, the server or
httpx (only for ``http=``). The contract's types are re-exported here.
"""

from ..protocol import (
    AckResponse,
    AppendResponse,
    ConfigPatch,
    ConfigView,
    DeleteResponse,
    DiffResponse,
    Discard,
    Durability,
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
    Refusal,
    RouterFilter,
    RouterOut,
    StagedPart,
    StageResponse,
    Tombstone,
    TombstoneReason,
    TopicState,
    TopicType,
    WaymarkError,
)
from .aio import AsyncClient
from .errors import ApiError, ConnectError, TransportError, TransportTimeout
from .events import RecordEvent, TombstoneEvent, WatchEvent
from .patience import Patience
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
    "ConnectError",
    "DeleteResponse",
    "DiffResponse",
    "Discard",
    "Durability",
    "ErrorCode",
    "ExtendResponse",
    "Health",
    "Job",
    "NackResponse",
    "OpenWriterResponse",
    "Patience",
    "PublishResponse",
    "Record",
    "RecordEvent",
    "RecordIn",
    "RedriveResponse",
    "Refusal",
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
    "TransportError",
    "TransportTimeout",
    "WatchEvent",
    "WaymarkError",
]
