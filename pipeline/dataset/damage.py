"""Damaged shards: telling a shard whose bytes changed from a sound one, and naming it.

Every page of a shard carries a CRC-32, verified on every read (``shard.parquet_options``,
``discovery``), so a changed data or dictionary page fails its read. The footer has no checksum
in Parquet, and a few of its fields can change without failing a parse; the two that would turn
into wrong rows are checked here before a shard is read: a column's name (its values would read
as nulls) and a row group's row count (its last rows would be left out). A scan that fails is
then named: each of its shards is read whole, and the first that fails is reported with what is
wrong (:class:`~pipeline.errors.DamagedFileError`).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.dataset.shard import leaf_paths
from pipeline.errors import DamagedFileError

READ_ERRORS = (OSError, pa.ArrowException)
_FOOTER_READS = 8  # footers read at once


def footer_problem(metadata: pq.FileMetaData, table_schema: pa.Schema) -> str | None:
    """What is wrong with a shard's footer, or None: its columns are the table's (in order), and
    every row group's row count is the value count of each of its flat columns."""
    expected = [path for field in table_schema for path, _ in leaf_paths(field)]
    # a list's element is "element" in rlpipe's files and "item" in some other writers' (arrow-rs)
    found = [
        metadata.schema.column(i).path.replace(".list.item", ".list.element")
        for i in range(metadata.num_columns)
    ]
    if found != expected:
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        return f"its footer's columns differ from the table's (missing {missing}, unknown {extra})"
    flat = [i for i, path in enumerate(found) if ".list." not in path]
    total = 0
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        total += group.num_rows
        counts = {group.column(i).num_values for i in flat}
        if counts != {group.num_rows}:
            return (
                f"its footer says row group {index} has {group.num_rows} rows, but its columns "
                f"hold {sorted(counts)} values"
            )
    if total != metadata.num_rows:
        return f"its footer says {metadata.num_rows} rows, its row groups {total}"
    return None


def shard_problem(filesystem: pafs.FileSystem, path: str, table_schema: pa.Schema) -> str | None:
    """What is wrong with a shard, read whole with its page checksums checked, or None."""
    try:
        with filesystem.open_input_file(path) as handle:
            file = pq.ParquetFile(handle, page_checksum_verification=True)
            problem = footer_problem(file.metadata, table_schema)
            if problem is not None:
                return problem
            for index in range(file.num_row_groups):
                try:
                    file.read_row_group(index)
                except READ_ERRORS as error:
                    return f"row group {index} cannot be read ({_reason(error)})"
    except READ_ERRORS as error:
        return f"its footer cannot be read ({_reason(error)})"
    return None


def check_fragments(dataset: ds.FileSystemDataset, table_schema: pa.Schema) -> None:
    """Read each shard's footer (the scan then reuses it) and check it. On object storage,
    where each is a round trip, the footers are read a few at a time; on a local disk one by one
    (a thread pool cost a following trainer more than its reads: 16 of the 74 ms of a read of 40
    small shards).

    Raises:
        DamagedFileError: the first shard whose footer cannot be read, or that
            :func:`footer_problem` doubts.
    """
    fragments = list(dataset.get_fragments())
    if len(fragments) > 1 and not isinstance(dataset.filesystem, pafs.LocalFileSystem):
        with ThreadPoolExecutor(min(len(fragments), _FOOTER_READS)) as pool:
            problems = list(pool.map(lambda f: _fragment_problem(f, table_schema), fragments))
    else:
        problems = [_fragment_problem(fragment, table_schema) for fragment in fragments]
    for fragment, problem in zip(fragments, problems, strict=True):
        if problem is not None:
            raise DamagedFileError(fragment.path, problem)


def _fragment_problem(fragment: Any, table_schema: pa.Schema) -> str | None:
    try:
        fragment.ensure_complete_metadata()
        return footer_problem(fragment.metadata, table_schema)
    except FileNotFoundError:
        raise  # not damage: a file a commit names is gone (vacuumed), which the caller names
    except READ_ERRORS as error:
        return f"its footer cannot be read ({_reason(error)})"


def named(
    batches: Iterator[Any], filesystem: pafs.FileSystem, paths: list[str], table_schema: pa.Schema
) -> Iterator[Any]:
    """``batches`` of a scan of ``paths``; a read that fails is named by the shard that fails.

    Raises:
        DamagedFileError: the first of ``paths`` that fails a whole read.
    """
    try:
        yield from batches
    except READ_ERRORS as error:
        for path in paths:
            problem = shard_problem(filesystem, path, table_schema)
            if problem is not None:
                raise DamagedFileError(path, problem) from error
        raise


def _reason(error: BaseException) -> str:
    return " ".join(str(error).split())  # pyarrow's messages span lines
