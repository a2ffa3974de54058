"""The sink's rows as the stage bodies carry them, assembled column-wise with pyarrow
compute (docs/spark.md, "Exactly-once topic sink").

Rows that carry data alone as JSON text — a string ``data`` column, no tag, node or
meta — are staged as their data values, each followed by a comma (:func:`encode_values`):
no byte is added or checked per row, the server parses them and refuses an array that
does not split into the rows' values. Any other row becomes
``{"data":<data>[,"tag":..][,"node":..][,"meta":{..}]},``. Either is one value of a
binary Arrow array, and a stage body is a slice of that array's value buffer: no
Python object is built per row on the common path (a ``data`` string column, string
``tag``/``node``). ``meta`` costs per row only where it is filled; a
``tag`` or ``node`` column holding a control character, and a ``data`` column of
another type than string (a struct, a map, numbers), are encoded row by row.
"""

from __future__ import annotations

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

_json_values = msgspec.json.Decoder(list[msgspec.Raw])
_BINARY = pa.binary()
_CONTROL = r"[\x00-\x1f]"
# Checked against pyarrow-stubs; the ignores stand for what they cannot say: compute's
# binary_join_element_wise, fill_null and equal take Python bytes/str as scalars, a
# pa.Buffer is a buffer to np.frombuffer (numpy types __buffer__ from 3.12), and
# to_pylist() is typed with None even where the column was checked for nulls.


def encode_batch(batch: pa.RecordBatch, default_topic: str | None) -> dict[str, pa.Array]:
    """The batch's rows as RecordIn JSON objects, each followed by a comma, per topic."""
    if batch.num_rows == 0:
        return {}
    columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
    pieces = [pa.scalar(b'{"data":'), encode_data(columns["data"])]
    for name in ("tag", "node"):
        if name in columns and columns[name].null_count < len(columns[name]):
            key = b',"' + name.encode() + b'":'
            joined = pc.binary_join_element_wise(key, _json_strings(columns[name]), b"")  # type: ignore[call-overload]
            pieces.append(joined)
    if "meta" in columns and columns["meta"].null_count < len(columns["meta"]):
        pieces.append(_meta(columns["meta"]))
    pieces.append(pa.scalar(b"},"))
    records = pc.binary_join_element_wise(  # type: ignore[call-overload]
        *pieces, b"", null_handling="replace", null_replacement=b""
    )
    return _per_topic(batch, records, default_topic)


def _per_topic(
    batch: pa.RecordBatch, records: pa.Array, default_topic: str | None
) -> dict[str, pa.Array]:
    """``records`` (one per row) grouped by the topic each row names, in row order."""
    if "topic" not in batch.schema.names:
        if default_topic is None:
            raise ValueError("the rows name no topic and the sink has no 'topic' option")
        return {default_topic: records}
    topics = batch.column(batch.schema.get_field_index("topic"))
    if default_topic is not None:
        topics = pc.fill_null(topics, default_topic)  # type: ignore[arg-type]
    elif topics.null_count:
        row = int(np.flatnonzero(topics.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"row {row} names no topic and the sink has no 'topic' option")
    names: list[str] = pc.unique(topics).to_pylist()  # type: ignore[assignment]  # no nulls left
    if len(names) == 1:
        return {names[0]: records}
    return {name: records.filter(pc.equal(topics, name)) for name in names}  # type: ignore[call-overload]


def values_only(batch: pa.RecordBatch) -> bool:
    """Whether the batch's records carry data alone, as JSON text: a string (or binary)
    ``data`` column and no ``tag``, ``node`` or ``meta`` filled. Such rows are staged as
    their data values (:func:`encode_values`), which the sink's task never parses: the
    server does, and refuses an array that does not split into the rows' values
    (docs/spark.md, "Exactly-once topic sink")."""
    kind = batch.schema.field("data").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind)):  # fmt: skip
        return False
    return all(
        batch.column(name).null_count == batch.num_rows
        for name in ("tag", "node", "meta") if name in batch.schema.names
    )  # fmt: skip


def encode_values(batch: pa.RecordBatch, default_topic: str | None) -> dict[str, pa.Array]:
    """A :func:`values_only` batch's data values, each followed by a comma, per topic."""
    if batch.num_rows == 0:
        return {}
    data = batch.column(batch.schema.get_field_index("data"))
    if data.null_count:
        raise ValueError("the waymark sink's 'data' column has nulls; every record needs data")
    values = pc.binary_join_element_wise(data.cast(_BINARY), b",", b"")  # type: ignore[call-overload]
    return _per_topic(batch, values, default_topic)


def value_ends(values: pa.Array) -> np.ndarray:
    """A binary array's value offsets from its first value's start (``n + 1`` of them)."""
    if len(values) == 0:
        return np.zeros(1, np.int64)
    _, offsets_buffer, _ = values.buffers()
    assert offsets_buffer is not None  # a non-empty binary array's
    offsets = np.frombuffer(offsets_buffer, np.int32, len(values) + 1, values.offset * 4)  # type: ignore[call-overload]
    return offsets.astype(np.int64) - int(offsets[0])


def value_bytes(values: pa.Array) -> int:
    """The bytes of a binary array's values, all told."""
    return int(value_ends(values)[-1])


def value_lengths(values: pa.Array) -> bytes:
    """The lengths of :func:`encode_values`' values without their commas, as the stage's
    ``lengths`` takes them: little-endian uint32s."""
    return (np.diff(value_ends(values)) - 1).astype("<u4").tobytes()


def check_values(values: pa.Array, first_row: int = 0) -> None:
    """Refuse, naming the row, a value of :func:`encode_values` that is not exactly one
    JSON value (the comma dropped): what a task looks for once the server refused its
    stage, row by row (joined, ``[1`` and ``2]`` beside ``3,4`` make as many values as
    rows). ``first_row``: the row number of ``values[0]``."""
    if len(values):
        _check_each(pc.binary_slice(values, 0, -1), first_row)


def encode_data(column: pa.Array) -> pa.Array:
    """The ``data`` column as one JSON value per row (a binary array)."""
    if column.null_count:
        raise ValueError("the waymark sink's 'data' column has nulls; every record needs data")
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        values = column.cast(_BINARY)
        _check_json(values)
        return values
    if pa.types.is_map(kind):
        encoded = [orjson.dumps(dict(v), default=str) for v in column.to_pylist()]  # type: ignore[arg-type]
    else:
        encoded = [orjson.dumps(v, default=str) for v in column.to_pylist()]
    return pa.array(encoded, _BINARY)


def _span(values: pa.Array) -> tuple[pa.Buffer, int, int]:
    """A non-empty binary array's data buffer and where its values lie in it."""
    _, offsets_buffer, data = values.buffers()
    assert offsets_buffer is not None and data is not None  # a non-empty binary array's
    offsets = np.frombuffer(offsets_buffer, np.int32, len(values) + 1, values.offset * 4)  # type: ignore[call-overload]
    return data, int(offsets[0]), int(offsets[-1])


def joined_values(values: pa.Array, *, trim: int = 0) -> bytes:
    """The concatenated bytes of a binary array's values, less their last ``trim`` bytes
    (a last record's comma): one copy of a slice of its buffer."""
    return bytes(joined_view(values, trim=trim))


def joined_view(values: pa.Array, *, trim: int = 0) -> memoryview:
    """:func:`joined_values` as a view of the array's buffer: no copy."""
    if len(values) == 0:
        return memoryview(b"")
    data, lo, hi = _span(values)
    return memoryview(data)[lo : hi - trim]  # type: ignore[arg-type]  # (a pa.Buffer is one)


def _check_json(values: pa.Array, first_row: int = 0) -> None:
    """Every value is exactly one JSON value: one decode of the values joined into an
    array checks all (a value like ``1,2`` shows up as a count mismatch); only a
    failure looks closer. The array is built with one copy of the values: each copy of
    a batch's data cost the sink's task ~10 ms per 300k rows (docs/spark.md, "Sink
    speed")."""
    if len(values) == 0:
        return
    data, lo, hi = _span(pc.binary_join_element_wise(values, b",", b""))  # type: ignore[call-overload]
    array = bytearray(hi - lo + 1)  # "[" v0,v1,...vn "]": the last comma's place is "]"
    array[0], array[-1] = ord("["), ord("]")
    array[1:-1] = memoryview(data)[lo : hi - 1]
    try:
        if len(_json_values.decode(array)) == len(values):
            return
    except msgspec.DecodeError:
        pass
    _check_each(values, first_row)
    raise ValueError("the 'data' column holds a value that is not exactly one JSON value")


def _check_each(values: pa.Array, first_row: int) -> None:
    """Refuse the first value that is not exactly one JSON value, naming its row."""
    rows: list[bytes] = values.to_pylist()  # type: ignore[assignment]  # no nulls (checked)
    for i, value in enumerate(rows, first_row):
        try:
            msgspec.json.decode(value, type=msgspec.Raw)
        except msgspec.DecodeError as e:
            raise ValueError(
                f"row {i}: the 'data' column is not valid JSON ({e}): {value[:120]!r}"
            ) from None


def _json_strings(column: pa.Array) -> pa.Array:
    """A string column as JSON strings (nulls stay null): quotes and backslashes escaped
    with compute; a column with a control character is encoded row by row."""
    text = column.cast(pa.string())
    if pc.any(pc.match_substring_regex(text, _CONTROL)).as_py():
        return pa.array([None if v is None else orjson.dumps(v) for v in text.to_pylist()],
                        _BINARY)  # fmt: skip
    escaped = pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), '"', '\\"')
    return pc.binary_join_element_wise(b'"', escaped.cast(_BINARY), b'"', b"")  # type: ignore[call-overload]


def _meta(column: pa.Array) -> pa.Array:
    """``,"meta":{..}`` where a row has meta, null elsewhere: only filled rows are
    encoded, one by one."""
    filled = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
    encoded = [b',"meta":' + orjson.dumps(dict(column[int(i)].as_py())) for i in filled]
    mask = np.zeros(len(column), bool)
    mask[filled] = True
    return pc.replace_with_mask(pa.nulls(len(column), _BINARY), pa.array(mask),
                                pa.array(encoded, _BINARY))  # fmt: skip
