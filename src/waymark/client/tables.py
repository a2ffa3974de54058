"""Reading a topic into one Arrow table, for polars, DuckDB and pandas users
(docs/http-api.md, "Arrow pages"). Shared by the sync and async clients: a
:class:`TableRead` says which page to ask for next and collects the answers; the
clients only send the calls.

pyarrow (the ``[arrow]`` extra) is loaded when the table is assembled, not when the
client is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..protocol import MAX_ARROW_DIFF_LIMIT, Tombstone
from ..protocol.errors import WaymarkError
from . import calls

if TYPE_CHECKING:
    from ..protocol.arrow import ArrowPage, Table


class TopicGap(WaymarkError):
    """Records the read would have returned are gone (evicted, expired, lost, or the
    topic was recreated): the tombstone says which. Pass ``skip_gaps=True`` to read on."""

    def __init__(self, topic: str, tombstone: Tombstone) -> None:
        super().__init__(
            f"topic {topic!r} lost records [{tombstone.gap_from}, {tombstone.gap_to}] "
            f"(reason: {tombstone.reason})"
        )
        self.topic = topic
        self.tombstone = tombstone


class TableRead:
    """Pages from ``from_seq`` up to the head the first page reports."""

    def __init__(
        self,
        topic: str,
        from_seq: int,
        node: str | Sequence[str] | None,
        skip_gaps: bool,
    ) -> None:
        self.topic = topic
        self.cursor = from_seq
        self.node = node
        self.skip_gaps = skip_gaps
        self.epoch: int | None = None
        self.upto: int | None = None  # the head when the read began
        self.tables: list[Table] = []

    def next_call(self) -> calls.Call[ArrowPage] | None:
        if self.upto is not None and self.cursor >= self.upto:
            return None
        return calls.diff_arrow(
            self.topic, self.cursor, MAX_ARROW_DIFF_LIMIT, self.node, self.epoch, 0
        )

    def take(self, page: ArrowPage) -> None:
        if page.tombstone is not None and not self.skip_gaps:
            raise TopicGap(self.topic, page.tombstone)
        if self.upto is None:
            self.upto = page.head_seq
        self.epoch = page.epoch
        table = page.table
        if table.num_rows and table["seq"][-1].as_py() > self.upto:
            table = table.filter(table["seq"].to_numpy() <= self.upto)
        self.tables.append(table)
        done = page.next_from_seq <= self.cursor or page.caught_up
        self.cursor = self.upto if done else page.next_from_seq

    def table(self) -> Table:
        from ..protocol.arrow import page_table

        return page_table(self.tables)
