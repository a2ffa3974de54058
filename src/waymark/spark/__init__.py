"""waymark on Spark: the topic source, the exactly-once topic sink and the fold sink.

>>> from waymark import spark as ws
>>> ws.register(session)
>>> reader = session.readStream.format("waymark").option("url", url)
>>> stream = reader.option("topics", "clicks").load()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..client import Client
from .schema import parse_data, with_parsed_data

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .fold_sink import FoldSink
    from .sink import TopicBatchSink


def connect(url: str) -> Client:
    """The waymark client the source and the sinks talk to ``url`` with (driver and
    executors alike): a page or a stage may take a while, a dead server should not."""
    return Client(url, timeout=60.0, connect_timeout=10.0)


def register(spark: SparkSession) -> None:
    """Register every waymark data source on ``spark`` (today: the ``waymark`` format)."""
    from .datasource import WaymarkDataSource

    spark.dataSource.register(WaymarkDataSource)


def __getattr__(name: str) -> object:
    # Imported when asked for: Spark's Python workers import this package to read
    # a topic, and should not pay for the sinks' dependencies (fold stores, pyspark).
    if name == "FoldSink":
        from .fold_sink import FoldSink

        return FoldSink
    if name == "TopicBatchSink":
        from .sink import TopicBatchSink

        return TopicBatchSink
    raise AttributeError(name)


__all__ = ["FoldSink", "TopicBatchSink", "connect", "parse_data", "register", "with_parsed_data"]
