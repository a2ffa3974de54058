"""Python client for the waymark HTTP /v0 API: :class:`Client` (blocking) and
:class:`AsyncClient` (asyncio), with the same typed calls, SSE included."""

from ..log import ConfigPatch, RecordIn, TopicType
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
    "ApiError",
    "AppendResponse",
    "AsyncClient",
    "Client",
    "ConfigPatch",
    "DeleteResponse",
    "DiffResponse",
    "Health",
    "Record",
    "RecordEvent",
    "RecordIn",
    "Tombstone",
    "TombstoneEvent",
    "TopicConfig",
    "TopicState",
    "TopicType",
    "WatchEvent",
]
