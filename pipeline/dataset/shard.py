"""A shard: one immutable Parquet file of committed rows, and how it is encoded and committed.

Encoding, measured on CartPole rows: zstd, dictionary encoding only on non-float leaves, and
BYTE_STREAM_SPLIT on float leaves give about 27-31 bytes per step against 39-48 with pyarrow's
defaults, and write several times faster. A shard is written at its final path and fsynced; it
becomes visible only when a Delta commit names it (:mod:`pipeline.dataset.delta`), so readers see
whole files or nothing; a write that fails (a full disk) removes its file.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from pipeline.dataset import successors
from pipeline.dataset.delta import add_action
from pipeline.dataset.location import Location
from pipeline.dataset.storage_types import to_storage
from pipeline.dataset.wal import fsync_path
from pipeline.format import frames, layout


def leaf_paths(field: pa.Field, prefix: str = "") -> Iterator[tuple[str, pa.DataType]]:
    """Parquet column paths of a field's leaves (lists are stored as ``name.list.element``)."""
    path = f"{prefix}{field.name}"
    kind = field.type
    if frames.is_frame(kind) or pa.types.is_binary(kind):  # a frame is one value a row
        yield path, pa.binary()
    elif pa.types.is_struct(kind):
        for index in range(kind.num_fields):
            yield from leaf_paths(kind.field(index), f"{path}.")
    elif pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind):  # stored as lists
        yield from leaf_paths(pa.field("element", kind.value_type), f"{path}.list.")
    else:
        yield path, kind


def parquet_options(schema: pa.Schema) -> dict[str, object]:
    """Writer options for a table: the encodings that keep shards small and fast."""
    dictionary: list[str] = []
    split: dict[str, str] = {}
    statistics: list[str] = []
    for field in schema:
        for path, kind in leaf_paths(field):
            if pa.types.is_binary(kind):  # frames: plain bytes, zstd, no min and max of frames
                continue
            statistics.append(path)
            if pa.types.is_floating(kind) or (pa.types.is_integer(kind) and _image(field)):
                split[path] = "BYTE_STREAM_SPLIT"
            elif pa.types.is_integer(kind) and field.name == "t":
                split[path] = "DELTA_BINARY_PACKED"  # steps count up within an episode
            else:
                dictionary.append(path)
    return {
        "compression": "zstd",
        "use_dictionary": dictionary,
        "column_encoding": split,
        "write_statistics": statistics,
        "write_page_checksum": True,  # a CRC-32 per page, verified by every rlpipe reader
    }


def _compression(data: pa.Table) -> str | dict[str, str]:
    """zstd for every column, but a frame column whose first frames zstd cannot shrink by a
    tenth (random frames, noise) is left uncompressed: zstd spent ~30% of a local client's
    server CPU in bench/pixels.py failing to compress random frames. Rendered frames compress
    about 90x and keep zstd."""
    plain = [
        field.name
        for field in data.schema
        if pa.types.is_binary(field.type) and not _shrinks(data.column(field.name))
    ]
    return (
        {name: "none" if name in plain else "zstd" for name in data.column_names}
        if plain
        else "zstd"
    )


def _shrinks(column: pa.ChunkedArray) -> bool:
    """Whether zstd makes the first non-null values of a binary column a tenth smaller."""
    sample = column.drop_null().slice(0, _SAMPLE_ROWS).to_pylist()
    raw = b"".join(sample)
    return not raw or len(_ZSTD.compress(raw, asbytes=True)) < 0.9 * len(raw)


_SAMPLE_ROWS = 4
_ZSTD = pa.Codec("zstd")


def _image(field: pa.Field) -> bool:
    """A column of large integer arrays (camera frames): their values are stored split by byte
    rather than by dictionary, 3x faster to write and 1.4x to read for 84x84x3 uint8 frames
    (random or rendered), for the same size (1.00x random frames, 0.003x rendered ones)."""
    kind = field.type
    return pa.types.is_fixed_size_list(kind) and kind.list_size >= _IMAGE_VALUES


_IMAGE_VALUES = 256


def write_shard(
    location: Location,
    table: str,
    writer_id: str,
    seq: int,
    date: str,
    batches: Sequence[pa.RecordBatch],
    row_group_rows: int,
    row_group_bytes: int = 64 * 2**20,
) -> tuple[str, AddAction]:
    """Write ``batches`` as the shard of (writer, seq) at its final path, in storage types, in
    row groups of at most ``row_group_rows`` rows and about ``row_group_bytes`` bytes; returns
    its path under the table and the Add action that commits it. Until a commit names
    it, no Delta reader sees the file; writing it again (recovery) replaces it whole."""
    filesystem = location.filesystem
    relative = f"{layout.PARTITION_KEY}={date}/{layout.shard_name(writer_id, seq)}"
    directory = location.path(table, f"{layout.PARTITION_KEY}={date}")
    final = location.path(table, relative)
    local = location.local
    data = to_storage(successors.omit(pa.Table.from_batches(list(batches))))
    row_bytes = max(1, data.nbytes // max(1, data.num_rows))
    group_rows = max(1, min(row_group_rows, row_group_bytes // row_bytes))
    if local:
        filesystem.create_dir(directory, recursive=True)
    try:
        sink = filesystem.open_output_stream(final)
        try:
            options = {**parquet_options(data.schema), "compression": _compression(data)}
            with pq.ParquetWriter(sink, data.schema, **options) as writer:
                writer.write_table(data, row_group_size=group_rows)
            size = sink.tell()  # the file's size, without asking the store
        finally:
            sink.close()
        if local:
            fsync_path(final)
            fsync_path(directory)
            fsync_path(location.path(table))  # a partition directory made for this shard
    except BaseException:  # a full disk, say: no half-written file is left behind
        with contextlib.suppress(OSError):
            filesystem.delete_file(final)
        raise
    return relative, add_action(relative, size, date, writer.writer.metadata)


def first_date(batch: pa.RecordBatch) -> str:
    """A shard goes in the partition of its first row's UTC date (see docs/format.md)."""
    return date_of(batch.column("logged_at")[0].value)


def date_of(microseconds: int) -> str:
    """The UTC date of a ``logged_at`` value, as partitions name it."""
    return _date_of_day(microseconds // 86_400_000_000)


@functools.lru_cache(maxsize=16)
def _date_of_day(day: int) -> str:  # strftime costs ~20 us of a step's CPU; a day has one date
    return time.strftime("%Y-%m-%d", time.gmtime(day * 86_400))
