"""The /v0 wire contract: every body the HTTP API takes or gives, as msgspec Structs.

This package is the one definition of the contract. The server decodes requests
into these types and builds its routes from :data:`ENDPOINTS`; the engine
(:mod:`waymark.log`) returns these types where its results are wire shapes; the
client (:mod:`waymark.client`) encodes requests and decodes answers with them;
:mod:`.openapi` generates the OpenAPI document from the same table and types.

It depends on msgspec and the standard library only, so importing it (or the
client) never loads the engine. One module per concept:

``records``    RecordIn, Record, Tombstone and its reasons, the tag match grammar
``topics``     enums, ConfigPatch, TopicConfig, ConfigView, TopicState, topic bodies
``errors``     ErrorCode with its HTTP status, the error body
``queues``     claim/ack/nack/extend/redrive bodies, the leased Job
``routers``    router bodies
``writers``    the exactly-once sink's open/stage/publish bodies
``changes``    change checkpoints (KeyChange, Checkpoint, CheckpointPage)
``reports``    fold and recovery client status reports and what the server serves back
``pipelines``  a pipeline's status (``waymark pipeline status --json``, the console's);
               a pipeline edge's page as its consumer reads it (EdgePage)
``scopes``     what a bearer token may do; the whoami body
``cursors``    the SSE ``<epoch>:<seq>`` event id
``limits``     the limits that are part of the contract
``pages``      the Arrow page: its columns and PageInfo (``arrow``, imported on its own,
               reads and writes it with pyarrow: the ``[arrow]`` extra)
``endpoints``  the endpoint table
``openapi``    the OpenAPI 3.1 document (imported on its own: only the server needs it)
"""

from .changes import (
    Checkpoint,
    CheckpointData,
    CheckpointPage,
    Covered,
    KeyChange,
    key_topic,
)
from .cursors import Cursor, format_cursor, parse_cursor
from .endpoints import ENDPOINT, ENDPOINTS, Endpoint, Health, QueryParam
from .errors import Error, ErrorBody, ErrorCode, Refusal, WaymarkError
from .limits import MAX_ARROW_DIFF_LIMIT, MAX_DIFF_LIMIT, MAX_WAIT_MS, TOPIC_NAME, Limits
from .pages import ARROW_STREAM, PAGE_COLUMNS, PageColumn, PageInfo
from .pipelines import (
    EDGE_BORN,
    EDGE_EVENT,
    EDGE_GEN,
    EDGE_ITEMS,
    LAG_HISTORY,
    EdgeMeta,
    EdgePack,
    EdgePage,
    EdgeRecord,
    LagSample,
    PipelineEdge,
    PipelineList,
    PipelinePlacement,
    PipelineReport,
    PipelineShard,
    PipelineStage,
    PipelineStatus,
    StageReport,
)
from .queues import (
    AckBody,
    AckResponse,
    ClaimBody,
    ClaimResponse,
    ExtendBody,
    ExtendResponse,
    Job,
    NackBody,
    NackResponse,
    RedriveBody,
    RedriveResponse,
)
from .records import PlainRecordIn, Record, RecordIn, TagRule, Tombstone, TombstoneReason
from .reports import (
    FoldExport,
    FoldList,
    FoldReport,
    FoldRestore,
    FoldStatus,
    FoldStopped,
    RecoveryClient,
    RecoveryClientList,
    RecoveryReport,
)
from .routers import RouterDeleted, RouterFilter, RouterList, RouterOut, RouterPut
from .scopes import ScopeKind, WhoAmI
from .topics import (
    AppendRequest,
    AppendResponse,
    ConfigPatch,
    ConfigView,
    DeadLetterError,
    DeleteRequest,
    DeleteResponse,
    DiffRequest,
    DiffResponse,
    Discard,
    Durability,
    QueueCounts,
    TopicConfig,
    TopicDeleted,
    TopicHistory,
    TopicList,
    TopicPut,
    TopicState,
    TopicType,
)
from .writers import (
    OpenWriterRequest,
    OpenWriterResponse,
    PublishRequest,
    PublishResponse,
    StagedPart,
    StageRequest,
    StageResponse,
    WriterList,
    WriterState,
    WriterTopic,
)

__all__ = [
    "ARROW_STREAM",
    "EDGE_BORN",
    "EDGE_EVENT",
    "EDGE_GEN",
    "EDGE_ITEMS",
    "ENDPOINT",
    "ENDPOINTS",
    "LAG_HISTORY",
    "MAX_ARROW_DIFF_LIMIT",
    "MAX_DIFF_LIMIT",
    "MAX_WAIT_MS",
    "PAGE_COLUMNS",
    "TOPIC_NAME",
    "AckBody",
    "AckResponse",
    "AppendRequest",
    "AppendResponse",
    "Checkpoint",
    "CheckpointData",
    "CheckpointPage",
    "ClaimBody",
    "ClaimResponse",
    "ConfigPatch",
    "ConfigView",
    "Covered",
    "Cursor",
    "DeadLetterError",
    "DeleteRequest",
    "DeleteResponse",
    "DiffRequest",
    "DiffResponse",
    "Discard",
    "Durability",
    "EdgeMeta",
    "EdgePack",
    "EdgePage",
    "EdgeRecord",
    "Endpoint",
    "Error",
    "ErrorBody",
    "ErrorCode",
    "ExtendBody",
    "ExtendResponse",
    "FoldExport",
    "FoldList",
    "FoldReport",
    "FoldRestore",
    "FoldStatus",
    "FoldStopped",
    "Health",
    "Job",
    "KeyChange",
    "LagSample",
    "Limits",
    "NackBody",
    "NackResponse",
    "OpenWriterRequest",
    "OpenWriterResponse",
    "PageColumn",
    "PageInfo",
    "PipelineEdge",
    "PipelineList",
    "PipelinePlacement",
    "PipelineReport",
    "PipelineShard",
    "PipelineStage",
    "PipelineStatus",
    "PlainRecordIn",
    "PublishRequest",
    "PublishResponse",
    "QueryParam",
    "QueueCounts",
    "Record",
    "RecordIn",
    "RecoveryClient",
    "RecoveryClientList",
    "RecoveryReport",
    "RedriveBody",
    "RedriveResponse",
    "Refusal",
    "RouterDeleted",
    "RouterFilter",
    "RouterList",
    "RouterOut",
    "RouterPut",
    "ScopeKind",
    "StageReport",
    "StageRequest",
    "StageResponse",
    "StagedPart",
    "TagRule",
    "Tombstone",
    "TombstoneReason",
    "TopicConfig",
    "TopicDeleted",
    "TopicHistory",
    "TopicList",
    "TopicPut",
    "TopicState",
    "TopicType",
    "WaymarkError",
    "WhoAmI",
    "WriterList",
    "WriterState",
    "WriterTopic",
    "format_cursor",
    "key_topic",
    "parse_cursor",
]
