"""The ``waymark`` data source: the topic source (streaming and batch) and the
exactly-once topic sink (streaming and batch)."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .options import BATCH_SINK, STREAM_SINK, STREAM_SOURCE, resolve
from .schema import SOURCE_DDL


class WaymarkDataSource(DataSource):
    """``readStream.format("waymark")``, ``read.format("waymark")``,
    ``writeStream.format("waymark")`` and ``df.write.format("waymark")``.

    Every one checks its options first (:mod:`waymark.spark.options`): an option it
    does not take fails the query here, naming the close matches."""

    @classmethod
    def name(cls) -> str:
        return "waymark"

    def schema(self) -> str:
        return SOURCE_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .edge import parse_options

        options = resolve(self.options, STREAM_SOURCE)
        edge = parse_options(options)  # exactly one of subscribe / subscribePattern / edge
        if edge is not None:
            from .edge_source import WaymarkEdgeStreamReader

            return WaymarkEdgeStreamReader(options, edge)
        from .source import WaymarkStreamReader

        return WaymarkStreamReader(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        from .batch_source import WaymarkBatchReader

        return WaymarkBatchReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("the waymark sink appends to topics; overwrite is not supported")
        from .sink import WaymarkBatchWriter

        return WaymarkBatchWriter(resolve(self.options, BATCH_SINK), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import WaymarkStreamWriter

        return WaymarkStreamWriter(resolve(self.options, STREAM_SINK), schema)
