"""Which files a source names, and those files read as one Arrow dataset with the same columns.

A source (``SRC`` of ``rlpipe import``) is a file, a directory or a glob pattern, as RLlib's
``JsonReader`` takes them. A directory stands for its files, recursively, skipping names that start
with ``.`` or ``_`` (as pyarrow's dataset discovery does). A pattern (``DIR/*.json``) follows
Python's ``glob`` rules: ``*``, ``?`` and ``[...]`` match within one path component, and a name
starting with ``.`` matches only a pattern component that does too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from pipeline.dataset.location import locate
from pipeline.errors import DatasetError

_MAGIC = re.compile(r"[*?[]")


def data_files(src: str | Path) -> tuple[pafs.FileSystem, list[str]]:
    """The filesystem and the files ``src`` names, in name order.

    Raises:
        DatasetError: when nothing is there, the directory is empty or the pattern matches nothing.
    """
    location = locate(src)
    filesystem, root = location.filesystem, location.root
    if _MAGIC.search(root):
        return filesystem, _glob(filesystem, root, src)
    info = filesystem.get_file_info(root)
    if info.type == pafs.FileType.File:
        return filesystem, [root]
    if info.type != pafs.FileType.Directory:
        raise DatasetError(f"{src}: no such file or directory")
    selector = pafs.FileSelector(root, recursive=True)
    paths = sorted(
        entry.path
        for entry in filesystem.get_file_info(selector)
        if entry.type == pafs.FileType.File
        and not any(part.startswith((".", "_")) for part in _relative(entry.path, root))
    )
    if not paths:
        raise DatasetError(f"{src}: an empty directory")
    return filesystem, paths


def read_files(src: str | Path, file_format: str, relevant: Callable[[str], bool]) -> pa.Table:
    """The ``relevant`` columns of the files of ``src`` as one table, refused when the files
    differ in them.

    pyarrow takes the first file's schema for all: a column missing from a later file would come
    back as nulls, and one only a later file has would be dropped without a word.

    Raises:
        DatasetError: naming the file and the columns where it differs from the first file, or a
            file that cannot be read as ``file_format``.
    """
    filesystem, paths = data_files(src)
    try:
        dataset = ds.dataset(paths, format=file_format, filesystem=filesystem)
        first: tuple[str, list[str]] | None = None
        for fragment in dataset.get_fragments():
            names = [name for name in fragment.physical_schema.names if relevant(name)]
            if first is None:
                first = (fragment.path, names)
            elif (error := column_difference(fragment.path, names, *first)) is not None:
                raise error
        return dataset.to_table(columns=[n for n in dataset.schema.names if relevant(n)])
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise DatasetError(f"{src}: unreadable as {file_format} ({error})") from None


def column_difference(
    where: str, names: list[str], first_where: str, first_names: list[str], part: str = "file"
) -> DatasetError | None:
    """The error for a ``part`` of a source whose columns are not those of its first, if any."""
    missing = [name for name in first_names if name not in names]
    extra = [name for name in names if name not in first_names]
    if not missing and not extra:
        return None
    differences = [f"missing {missing}"] if missing else []
    differences += [f"extra {extra}"] if extra else []
    return DatasetError(
        f"{where}: its columns differ from those of {first_where}: {', '.join(differences)} "
        f"(every {part} of a source must hold the same columns)"
    )


def _glob(filesystem: pafs.FileSystem, pattern: str, src: str | Path) -> list[str]:
    parts = pattern.split("/")
    fixed = next(index for index, part in enumerate(parts) if _MAGIC.search(part))
    base, wanted = "/".join(parts[:fixed]) or "/", parts[fixed:]
    if filesystem.get_file_info(base).type != pafs.FileType.Directory:
        raise DatasetError(f"{src}: no such directory {base}")
    selector = pafs.FileSelector(base, recursive=len(wanted) > 1)
    paths = sorted(
        entry.path
        for entry in filesystem.get_file_info(selector)
        if entry.type == pafs.FileType.File and _matches(_relative(entry.path, base), wanted)
    )
    if not paths:
        raise DatasetError(f"{src}: no files match")
    return paths


def _matches(names: list[str], pattern: list[str]) -> bool:
    return len(names) == len(pattern) and all(
        fnmatchcase(name, part) and (part.startswith(".") or not name.startswith("."))
        for name, part in zip(names, pattern, strict=True)
    )


def _relative(path: str, root: str) -> list[str]:
    return path[len(root.rstrip("/")) + 1 :].split("/")
