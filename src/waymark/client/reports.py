"""Request building for the status report routes (docs/reports.md), shared by the sync
and async clients."""

from __future__ import annotations

import msgspec

from ..protocol import (
    FoldList,
    FoldReport,
    FoldStatus,
    PipelineList,
    PipelineReport,
    PipelineStatus,
    RecoveryClient,
    RecoveryClientList,
    RecoveryReport,
)
from .calls import Call, call, typed

_encode = msgspec.json.Encoder().encode
_fold = typed(FoldStatus)
_folds = typed(FoldList)
_client = typed(RecoveryClient)
_clients = typed(RecoveryClientList)
_pipeline = typed(PipelineStatus)
_pipelines = typed(PipelineList)


def report_fold(report: FoldReport) -> Call[FoldStatus]:
    return call("reportFold", _fold, _encode(report))


def list_folds() -> Call[list[FoldStatus]]:
    return call("listFolds", lambda r: _folds(r).folds)


def get_fold(fold: str) -> Call[list[FoldStatus]]:
    return call("getFold", lambda r: _folds(r).folds, fold=fold)


def forget_fold(fold: str, nodes: list[str] | None = None) -> Call[list[FoldStatus]]:
    query = {"node": nodes} if nodes else None
    return call("forgetFold", lambda r: _folds(r).folds, params=query, fold=fold)


def report_recovery(report: RecoveryReport) -> Call[RecoveryClient]:
    return call("reportRecovery", _client, _encode(report))


def list_recovery_clients() -> Call[RecoveryClientList]:
    return call("listRecoveryClients", _clients)


def forget_recovery_client(client: str) -> Call[RecoveryClient]:
    return call("forgetRecoveryClient", _client, client=client)


def report_pipeline(report: PipelineReport) -> Call[PipelineStatus]:
    return call("reportPipeline", _pipeline, _encode(report))


def list_pipelines() -> Call[list[PipelineStatus]]:
    return call("listPipelines", lambda r: _pipelines(r).pipelines)


def forget_pipeline(pipeline: str, runs: list[str] | None = None) -> Call[list[PipelineStatus]]:
    query = {"run": runs} if runs else None
    return call("forgetPipeline", lambda r: _pipelines(r).pipelines, params=query,
                pipeline=pipeline)  # fmt: skip
