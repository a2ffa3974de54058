"""The limits and value ranges that are part of the /v0 contract
(docs/semantics/topics.md §1.2).

Both sides read them from here: the engine enforces :class:`Limits` (a server may be
configured with other values; these are the defaults every waymark server starts
with), request bodies carry the ranges as msgspec constraints, and the OpenAPI
document states them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from msgspec import Meta

# 1-255 characters of [A-Za-z0-9._:-], starting alphanumeric; never a "/"
# (docs/semantics/topics.md §2.1).
TOPIC_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}"
TOPIC_NAME = re.compile(TOPIC_NAME_PATTERN)

MAX_DIFF_LIMIT = 10_000  # records a JSON diff page may scan
MAX_ARROW_DIFF_LIMIT = 100_000  # records an Arrow diff page may scan (docs/http-api.md)
DEFAULT_DIFF_LIMIT = 1000
MAX_WAIT_MS = 60_000  # the longest diff long-poll
DEFAULT_TOPIC_PAGE = 1000  # topics a GET /v0/topics page holds unless asked
MAX_TOPIC_PAGE = 10_000
MAX_BATCH = 10_000  # jobs per claim, leases per /work stream, seqs per ack/nack/extend

Seq = Annotated[int, Meta(ge=0, le=2**63 - 1)]
NonNegative = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Positive = Annotated[int, Meta(ge=1, le=2**63 - 1)]
# Where a body names a topic that is then checked by the engine (404/400 with the
# code of docs/semantics/topics.md §11), not refused by the decoder as a malformed field.
TopicName = Annotated[str, Meta(pattern=f"^{TOPIC_NAME_PATTERN}$")]
# A record's idempotency id (docs/semantics/topics.md §4.1): the server keeps every id
# for the duplicate window, so its size is bounded like a tag's.
MAX_ID_LENGTH = 1024
RecordId = Annotated[str, Meta(max_length=MAX_ID_LENGTH)]
# A producer's meta key never starts with "$": those are the server's own (a dead
# letter's $dead_letter_queue, which redrive trusts), docs/semantics/topics.md §1.1.
# The schema says so; the server checks it once a body is decoded
# (``waymark.server.http.refuse_server_meta``): as a pattern, msgspec ran a regex per
# key, and a write of records with three meta keys each decoded 5x slower.
META_KEY_PATTERN = r"^(?!\$)"
MetaKey = Annotated[str, Meta(extra_json_schema={"pattern": META_KEY_PATTERN})]


@dataclass(frozen=True)
class Limits:
    """Hard write limits (docs/semantics/topics.md §1.2). Violations are 400s with a
    specific code."""

    max_record_bytes: int = 1 << 20  # data + meta, canonical bytes
    max_tag_bytes: int = 256
    max_node_bytes: int = 128
    max_meta_bytes: int = 16 << 10
    max_meta_keys: int = 64
    max_records_per_write: int = 10_000
    max_body_bytes: int = 64 << 20  # 413 body_too_large
    # Topics a server holds, a queue's internal leases log included; creating one more
    # is 429 too_many_topics (docs/security.md, Limits). Recovered topics are all kept.
    max_topics: int = 100_000
    # Bytes staged by exactly-once writers and not yet published, per writer and in all:
    # past either a stage is 429 staging_full (docs/security.md, Limits). Stages live in
    # memory until published or expired, so an unpublished stage must not grow forever.
    max_staged_bytes_per_writer: int = 256 << 20
    max_staged_bytes: int = 1 << 30
