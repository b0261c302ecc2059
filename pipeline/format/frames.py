"""Frame columns: camera images stored as one binary value per row.

A ``uint8`` ``Box`` of at least :data:`FRAME_VALUES` values (an 84x84x3 frame) is a
``fixed_size_list<uint8>`` in memory, and Delta has neither fixed-size lists nor unsigned
integers: as a list it would be stored as ``list<int16>``. A frame is stored instead as a Parquet
``BYTE_ARRAY`` (Arrow ``binary``) holding the row's raw bytes in row-major (C) order, its shape in
the field's ``rlpipe.shape``; the Parquet column's zstd compresses it (``docs/format.md``,
section 7, and ``bench/frame_codecs.py`` for why not PNG per frame). Any reader can take a
frame with ``numpy.frombuffer(value, uint8).reshape(shape)``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.errors import DatasetError

FRAME_VALUES = 256  # from this many uint8 values on, a Box is a frame


def is_frame(kind: pa.DataType) -> bool:
    """Whether a column of Arrow type ``kind`` is a frame column."""
    return (
        pa.types.is_fixed_size_list(kind)
        and pa.types.is_uint8(kind.value_type)
        and kind.list_size >= FRAME_VALUES
    )


def to_binary(array: pa.Array) -> pa.Array:
    """A frame column as its stored form: one binary value of ``list_size`` bytes a row."""
    size = array.type.list_size
    if not len(array):
        return pa.array([], pa.binary())
    values = array.values  # its own validity is ignored: only the rows' validity counts
    start = values.offset + array.offset * size
    data = np.frombuffer(values.buffers()[1], np.uint8)[start : start + len(array) * size]
    validity = array.is_valid().buffers()[1] if array.null_count else None
    offsets = np.arange(len(array) + 1, dtype=np.int64) * size
    if offsets[-1] < 2**31:  # the frames' own buffer, not a copy (null rows keep their bytes)
        buffers = [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
        return pa.Array.from_buffers(pa.binary(), len(array), buffers)
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.large_binary(), len(array), buffers).cast(pa.binary())


def from_binary(array: pa.Array, kind: pa.DataType, name: str) -> pa.Array:
    """A stored frame column back as ``kind`` (a fixed-size list of uint8), without a copy when
    it holds no nulls.

    Raises:
        DatasetError: when a value is not exactly ``list_size`` bytes long.
    """
    size = kind.list_size
    rows = len(array)
    offsets = np.frombuffer(array.buffers()[1], np.int32)[array.offset : array.offset + rows + 1]
    lengths = np.diff(offsets)
    valid = array.is_valid().to_numpy(zero_copy_only=False) if array.null_count else None
    wrong = (lengths != size) if valid is None else (valid & (lengths != size))
    if wrong.any():
        row = int(np.argmax(wrong))
        raise DatasetError(
            f"{name}: a stored frame of {size} bytes expected in row {row}, "
            f"found {int(lengths[row])} bytes"
        )
    data = np.frombuffer(array.buffers()[2], np.uint8)
    if valid is None:
        return pa.FixedSizeListArray.from_arrays(pa.array(data[offsets[0] : offsets[-1]]), size)
    frames = np.zeros((rows, size), np.uint8)
    starts = offsets[:-1][valid]
    frames[valid] = data[starts[:, None] + np.arange(size)]
    mask = pa.array(~valid)
    return pa.FixedSizeListArray.from_arrays(pa.array(frames.reshape(-1)), size, mask=mask)
