"""``rlpipe import rlpipe-v1 SRC DST``: a dataset of format version 1 as a new one of today's.

Version 1 kept shards in ``steps/date=.../`` and ``episodes/date=.../`` directories, committed by
renaming them into place: every ``*.parquet`` there whose name does not start with ``.`` or ``_``
was part of the table. Version 2 keeps the same rows in Delta tables. The conversion reads every
shard (page checksums checked, so a damaged one is refused, not copied) and appends its rows,
their ``logged_at`` kept, through a :class:`~pipeline.dataset.writer.DatasetWriter`, so they land in
the partitions of their own dates; the manifest's spaces, env id and creation time carry over,
and so do the dataset's ``checkpoints/``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.dataset.damage import READ_ERRORS
from pipeline.dataset.location import Location, locate
from pipeline.dataset.writer import DatasetWriter
from pipeline.dataset.writer_config import WriterConfig
from pipeline.errors import DamagedFileError, DatasetError
from pipeline.format import layout
from pipeline.format.manifest import create_manifest, read_manifest

VERSION = 1
CHECKPOINTS = "checkpoints"
# One shard per source shard at most: a version-1 dataset's shards stay whole.
_CONFIG = WriterConfig(max_rows=2**31 - 1, max_bytes=2**40, max_age_s=3600.0)


@dataclass(frozen=True)
class Converted:
    """What a conversion wrote: the new dataset and its rows."""

    path: str
    steps: int
    episodes: int
    shards: int

    def describe(self) -> str:
        return (
            f"converted {self.shards} shards into {self.path}: {self.steps} steps, "
            f"{self.episodes} episode rows"
        )


def convert(
    src: str | Path,
    dst: str | Path,
    storage_options: dict[str, str] | None = None,
) -> Converted:
    """Write the version-1 dataset ``src`` as a new dataset at ``dst``.

    Raises:
        FormatVersionError: ``src`` is not of format version 1.
        DatasetError: ``dst`` already holds a dataset.
        DamagedFileError: a shard of ``src`` whose bytes changed.
    """
    source = locate(src, storage_options)
    manifest = read_manifest(source, version=VERSION)
    target = locate(dst, storage_options)
    if target.filesystem.get_file_info(target.path(layout.MANIFEST)).type != pafs.FileType.NotFound:
        raise DatasetError(f"{target.uri}: already holds a dataset; convert into a new one")
    create_manifest(target, dataclasses.replace(manifest, format_version=layout.FORMAT_VERSION))
    counts = {layout.STEPS: 0, layout.EPISODES: 0}
    shards = 0
    with DatasetWriter(
        dst,
        manifest.observation_space,
        manifest.action_space,
        env_id=manifest.env_id,
        config=_CONFIG,
        storage_options=storage_options,
    ) as writer:
        for table in layout.TABLES:
            append = writer.append if table == layout.STEPS else writer.append_episodes
            for path in shards_of(source, table):
                counts[table] += append(_read(source, path))
                writer.flush()  # one shard per source shard
                shards += 1
    _copy_checkpoints(source, target)
    return Converted(target.uri, counts[layout.STEPS], counts[layout.EPISODES], shards)


def shards_of(location: Location, table: str) -> list[str]:
    """A version-1 table's shards: its visible ``*.parquet`` files, oldest partition first."""
    selector = pafs.FileSelector(location.path(table), recursive=True, allow_not_found=True)
    base = len(location.path(table)) + 1
    return sorted(
        info.path
        for info in location.filesystem.get_file_info(selector)
        if info.type == pafs.FileType.File
        and info.base_name.endswith(".parquet")
        and not any(part.startswith((".", "_")) for part in info.path[base:].split("/"))
    )


def _read(location: Location, path: str) -> pa.Table:
    try:
        with location.filesystem.open_input_file(path) as handle:
            return pq.ParquetFile(handle, page_checksum_verification=True).read()
    except READ_ERRORS as error:
        raise DamagedFileError(path, f"it cannot be read ({error})") from None


def _copy_checkpoints(source: Location, target: Location) -> None:
    folder = source.path(CHECKPOINTS)
    if source.filesystem.get_file_info(folder).type != pafs.FileType.Directory:
        return
    if target.local:
        target.filesystem.create_dir(target.path(CHECKPOINTS), recursive=True)
    pafs.copy_files(
        folder,
        target.path(CHECKPOINTS),
        source_filesystem=source.filesystem,
        destination_filesystem=target.filesystem,
    )
