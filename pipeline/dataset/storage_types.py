"""The types a table's columns are stored in, and back: Delta has no fixed-size list, unsigned
integer or half float, so columns are stored as lists, wider signed integers and float32, and
frames as the binary of their bytes (:mod:`pipeline.format.frames`); readers cast them back to the
step schema, whose field metadata keeps the shape and the space (``docs/format.md``)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pipeline.dataset import successors
from pipeline.format import frames

_WIDER = {8: pa.int16(), 16: pa.int32(), 32: pa.int64(), 64: pa.int64()}


def storage_type(kind: pa.DataType) -> pa.DataType:
    """The Delta-storable Arrow type of a column of type ``kind``: frames become binary
    (:mod:`pipeline.format.frames`), other fixed-size lists lists, unsigned integers the next
    wider signed type (uint64 stays 64 bits: values past 2**63-1 wrap), half floats float32;
    structs recursively."""
    if frames.is_frame(kind):
        return pa.binary()
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind):
        return pa.list_(pa.field("element", storage_type(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([field.with_type(storage_type(field.type)) for field in kind])
    if pa.types.is_unsigned_integer(kind):
        return _WIDER[kind.bit_width]
    if pa.types.is_float16(kind):
        return pa.float32()
    return kind


def storage_schema(table_schema: pa.Schema) -> pa.Schema:
    """``table_schema`` in storage types, field and schema metadata kept; ``next_observation``
    may be null where rlpipe omits it (:mod:`pipeline.dataset.successors`), and stays required
    elsewhere: pyarrow scans CartPole's required lists as fast as before, so a reader's speed
    against a raw scan of the files is what it was."""
    fields = [
        field.with_type(storage_type(field.type)).with_nullable(
            field.nullable or (field.name == successors.NEXT and successors.omitted(field.type))
        )
        for field in table_schema
    ]
    return pa.schema(fields, metadata=table_schema.metadata)


def to_storage(data: pa.Table) -> pa.Table:
    """``data`` in its storage types (:func:`storage_schema`): a cast per column, and frames
    chunk by chunk (they become binary without a copy). A shard of single-step appends has a
    chunk per request: a Python call per chunk cost a fifth of a busy server's time."""
    stored = storage_schema(data.schema)
    columns = [
        pa.chunked_array([_stored(chunk, field.type) for chunk in column.chunks], field.type)
        if has_frame(column.type)
        else column.cast(field.type)
        for column, field in zip(data.columns, stored, strict=True)
    ]
    return pa.Table.from_arrays(columns, schema=stored)


def _stored(array: pa.Array, kind: pa.DataType) -> pa.Array:
    if frames.is_frame(array.type):
        return frames.to_binary(array)
    if pa.types.is_struct(array.type) and has_frame(array.type):
        parts = array.flatten()
        children = [_stored(parts[i], kind.field(i).type) for i in range(kind.num_fields)]
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(kind), mask=mask)
    return array.cast(kind)


def has_frame(kind: pa.DataType) -> bool:
    """Whether a column of type ``kind`` is or holds a frame (:mod:`pipeline.format.frames`)."""
    if pa.types.is_struct(kind):
        return any(has_frame(field.type) for field in kind)
    return frames.is_frame(kind)


def restore(data: pa.RecordBatch | pa.Table, table_schema: pa.Schema) -> Any:
    """Columns of ``data`` read in storage types, cast back to ``table_schema``'s types."""
    for index, name in enumerate(data.schema.names):
        if name in table_schema.names:
            wanted = table_schema.field(name)
            kind = data.schema.field(index).type
            if pa.types.is_dictionary(kind) and kind.value_type == wanted.type:
                continue  # ids a scan reads as dictionaries: decoded later, by index
            if kind != wanted.type:
                column = data.column(index)
                if isinstance(column, pa.ChunkedArray):
                    column = column.combine_chunks()
                data = data.set_column(index, wanted, _restored(column, wanted.type, name))
    return data


def _restored(array: pa.Array, kind: pa.DataType, name: str) -> pa.Array:
    if frames.is_frame(kind) and pa.types.is_binary(array.type):
        return frames.from_binary(array, kind, name)
    if pa.types.is_struct(kind) and has_frame(kind):
        children = [
            _restored(part, field.type, f"{name}.{field.name}")
            for part, field in zip(array.flatten(), kind, strict=True)
        ]
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(kind), mask=mask)
    return array.cast(kind)
