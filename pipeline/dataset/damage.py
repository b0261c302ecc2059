"""Damaged shards: telling a shard whose bytes changed from a sound one, and naming it.

Every page of a shard carries a CRC-32, verified on every read (``shard.parquet_options``,
``discovery``), so a changed data or dictionary page fails its read. The footer has no checksum
in Parquet, and a few of its fields can change without failing a parse; the two that would turn
into wrong rows are checked here before a shard is read: a column's name (its values would read
as nulls) and a row group's row count (its last rows would be left out). Page headers have no
checksum either; a dictionary's that changed leaves indices past its end, checked as each batch
is read. A scan that fails is then named: each of its shards is read whole, and the first that
fails is reported with what is wrong (:class:`~pipeline.errors.DamagedFileError`).

Flipped one bit at a time over every byte of a CartPole shard (bits 0x04 and 0x80 of each,
0x01 or 0x10 of alternate ones), every read was the rows written, or named: none read as other
rows or ended the process (``tests/test_damage.py`` keeps a sample of 1,000).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.dataset.discovery import read_schema
from pipeline.dataset.shard import leaf_paths
from pipeline.errors import DamagedFileError

# a name in a footer is UTF-8 to pyarrow: a flipped high bit can leave bytes that are not
READ_ERRORS = (OSError, pa.ArrowException, UnicodeDecodeError)
_FOOTER_READS = 8  # footers read at once


def footer_problem(metadata: pq.FileMetaData, table_schema: pa.Schema) -> str | None:
    """What is wrong with a shard's footer, or None: its columns are the table's (in order), and
    its row groups' row counts add up to its own.

    Only the schema and the row counts are read here, never a column chunk's metadata:
    pyarrow checks that as it builds it, and ``row_group(i).column(j)`` has no C++ exception
    handler, so a check that fails there (after one flipped bit, a level histogram of another
    length than the column's levels) ends the whole process. A scan builds it where errors are
    caught, and a failed scan is named (:func:`named`).
    """
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
    counts = [metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)]
    if sum(counts) != metadata.num_rows:
        return f"its footer says {metadata.num_rows} rows, its row groups {counts}"
    return None


def shard_problem(filesystem: pafs.FileSystem, path: str, table_schema: pa.Schema) -> str | None:
    """What is wrong with a shard, read whole with its page checksums checked, or None. A
    footer whose changed schema still parses can make a sound-looking file of other types (a
    list column read as a struct of lists), which only the types a scan reads refuse."""
    scanned = read_schema(table_schema)  # the types a scan reads the table's columns in
    types = pa.schema([scanned.field(name) for name in table_schema.names])
    try:
        with filesystem.open_input_file(path) as handle:
            file = pq.ParquetFile(handle, page_checksum_verification=True)
            problem = footer_problem(file.metadata, table_schema)
            if problem is not None:
                return problem
            for index in range(file.num_row_groups):
                try:
                    file.read_row_group(index).cast(types)
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
        for batch in batches:
            yield _checked(batch)
    except READ_ERRORS as error:
        for path in paths:
            problem = shard_problem(filesystem, path, table_schema)
            if problem is not None:
                raise DamagedFileError(path, problem) from error
        raise


def _checked(batch: Any) -> Any:
    """The batch, its dictionary columns' indices checked against their dictionaries: a scan
    that reads a column as a dictionary does not check them, and a flipped bit in a dictionary
    page's header (which no page checksum covers) leaves indices past the end of a shorter
    dictionary (ArrowInvalid here, where the shard is then named). A min and max cost a ninth
    of ``validate(full=True)``, which is 5% of a CartPole read."""
    for column in batch.columns:
        if pa.types.is_dictionary(column.type):
            low, high = pc.min_max(column.indices).values()
            if low.is_valid and (low.as_py() < 0 or high.as_py() >= len(column.dictionary)):
                raise pa.ArrowInvalid("an index is not in its dictionary's bounds")
    return batch


def _reason(error: BaseException) -> str:
    return " ".join(str(error).split())  # pyarrow's messages span lines
