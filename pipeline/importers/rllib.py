"""Reading RLlib's offline recordings: SampleBatch JSON lines and Ray Data JSONL or Parquet.

Two generations of RLlib output exist. The old ``JsonWriter`` writes one SampleBatch per line, its
columns either plain lists or packed as base64 of LZ4 of a pickled ndarray
(``ray.rllib.utils.compression.pack``). The new ``OfflineData`` writer goes through Ray Data: one
step per row, in many small JSONL or Parquet files, vectors as variable-length ``list<double>``
(or ``ray.data.arrow_tensor`` lists of floats). Both name columns the same way (``eps_id``,
``obs``, ``new_obs``, ``actions``, ``rewards``, ``dones``, ...), which is what lets one mapping
serve both.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import DatasetError
from pipeline.importers.columns import arrow_to_numpy, concat_exact, exact_array
from pipeline.importers.files import column_difference, data_files, read_files
from pipeline.importers.transitions import SourceSteps
from pipeline.importers.unpickler import load_ndarray

# RLlib column -> SourceSteps field. ``terminateds``/``truncateds`` are newer RLlib's, ``dones``
# the older single flag.
COLUMNS = {
    "eps_id": "episode_keys",
    "obs": "observations",
    "actions": "actions",
    "rewards": "rewards",
    "new_obs": "next_observations",
    "terminateds": "terminateds",
    "truncateds": "truncateds",
    "dones": "dones",
    "agent_index": "agent_ids",
    "t": "ts",
    "action_logp": "action_logps",
}
REQUIRED = ("eps_id", "obs", "actions", "rewards", "new_obs")
_LZ4_MAGIC = b"\x04\x22\x4d\x18"


def read_sample_batches(src: str | Path) -> SourceSteps:
    """Old-style RLlib output: a JSON-lines file of SampleBatches, or a directory, a glob pattern
    (``DIR/*.json``) or a zip of them, as RLlib's ``JsonReader`` takes them.

    Raises:
        DatasetError: naming the line, when a batch's columns differ in length or from those of
            the first batch.
    """
    pieces: dict[str, list[np.ndarray]] = {}
    first: tuple[str, list[str]] | None = None
    for where, line in _lines(src):
        batch = _parse_line(line, where)
        names = [name for name in COLUMNS if name in batch]
        if first is None:
            first = (where, names)
        elif (error := column_difference(where, names, *first, "SampleBatch")) is not None:
            raise error
        columns = {name: _column(batch[name], f"{where}: '{name}'") for name in names}
        _check_lengths(columns, where)
        for name, values in columns.items():
            pieces.setdefault(name, []).append(values)
    if "eps_id" not in pieces:
        raise DatasetError(f"{src}: no SampleBatch lines found")
    columns = {name: concat_exact(parts) for name, parts in pieces.items()}
    return to_source_steps(columns, str(src))


def read_ray_data(src: str | Path, file_format: str) -> SourceSteps:
    """New-style RLlib output written by Ray Data: ``file_format`` is "json" or "parquet"."""
    table = read_files(src, file_format, COLUMNS.__contains__)
    columns = {name: arrow_to_numpy(table[name], f"{src}: '{name}'") for name in table.column_names}
    return to_source_steps(columns, str(src))


def to_source_steps(columns: dict[str, np.ndarray], where: str) -> SourceSteps:
    """Map RLlib's column names onto :class:`SourceSteps`; ``agent_index`` becomes ``agent<i>``."""
    missing = [name for name in REQUIRED if name not in columns]
    if missing:
        raise DatasetError(
            f"{where}: missing RLlib columns {missing}; found {sorted(columns)} "
            f"(an RLlib recording needs {list(REQUIRED)})"
        )
    fields = {COLUMNS[name]: values for name, values in columns.items()}
    if "agent_ids" in fields:
        fields["agent_ids"] = np.char.add("agent", fields["agent_ids"].astype(str))
    return SourceSteps(**fields)


def _lines(src: str | Path) -> Iterator[tuple[str, str]]:
    """(where, line) for every non-blank line of every file ``src`` names, in name order."""
    filesystem, paths = data_files(src)
    for path in paths:
        with filesystem.open_input_file(path) as handle:
            data = handle.read()
        if path.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                for name in sorted(n for n in archive.namelist() if not n.endswith("/")):
                    yield from _numbered(f"{path}!{name}", archive.read(name))
        else:
            yield from _numbered(path, data)


def _numbered(where: str, data: bytes) -> Iterator[tuple[str, str]]:
    for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if line.strip():
            yield f"{where}:{number}", line


def _parse_line(line: str, where: str) -> dict[str, Any]:
    try:
        batch = json.loads(line)
    except json.JSONDecodeError as error:
        raise DatasetError(f"{where}: not JSON ({error})") from None
    kind = batch.get("type") if isinstance(batch, dict) else None
    if kind != "SampleBatch":
        raise DatasetError(
            f'{where}: expected a SampleBatch line ({{"type": "SampleBatch", ...}}), got type '
            f"{kind!r}; multi-agent batches are not supported"
        )
    return batch


def _check_lengths(columns: dict[str, np.ndarray], where: str) -> None:
    if not columns:
        return
    name, values = next(iter(columns.items()))
    n = len(values)
    wrong = [f"'{other}' has {len(v)}" for other, v in columns.items() if len(v) != n]
    if wrong:
        raise DatasetError(
            f"{where}: columns differ in length: '{name}' has {n} rows, " + ", ".join(wrong)
        )


def _column(value: Any, where: str) -> np.ndarray:
    """A SampleBatch column: a plain list, or base64 of LZ4 of a pickled ndarray."""
    if not isinstance(value, str):
        return exact_array(value)
    try:
        packed = base64.b64decode(value, validate=True)
    except binascii.Error:
        raise DatasetError(f"{where}: a string that is not base64") from None
    if not packed.startswith(_LZ4_MAGIC):
        raise DatasetError(f"{where}: a packed column that is not LZ4-framed")
    try:
        import lz4.frame
    except ModuleNotFoundError:
        raise DatasetError(
            f"{where}: packed (LZ4) columns need the lz4 package: pip install lz4"
        ) from None
    return load_ndarray(lz4.frame.decompress(packed), where)
