"""Finding a dataset's committed shards and dividing them between readers.

A table's committed shards are the data files of its Delta snapshot, whoever wrote them; a file
in its directory that no commit names is not part of it. Work is divided by hashing a stable
name, never by position in a listing, so that readers that list at different moments still agree
on who reads what.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from pipeline.dataset import successors
from pipeline.dataset.delta import Table
from pipeline.dataset.location import Location
from pipeline.dataset.storage_types import has_frame, storage_type
from pipeline.format import layout, seeds
from pipeline.format.schema import EPISODE_SCHEMA

_PARTITIONING = ds.partitioning(pa.schema([(layout.PARTITION_KEY, pa.string())]), flavor="hive")
# Ids repeat across rows and are stored dictionary-encoded; reading them as dictionaries skips
# building a string per row (a third of a CartPole scan), and decoding by index is cheap later.
DICTIONARY_COLUMNS = ("episode_id", "agent_id", "client_id")
# Shards carry a CRC-32 per page (shard.parquet_options); a page whose bytes changed since it was
# written fails the scan instead of decoding into wrong rows.
_FORMAT = ds.ParquetFileFormat(
    read_options=ds.ParquetReadOptions(dictionary_columns=list(DICTIONARY_COLUMNS)),
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True),
)


@dataclass(frozen=True)
class Part:
    """Which slice of the work one reader owns: ``index`` of ``count`` (ranks times workers)."""

    index: int = 0
    count: int = 1

    def owns(self, key: str) -> bool:
        return self.count == 1 or zlib.crc32(key.encode()) % self.count == self.index


def list_shards(location: Location, table: str = layout.STEPS) -> list[str]:
    """Filesystem paths of a table's committed shards, oldest partition first, then by name."""
    return [location.path(table, entry.path) for entry in Table(location, table).files()]


def committed(
    location: Location, table: str, table_schema: pa.Schema
) -> ds.FileSystemDataset | None:
    """A table's committed shards as one dataset; None before its first commit."""
    paths = list_shards(location, table)
    if not paths:
        return None
    return open_dataset(location.filesystem, location.root, paths, table_schema, table)


def open_dataset(
    filesystem: pafs.FileSystem,
    root: str,
    paths: Sequence[str],
    schema: pa.Schema,
    table: str,
    sizes: Sequence[int | None] | None = None,
) -> ds.FileSystemDataset:
    """A pyarrow dataset over exactly ``paths``, with the ``date`` partition column. Given the
    files' ``sizes`` (a Delta snapshot has them), no file is asked its size: on object storage
    that is a request per file before its footer can be read."""
    if sizes is not None:
        base = f"{root}/{table}/"
        fragments = [
            _FORMAT.make_fragment(
                path,
                filesystem,
                partition_expression=_PARTITIONING.parse(path.removeprefix(base)),
                file_size=size,
            )
            for path, size in zip(paths, sizes, strict=True)
        ]
        return ds.FileSystemDataset(fragments, read_schema(schema), _FORMAT, filesystem)
    return ds.dataset(
        list(paths),
        schema=read_schema(schema),
        format=_FORMAT,
        filesystem=filesystem,
        partitioning=_PARTITIONING,
        partition_base_dir=f"{root}/{table}",
    )


def read_schema(schema: pa.Schema) -> pa.Schema:
    """The schema a scan yields: ids as dictionaries, frames as stored (binary,
    ``storage_types.restore`` turns them back), ``next_observation`` nullable, plus the ``date``
    partition column."""
    for index, field in enumerate(schema):
        if has_frame(field.type) or field.name == successors.NEXT:
            kind = storage_type(field.type) if has_frame(field.type) else field.type
            schema = schema.set(index, field.with_type(kind).with_nullable(True))
    for name in DICTIONARY_COLUMNS:
        if name in schema.names:
            index = schema.get_field_index(name)
            field = schema.field(index)
            schema = schema.set(index, field.with_type(pa.dictionary(pa.int32(), pa.string())))
    if layout.PARTITION_KEY not in schema.names:
        schema = schema.append(pa.field(layout.PARTITION_KEY, pa.string()))
    return schema


def owned_rows(episode_ids: pa.Array, part: Part) -> pa.Array:
    """A mask of the rows whose episode ``part`` owns, hashing each distinct id once."""
    if not pa.types.is_dictionary(episode_ids.type):
        episode_ids = episode_ids.dictionary_encode()
    names = episode_ids.dictionary.to_pylist()
    owned = np.array([part.owns(name) for name in names], dtype=bool)
    return pa.array(owned[episode_ids.indices.to_numpy(zero_copy_only=False)])


def owned_fragments(
    dataset: ds.FileSystemDataset, part: Part, filter: ds.Expression | None
) -> list[ds.Fragment]:
    """The row groups of ``dataset`` that belong to ``part`` (all of them when it is the whole)."""
    fragments: Iterable[ds.Fragment] = dataset.get_fragments(filter=filter)
    if part.count == 1:
        return list(fragments)
    owned = []
    for fragment in fragments:
        for group in fragment.split_by_row_group(filter=filter):
            index = group.row_groups[0].id
            if part.owns(f"{fragment.path}#{index}"):
                owned.append(group)
    return owned


_KEEP = "__rlpipe_keep"  # a row filter's column in a scan's projection


def rows_where(
    dataset: ds.Dataset,
    columns: Sequence[str] | None,
    keep: ds.Expression | None,
    partitions: ds.Expression | None = None,
) -> Iterator[pa.RecordBatch]:
    """The ``columns`` (None: all) of the rows of ``dataset`` that ``keep`` keeps, in the
    ``date`` partitions ``partitions`` names.

    ``keep`` is judged row by row, as a column of the scan's projection: as a scan's filter,
    Arrow would also leave out every row group whose footer statistics say it holds no match,
    and the footer has no checksum, so a flipped bit in a min or max would drop rows without a
    word (page checksums cover the values, not the statistics).
    """
    names = list(columns) if columns is not None else dataset.schema.names
    if keep is None:
        yield from dataset.to_batches(columns=names, filter=partitions)
        return
    projection = {**{name: ds.field(name) for name in names}, _KEEP: keep}
    for batch in dataset.to_batches(columns=projection, filter=partitions):
        mask = batch.column(_KEEP)
        kept = batch.select(names)
        yield kept if mask.null_count == 0 and pc.all(mask).as_py() else kept.filter(mask)


def reset_args(
    location: Location, keep: ds.Expression | None = None
) -> dict[str, tuple[int | None, Any]]:
    """episode id -> (seed, reset options) from the episodes table's latest row of each episode
    that ``keep`` keeps."""
    dataset = committed(location, layout.EPISODES, EPISODE_SCHEMA)
    if dataset is None:
        return {}
    columns = ["episode_id", "seed", "reset_options", "logged_at"]
    rows = [row for batch in rows_where(dataset, columns, keep) for row in batch.to_pylist()]
    found = {}
    for row in sorted(rows, key=lambda row: row["logged_at"]):
        options = row["reset_options"]
        found[row["episode_id"]] = (
            seeds.from_storage(row["seed"]),  # seeds past 2**63 - 1 are stored negative
            json.loads(options) if isinstance(options, str) else None,
        )
    return found
