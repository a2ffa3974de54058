"""The ``waymark`` data source: the topic source and the exactly-once topic sink."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .schema import SOURCE_DDL


class WaymarkDataSource(DataSource):
    """``readStream.format("waymark")``, ``writeStream.format("waymark")`` and, inside
    ``foreachBatch``, ``df.write.format("waymark").option("batchId", id)``."""

    @classmethod
    def name(cls) -> str:
        return "waymark"

    def schema(self) -> str:
        return SOURCE_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .edge import parse_options

        edge = parse_options(self.options)  # exactly one of topics / edge
        if edge is not None:
            from .edge_source import WaymarkEdgeStreamReader

            return WaymarkEdgeStreamReader(self.options, edge)
        from .source import WaymarkStreamReader

        return WaymarkStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("the waymark sink appends to topics; overwrite is not supported")
        from .sink import WaymarkBatchWriter

        return WaymarkBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import WaymarkStreamWriter

        return WaymarkStreamWriter(self.options, schema)
