"""waymark on Spark: the topic source, the exactly-once topic sink and the fold sink.

>>> from waymark import spark as ws
>>> ws.register(session)
>>> reader = session.readStream.format("waymark").option("url", url)
>>> stream = reader.option("topics", "clicks").load()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .fold_sink import FoldSink
from .schema import parse_data, with_parsed_data

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Register every waymark data source on ``spark`` (today: the ``waymark`` format)."""
    from .datasource import WaymarkDataSource

    spark.dataSource.register(WaymarkDataSource)


__all__ = ["FoldSink", "parse_data", "register", "with_parsed_data"]
