"""Python client for the waymark HTTP /v0 API: :class:`Client` (blocking) and
:class:`AsyncClient` (asyncio), with the same typed calls, SSE included."""

from ..log import ConfigPatch, RecordIn, TombstoneReason, TopicType
from ..server.queues import AckResponse, ExtendResponse, Job, NackResponse, RedriveResponse
from ..server.routers import RouterFilter, RouterOut
from ..server.schemas import (
    AppendResponse,
    DeleteResponse,
    DiffResponse,
    Health,
    Record,
    Tombstone,
    TopicConfig,
    TopicState,
)
from .aio import AsyncClient
from .errors import ApiError
from .events import RecordEvent, TombstoneEvent, WatchEvent
from .sync import Client

__all__ = [
    "AckResponse",
    "ApiError",
    "AppendResponse",
    "AsyncClient",
    "Client",
    "ConfigPatch",
    "DeleteResponse",
    "DiffResponse",
    "ExtendResponse",
    "Health",
    "Job",
    "NackResponse",
    "Record",
    "RecordEvent",
    "RecordIn",
    "RedriveResponse",
    "RouterFilter",
    "RouterOut",
    "Tombstone",
    "TombstoneEvent",
    "TombstoneReason",
    "TopicConfig",
    "TopicState",
    "TopicType",
    "WatchEvent",
]
