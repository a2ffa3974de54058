"""The ``waymark`` data source: the topic source and the exactly-once topic sink."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.types import StructType

from .schema import SOURCE_DDL


class WaymarkDataSource(DataSource):
    """``spark.readStream.format("waymark")`` and ``df.writeStream.format("waymark")``."""

    @classmethod
    def name(cls) -> str:
        return "waymark"

    def schema(self) -> str:
        return SOURCE_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .source import WaymarkStreamReader

        return WaymarkStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import WaymarkStreamWriter

        return WaymarkStreamWriter(self.options, schema)
