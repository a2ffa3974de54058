"""The sink's rows as RecordIn JSON, assembled column-wise with pyarrow compute
(docs/spark.md, "Exactly-once topic sink").

Each row becomes ``{"data":<data>[,"tag":..][,"node":..][,"meta":{..}]},`` as one
value of a binary Arrow array, and a stage body is a slice of that array's value
buffer: no Python object is built per row on the common path (a ``data`` string
column, string ``tag``/``node``). ``meta`` costs per row only where it is filled; a
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
    if "topic" not in columns:
        if default_topic is None:
            raise ValueError("the rows name no topic and the sink has no 'topic' option")
        return {default_topic: records}
    topics = columns["topic"]
    if default_topic is not None:
        topics = pc.fill_null(topics, default_topic)  # type: ignore[arg-type]
    elif topics.null_count:
        row = int(np.flatnonzero(topics.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"row {row} names no topic and the sink has no 'topic' option")
    names: list[str] = pc.unique(topics).to_pylist()  # type: ignore[assignment]  # no nulls left
    if len(names) == 1:
        return {names[0]: records}
    return {name: records.filter(pc.equal(topics, name)) for name in names}  # type: ignore[call-overload]


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
    if len(values) == 0:
        return b""
    data, lo, hi = _span(values)
    return data.slice(lo, hi - trim - lo).to_pybytes()


def _check_json(values: pa.Array) -> None:
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
    rows: list[bytes] = values.to_pylist()  # type: ignore[assignment]  # no nulls (checked)
    for i, value in enumerate(rows):
        try:
            msgspec.json.decode(value)
        except msgspec.DecodeError as e:
            raise ValueError(
                f"row {i}: the 'data' column is not valid JSON ({e}): {value[:120]!r}"
            ) from None
    raise ValueError("the 'data' column holds a value that is not exactly one JSON value")


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
