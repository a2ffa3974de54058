"""Arrow pages in pyarrow (the ``[arrow]`` extra): the schema built from
:data:`~waymark.protocol.pages.PAGE_COLUMNS`, and the one writer and reader of the
stream format (docs/http-api.md, "Arrow pages").

Imported only where Arrow is asked for: the server's Arrow answer, the client's
``diff_arrow``, the Spark source.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec
import pyarrow as pa

from .pages import PAGE_COLUMNS, PAGE_INFO_KEY, PageInfo
from .records import Tombstone
from .topics import Durability

_TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "timestamp[ms, tz=UTC]": pa.timestamp("ms", tz="UTC"),
    "string": pa.string(),
    "map<string, string>": pa.map_(pa.string(), pa.string()),
}

PAGE_SCHEMA = pa.schema([pa.field(c.name, _TYPES[c.type], c.nullable) for c in PAGE_COLUMNS])

_info = msgspec.json.Decoder(PageInfo)

Table = pa.Table  # what a page's records are, for annotations outside this module


def page_table(tables: list[pa.Table]) -> pa.Table:
    """The records of several pages as one table (of :data:`PAGE_SCHEMA`, also when empty)."""
    return pa.concat_tables([PAGE_SCHEMA.empty_table(), *tables])


@dataclass(frozen=True, slots=True)
class ArrowPage:
    """One diff page read as Arrow: ``table`` holds the records (the columns of
    :data:`PAGE_SCHEMA`); the other fields are those of the JSON answer."""

    table: pa.Table
    tombstone: Tombstone | None
    next_from_seq: int
    head_seq: int
    earliest_seq: int
    caught_up: bool
    epoch: int
    durability: Durability

    @property
    def count(self) -> int:
        return self.table.num_rows


def encode_page(info: PageInfo, batches: Iterable[pa.RecordBatch]) -> bytearray:
    """The IPC stream of one page: the schema with ``info`` in its metadata, then
    ``batches`` (each of :data:`PAGE_SCHEMA`).

    Measured first, then written once into a buffer of its size, which is the answer's
    body: a growing stream copied out as ``bytes`` cost 3-4x as much (a page is ~12 MB).
    """
    schema = PAGE_SCHEMA.with_metadata({PAGE_INFO_KEY: msgspec.json.encode(info)})
    batches = list(batches)
    measure = pa.MockOutputStream()
    _write(measure, schema, batches)
    body = bytearray(measure.size())
    _write(pa.FixedSizeBufferWriter(pa.py_buffer(body)), schema, batches)
    return body


def _write(sink: pa.NativeFile, schema: pa.Schema, batches: list[pa.RecordBatch]) -> None:
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def decode_page(body: bytes | memoryview) -> ArrowPage:
    """Read an Arrow page. A stream without the page metadata is refused (ValueError)."""
    reader = pa.ipc.open_stream(body)  # type: ignore[arg-type]  # a memoryview is a buffer
    metadata = reader.schema.metadata or {}
    raw = metadata.get(PAGE_INFO_KEY.encode())
    if raw is None:
        raise ValueError(f"not a waymark Arrow page: no {PAGE_INFO_KEY!r} schema metadata")
    info = _info.decode(raw)
    table = reader.read_all().replace_schema_metadata(None)
    return ArrowPage(
        table=table,
        tombstone=info.tombstone,
        next_from_seq=info.next_from_seq,
        head_seq=info.head_seq,
        earliest_seq=info.earliest_seq,
        caught_up=info.caught_up,
        epoch=info.epoch,
        durability=info.durability,
    )
