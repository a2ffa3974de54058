"""Input partitions: contiguous seq ranges of one topic instance, read in parallel.

``read()`` runs on a pickled copy in a Python worker, so a partition carries
everything the read needs (server URL, node filter, gap policy); it holds no
client or connection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition


@dataclass(frozen=True)
class ReadSettings:
    """What every partition of one source shares."""

    url: str
    node: str | None
    on_data_loss: str  # "fail" | "skip"
    gaps_topic: str
    page: int  # records per diff request
    token: str | None = None  # the ``token`` option (docs/security.md)
    ca_file: str | None = None  # the ``caFile`` option
    server_budget_s: float = 0.0  # the ``serverBudgetMs`` option (docs/spark.md)


@dataclass(frozen=True)
class Recreated:
    """The topic instance a batch's start offset named, now deleted and recreated."""

    epoch: int
    seq: int


class SeqRange(InputPartition):
    """Records of ``topic`` instance ``epoch`` with ``lo < seq <= hi``."""

    def __init__(
        self,
        settings: ReadSettings,
        topic: str,
        epoch: int,
        lo: int,
        hi: int,
        recreated: Recreated | None = None,
    ) -> None:
        super().__init__((topic, epoch, lo, hi))
        self.settings = settings
        self.topic = topic
        self.epoch = epoch
        self.lo = lo
        self.hi = hi
        # Set on the first range of a topic whose start offset named an older instance,
        # so exactly one task reports the recreate.
        self.recreated = recreated


def split(
    settings: ReadSettings,
    ranges: list[tuple[str, int, int, int, Recreated | None]],
    *,
    min_partitions: int,
    max_per_partition: int,
) -> list[SeqRange]:
    """Cut each topic's ``(topic, epoch, lo, hi, recreated)`` range into seq ranges.

    The batch is cut into whole waves of ``min_partitions`` tasks (the driver's cores
    by default): as few waves as keep every range within ``max_per_partition`` seqs,
    so no last wave runs one task while the other cores wait (docs/spark.md,
    "Figures"). Each topic gets its share of the tasks in proportion to its span;
    a topic with an empty range but a pending recreate report still gets one
    (empty) range.
    """
    total = sum(hi - lo for _, _, lo, hi, _ in ranges)
    tasks = task_count(total, min_partitions, max_per_partition)
    out: list[SeqRange] = []
    for topic, epoch, lo, hi, recreated in ranges:
        span = hi - lo
        if span <= 0:
            if recreated is not None:
                out.append(SeqRange(settings, topic, epoch, lo, lo, recreated))
            continue
        # tasks * span / total >= span / max_per_partition: no range is too long.
        pieces = min(max(math.ceil(tasks * span / total), 1), span)
        step, extra = divmod(span, pieces)
        start = lo
        for i in range(pieces):
            end = start + step + (1 if i < extra else 0)
            out.append(SeqRange(settings, topic, epoch, start, end, recreated if i == 0 else None))
            start = end
    return out


def task_count(total: int, min_partitions: int, max_per_partition: int) -> int:
    """Tasks for ``total`` seqs: whole waves of ``min_partitions``, as few as keep each
    task within ``max_per_partition`` seqs."""
    return math.ceil(total / (min_partitions * max_per_partition)) * min_partitions
