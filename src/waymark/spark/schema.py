"""The topic source's row schema, and helpers to parse the ``data`` JSON column.

``data`` stays JSON text end to end, so a source -> sink pipeline round-trips
every value exactly and the schema never has to guess a topic's shape. Parse it
where a query needs fields:

>>> events = with_parsed_data(stream, "user STRING, amount DOUBLE")
>>> events.select("seq", "data.user", "data.amount")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

SOURCE_DDL = (
    "topic STRING, seq BIGINT, ts TIMESTAMP, node STRING, "
    "tag STRING, meta MAP<STRING, STRING>, data STRING"
)

_FIELDS: list[pa.Field[Any]] = [  # annotated: mypy joins the fields' types to object
    pa.field("topic", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("node", pa.string()),
    pa.field("tag", pa.string()),
    pa.field("meta", pa.map_(pa.string(), pa.string())),
    pa.field("data", pa.string()),
]
ARROW_SCHEMA = pa.schema(_FIELDS)


def parse_data(schema: StructType | str, column: str = "data") -> Column:
    """A column parsing the JSON ``data`` text with ``schema`` (a DDL string or StructType).

    Fields missing from a record are null; a record that is not an object of
    that shape parses to null (Spark's PERMISSIVE ``from_json``).
    """
    from pyspark.sql import functions as F

    return F.from_json(F.col(column), schema)


def with_parsed_data(df: DataFrame, schema: StructType | str, column: str = "data") -> DataFrame:
    """``df`` with its ``data`` column replaced by the parsed struct."""
    return df.withColumn(column, parse_data(schema, column))
