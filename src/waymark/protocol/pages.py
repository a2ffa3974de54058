"""The Arrow page: a diff answer in Arrow IPC stream format (docs/http-api.md, "Arrow pages").

``POST /v0/topics/{topic}/diff`` with ``Accept: application/vnd.apache.arrow.stream``
answers the same page as the JSON body, as one Arrow IPC stream: the records are
rows of the columns below (zero or more record batches, in seq order), and every
other field of :class:`~waymark.protocol.DiffResponse` is :class:`PageInfo`, JSON in
the schema's metadata under :data:`PAGE_INFO_KEY`, so nothing of the JSON answer is
lost. An Arrow page may hold up to :data:`~waymark.protocol.limits.MAX_ARROW_DIFF_LIMIT`
records; a JSON page up to ``MAX_DIFF_LIMIT``.

This module is the definition; :mod:`waymark.protocol.arrow` (which needs pyarrow,
the ``[arrow]`` extra) builds the pyarrow schema from it and reads and writes pages.
It imports msgspec only, so the client stays light until a caller asks for Arrow.
"""

from __future__ import annotations

from typing import NamedTuple

from msgspec import Struct

from .records import Tombstone
from .topics import Durability

ARROW_STREAM = "application/vnd.apache.arrow.stream"
PAGE_INFO_KEY = "waymark.page"


class PageColumn(NamedTuple):
    name: str
    type: str  # the Arrow type, as pyarrow spells it
    nullable: bool
    description: str


PAGE_COLUMNS: tuple[PageColumn, ...] = (
    PageColumn("seq", "int64", False, "the record's $seq"),
    PageColumn("ts", "timestamp[ms, tz=UTC]", False, "the record's $ts (ms since the epoch)"),
    PageColumn("node", "string", True, "$node; null when the record has none"),
    PageColumn("tag", "string", True, "$tag; null when the record has none"),
    PageColumn("meta", "map<string, string>", True, "meta; null when the record has none"),
    PageColumn("data", "string", False, "data, as the JSON text the producer sent"),
)


class PageInfo(Struct, kw_only=True):
    """Everything of a diff answer but its records: the page's cursor fields and
    tombstone, as in :class:`~waymark.protocol.DiffResponse`, and its row count."""

    count: int  # rows in the page
    tombstone: Tombstone | None
    next_from_seq: int
    head_seq: int
    earliest_seq: int
    caught_up: bool
    epoch: int
    durability: Durability
