"""The one table of /v0 endpoints.

Each :class:`Endpoint` names its method, path template, operation id, the body it
takes and the answer it gives. The server builds its routes from this table (a
handler per operation id), :mod:`.openapi` generates the OpenAPI document from it,
and the client builds its requests from it, so a route is declared exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from msgspec import Struct

from .changes import CheckpointPage
from .limits import DEFAULT_TOPIC_PAGE, MAX_BATCH, MAX_TOPIC_PAGE
from .pages import ARROW_STREAM
from .pipelines import PipelineList, PipelineReport, PipelineStatus
from .queues import (
    AckBody,
    AckResponse,
    ClaimBody,
    ClaimResponse,
    ExtendBody,
    ExtendResponse,
    NackBody,
    NackResponse,
    RedriveBody,
    RedriveResponse,
)
from .records import RecordIn
from .reports import (
    FoldList,
    FoldReport,
    FoldStatus,
    RecoveryClient,
    RecoveryClientList,
    RecoveryReport,
)
from .routers import RouterDeleted, RouterList, RouterOut, RouterPut
from .scopes import ScopeKind, WhoAmI
from .topics import (
    AppendRequest,
    AppendResponse,
    DeleteRequest,
    DeleteResponse,
    DiffRequest,
    DiffResponse,
    TopicDeleted,
    TopicHistory,
    TopicList,
    TopicPut,
    TopicState,
)
from .writers import (
    OpenWriterRequest,
    OpenWriterResponse,
    PublishRequest,
    PublishResponse,
    StageRequest,
    StageResponse,
    WriterList,
)


class Health(Struct):
    status: Literal["ok"]


@dataclass(frozen=True)
class QueryParam:
    name: str
    schema: dict[str, Any]  # JSON Schema of the value
    description: str
    required: bool = False


@dataclass(frozen=True)
class Endpoint:
    method: str  # upper case, as HTTP sends it
    path: str  # a template: "{topic}" and "{router}" are path parameters
    operation_id: str
    summary: str
    request: Any = None  # the JSON body's type, None when it takes none
    request_required: bool = True  # False: an empty body means the defaults
    response: Any = None  # the JSON answer's type; None with ``stream``
    status: int = 200
    created: bool = False  # answers 201 instead of ``status`` when it created the resource
    errors: tuple[int, ...] = (400, 404)  # the statuses of the refusals it documents
    query: tuple[QueryParam, ...] = ()
    stream: tuple[str, str] | None = None  # a non-JSON answer: (media type, description)
    # What a caller needs (docs/security.md): required, so no route is left unguarded.
    scope: ScopeKind = field(kw_only=True)
    # Another media type of the same answer, sent when the Accept header names it:
    # (media type, description) (docs/http-api.md, "Arrow pages").
    alternate: tuple[str, str] | None = None

    def url(self, **params: str) -> str:
        """The path with ``params`` filled in, each percent-encoded as one segment."""
        return self.path.format_map({k: quote(v, safe="") for k, v in params.items()})


_SEQ = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_TOPIC = "/v0/topics/{topic}"
_ROUTER = "/v0/routers/{router}"
_QUEUE_ERRORS = (400, 404, 409)

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/v0/health", "health", "Readiness: 200 when the server serves requests",
             response=Health, errors=(), scope=ScopeKind.OPEN),
    Endpoint("GET", "/v0/auth/whoami", "whoami",
             "The calling token's name and scopes (auth false: the server has no tokens)",
             response=WhoAmI, errors=(), scope=ScopeKind.TOKEN),
    Endpoint("GET", "/v0/topics", "listTopics",
             "A page of topics' states by name (those after `after`); next_after names "
             "the next page",
             response=TopicList, errors=(400,), scope=ScopeKind.READ,
             query=(QueryParam("after", {"type": "string"},
                               "exclusive lower bound on names (a page's next_after)"),
                    QueryParam("limit", {"type": "integer", "minimum": 1,
                                         "maximum": MAX_TOPIC_PAGE},
                               f"topics per page (default {DEFAULT_TOPIC_PAGE})"))),
    # --- topics (the order of one path's methods is the order of its Allow header)
    Endpoint("PUT", _TOPIC, "putTopic",
             "Create (201) or update (200) a topic; config fields at the top level",
             request=TopicPut, request_required=False, response=TopicState, created=True,
             errors=(400, 409), scope=ScopeKind.ADMIN),
    Endpoint("GET", _TOPIC, "getTopic", "A topic's state; touch=false reads without consuming",
             response=TopicState,
             query=(QueryParam("touch", {"type": "boolean"}, "count this read as consumption"),),
             scope=ScopeKind.READ),
    Endpoint("DELETE", _TOPIC, "deleteTopic",
             "Delete a topic with its records, tag index and dedupe state",
             response=TopicDeleted, scope=ScopeKind.ADMIN),
    Endpoint("GET", f"{_TOPIC}/history", "getTopicHistory",
             "The topic's head seq and bytes sampled over the last minutes (append-rate "
             "charts); kept in memory by the server",
             response=TopicHistory, scope=ScopeKind.READ),
    Endpoint("POST", f"{_TOPIC}/records", "append",
             "Append records atomically; lazily creates the topic unless create=false",
             request=AppendRequest, response=AppendResponse, errors=(400, 404, 409, 422),
             scope=ScopeKind.WRITE),
    Endpoint("POST", f"{_TOPIC}/diff", "diff",
             "Records with $seq > from_seq (a tombstone first if live records were lost); "
             "wait_ms long-polls for new records; Accept: " + ARROW_STREAM + " answers an "
             "Arrow page",
             request=DiffRequest, response=DiffResponse[Any],
             alternate=(ARROW_STREAM, "The same page as an Arrow IPC stream: columns seq, ts, "
                        "node, tag, meta, data; the other fields as JSON in the schema metadata "
                        "key waymark.page (docs/http-api.md)"),
             scope=ScopeKind.READ),
    Endpoint("GET", f"{_TOPIC}/watch", "watch",
             "Server-Sent Events: `event: record|tombstone`, `id: <epoch>:<seq>`; resumes "
             "from Last-Event-ID; idle streams get `: heartbeat` comment lines",
             stream=("text/event-stream", "An endless event stream"),
             query=(QueryParam("from_seq", _SEQ, "exclusive lower bound; default 0"),
                    QueryParam("epoch", _SEQ, "the topic instance the cursor belongs to"),
                    QueryParam("node", {"type": "array", "items": {"type": "string"}},
                               "reader node id(s): their own records are skipped")),
             scope=ScopeKind.READ),
    Endpoint("POST", f"{_TOPIC}/delete", "deleteRecords",
             "Permanently delete records by before_seq and/or tag match (silent, "
             "point-in-time)",
             request=DeleteRequest, response=DeleteResponse, scope=ScopeKind.DELETE),
    # --- the exactly-once sink's writers
    Endpoint("POST", "/v0/writers", "openWriter",
             "Start a new run of an exactly-once writer: returns its new epoch, which fences "
             "(409 fenced) every stage and publish of earlier runs",
             request=OpenWriterRequest, response=OpenWriterResponse, errors=(400,),
             scope=ScopeKind.WRITE),
    Endpoint("GET", "/v0/writers", "listWriters",
             "Every writer's epoch and, per topic, its last published batch",
             response=WriterList, errors=(), scope=ScopeKind.READ),
    Endpoint("POST", f"{_TOPIC}/stage", "stage",
             "Stage one chunk of a task attempt's records under (writer, batch_id, partition, "
             "attempt); invisible to readers until published; unpublished stages expire",
             request=StageRequest[list[RecordIn], list[Any]], response=StageResponse,
             errors=(400, 409),
             scope=ScopeKind.WRITE),
    Endpoint("POST", f"{_TOPIC}/publish", "publish",
             "Publish the named staged parts of a batch as one atomic append (contiguous "
             "seqs); publishing an already published (writer, batch_id) returns its original "
             "seqs",
             request=PublishRequest, response=PublishResponse, errors=(400, 404, 409, 422),
             scope=ScopeKind.WRITE),
    # --- queues
    Endpoint("POST", f"{_TOPIC}/claim", "claimJobs",
             "Lease up to max jobs (reclaimed first, then fresh); 409 not_a_queue on a log",
             request=ClaimBody, response=ClaimResponse[Any], errors=_QUEUE_ERRORS,
             scope=ScopeKind.QUEUE),
    Endpoint("POST", f"{_TOPIC}/ack", "ackJobs",
             "Done: permanently delete jobs this node holds; others are skipped",
             request=AckBody, response=AckResponse, errors=_QUEUE_ERRORS, scope=ScopeKind.QUEUE),
    Endpoint("POST", f"{_TOPIC}/nack", "nackJobs",
             "Release leases early; the jobs are claimable again after delay_ms",
             request=NackBody, response=NackResponse, errors=_QUEUE_ERRORS, scope=ScopeKind.QUEUE),
    Endpoint("POST", f"{_TOPIC}/extend", "extendLeases",
             "Heartbeat: new deadline now + lease_ms; delivery counter unchanged",
             request=ExtendBody, response=ExtendResponse, errors=_QUEUE_ERRORS,
             scope=ScopeKind.QUEUE),
    Endpoint("POST", f"{_TOPIC}/redrive", "redrive",
             "Move dead letters of this queue from its dead_letter topic back into it",
             request=RedriveBody, request_required=False, response=RedriveResponse,
             errors=_QUEUE_ERRORS, scope=ScopeKind.QUEUE),
    Endpoint("GET", f"{_TOPIC}/work", "work",
             "Server-Sent Events for pushed workers: `event: job` per lease, at most max "
             "held at once; the stream joins the claim cohort",
             stream=("text/event-stream", "An endless stream of leased jobs"),
             errors=_QUEUE_ERRORS,
             query=(QueryParam("node", {"type": "string"}, "the worker's node id", True),
                    QueryParam("max", {"type": "integer", "minimum": 1, "maximum": MAX_BATCH},
                               "leases held at once (default 1)"),
                    QueryParam("lease_ms", {"type": "integer", "minimum": 1},
                               "lease length (default: the queue's lease_ms)")),
             scope=ScopeKind.QUEUE),
    # --- routers
    Endpoint("GET", "/v0/routers", "listRouters", "Every router, by name",
             response=RouterList, errors=(), scope=ScopeKind.READ),
    Endpoint("PUT", _ROUTER, "putRouter",
             "Create a router source -> dest (409 router_cycle, 409 router_dest_fan_in)",
             request=RouterPut, response=RouterOut, created=True, errors=(400, 404, 409),
             scope=ScopeKind.ADMIN),
    Endpoint("GET", _ROUTER, "getRouter", "A router and its forward cursor",
             response=RouterOut, scope=ScopeKind.READ),
    Endpoint("DELETE", _ROUTER, "deleteRouter",
             "Stop forwarding; copies already in dest remain", response=RouterDeleted,
             scope=ScopeKind.ADMIN),
    # --- change checkpoints (docs/semantics/recovery.md §1)
    Endpoint("GET", "/v0/changes/checkpoints", "listCheckpoints",
             "Change checkpoints, newest first, back to earliest_ms; a topic filter "
             "empties the changes of other topics but keeps every checkpoint's id",
             response=CheckpointPage, errors=(400,),
             query=(QueryParam("earliest_ms", _SEQ, "oldest checkpoint time wanted (ms)"),
                    QueryParam("before", _SEQ, "exclusive upper bound on ids (a page's "
                                               "next_before)"),
                    QueryParam("limit", {"type": "integer", "minimum": 1, "maximum": 1000},
                               "checkpoints per page (default 500)"),
                    QueryParam("topic", {"type": "array", "items": {"type": "string"}},
                               "only changes of these topics")),
             scope=ScopeKind.READ),
    Endpoint("GET", "/v0/changes/watch", "watchCheckpoints",
             "Server-Sent Events: `event: checkpoint`, `id: <checkpoint id>`, one per "
             "change checkpoint after `after` (or Last-Event-ID)",
             stream=("text/event-stream", "An endless stream of change checkpoints"),
             errors=(400,),
             query=(QueryParam("after", _SEQ, "exclusive lower bound on ids; default: "
                                              "from the newest on"),
                    QueryParam("topic", {"type": "array", "items": {"type": "string"}},
                               "only changes of these topics")),
             scope=ScopeKind.READ),
    # --- status reports of folds and recovery clients (docs/reports.md)
    Endpoint("POST", "/v0/folds", "reportFold",
             "A fold node's status report; the server keeps the newest per (fold, node)",
             request=FoldReport, response=FoldStatus, errors=(400,), scope=ScopeKind.WRITE),
    Endpoint("GET", "/v0/folds", "listFolds",
             "Every fold node's newest report: cursor, lag behind the bucket, last export, "
             "stale when it stopped reporting",
             response=FoldList, errors=(), scope=ScopeKind.READ),
    Endpoint("GET", "/v0/folds/{fold}", "getFold", "The newest report of each node of a fold",
             response=FoldList, errors=(404,), scope=ScopeKind.READ),
    Endpoint("DELETE", "/v0/folds/{fold}", "forgetFold",
             "Forget a fold's nodes (all, or those named by `node`) taken out of service; "
             "a node that reports again is listed again",
             response=FoldList, errors=(404,),
             query=(QueryParam("node", {"type": "array", "items": {"type": "string"}},
                               "only these nodes"),),
             scope=ScopeKind.ADMIN),
    Endpoint("POST", "/v0/recovery/clients", "reportRecovery",
             "A recovery client's receipt status; the server keeps the newest per client",
             request=RecoveryReport, response=RecoveryClient, errors=(400,),
             scope=ScopeKind.WRITE),
    Endpoint("GET", "/v0/recovery/clients", "listRecoveryClients",
             "Every recovery client's newest report and how many change checkpoints it is "
             "behind",
             response=RecoveryClientList, errors=(), scope=ScopeKind.READ),
    Endpoint("DELETE", "/v0/recovery/clients/{client}", "forgetRecoveryClient",
             "Forget a recovery client taken out of service; it is listed again if it "
             "reports again", response=RecoveryClient, errors=(404,), scope=ScopeKind.ADMIN),
    Endpoint("POST", "/v0/pipelines", "reportPipeline",
             "A pipeline's status (docs/pipeline.md); the server keeps the newest per "
             "pipeline run", request=PipelineReport, response=PipelineStatus, errors=(400,),
             scope=ScopeKind.WRITE),
    Endpoint("GET", "/v0/pipelines", "listPipelines",
             "Every pipeline run's newest status: topology, edges with generation and lag, "
             "stages, shard holders, placements; stale when its runners stopped reporting",
             response=PipelineList, errors=(), scope=ScopeKind.READ),
    Endpoint("DELETE", "/v0/pipelines/{pipeline}", "forgetPipeline",
             "Forget a pipeline's runs (all, or those named by `run`); a run that reports "
             "again is listed again", response=PipelineList, errors=(404,),
             query=(QueryParam("run", {"type": "array", "items": {"type": "string"}},
                               "only these runs"),),
             scope=ScopeKind.ADMIN),
    # --- the server itself
    Endpoint("GET", "/v0/openapi.json", "openapi", "This document", errors=(),
             stream=("application/json", "OpenAPI 3.1"), scope=ScopeKind.OPEN),
    Endpoint("GET", "/metrics", "metrics", "Prometheus metrics", errors=(),
             stream=("text/plain", "Prometheus text exposition format"), scope=ScopeKind.ADMIN),
)  # fmt: skip

ENDPOINT: dict[str, Endpoint] = {e.operation_id: e for e in ENDPOINTS}
