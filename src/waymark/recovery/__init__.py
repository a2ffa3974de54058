"""Receipt recovery: "which keys changed that I never finished processing?"
(docs/recovery.md, docs/semantics/recovery.md).

A consumer keeping derived state (an index, a cache, a fold) receipts each key once
it processed it; after a crash :meth:`RecoveryService.subscribe` names the keys that
changed and were never receipted, with their newest committed version, and then
every new one. It is a client-side package: it talks to the server through
:mod:`waymark.client` only.

``RecoveryService``   receipts in, missed versions out
``TopicCheckpoints``  a server's change checkpoints (the checkpoint source)
``LocalReceiptStore`` receipts in an embedded SQLite file (the default)
``TopicReceiptStore`` receipts in a waymark topic (recover on any machine)
``CommittedVersion``  a key at a version known to be committed
``WindowLoss``        checkpoints a query could not examine (a loss, announced)
``AsyncRecoveryService``, ``AsyncTopicCheckpoints``  the same for asyncio
"""

from .aio import AsyncCheckpointSource, AsyncRecoveryService, AsyncTopicCheckpoints
from .core import Status
from .local import LocalReceiptStore
from .service import RecoveryService
from .source import TopicCheckpoints
from .store import ReceiptStore
from .topicstore import TopicReceiptStore
from .types import (
    CheckpointListener,
    CheckpointSource,
    CommittedVersion,
    CommittedVersionListener,
    Missed,
    RecoveryError,
    ServerView,
    WindowLoss,
)

__all__ = [
    "AsyncCheckpointSource",
    "AsyncRecoveryService",
    "AsyncTopicCheckpoints",
    "CheckpointListener",
    "CheckpointSource",
    "CommittedVersion",
    "CommittedVersionListener",
    "LocalReceiptStore",
    "Missed",
    "ReceiptStore",
    "RecoveryError",
    "RecoveryService",
    "ServerView",
    "Status",
    "TopicCheckpoints",
    "TopicReceiptStore",
    "WindowLoss",
]
