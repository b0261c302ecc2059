"""Tables with named columns: a pandas DataFrame, a CSV file or a Parquet file (or directory).

Columns use the step table's names: ``episode_id``, ``observation``, ``action``, ``reward``,
``next_observation`` (required), and ``terminated``/``truncated`` or a single ``done``,
``agent_id``, ``t``, ``action_logp``, and ``seed``, ``reset_options`` (an episode's first row
gives them) and ``info`` (optional). Seeds are read as exact integers up to 2**64 - 1 (a uint64
column, or pandas' ``UInt64`` for one with gaps; a float column is refused, since float64 rounds
seeds past 2**53); ``reset_options`` and ``info`` are JSON text or structs. A vector may be one
list-valued column (Parquet, DataFrame) or spread over numbered columns ``observation_0``,
``observation_1``, ... (CSV, which has no lists).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.errors import DatasetError
from pipeline.importers.columns import arrow_to_numpy
from pipeline.importers.files import read_files
from pipeline.importers.transitions import ImportSummary, SourceSteps, write_dataset

COLUMNS = {
    "episode_id": "episode_keys",
    "observation": "observations",
    "action": "actions",
    "reward": "rewards",
    "next_observation": "next_observations",
    "terminated": "terminateds",
    "truncated": "truncateds",
    "done": "dones",
    "agent_id": "agent_ids",
    "t": "ts",
    "action_logp": "action_logps",
    "seed": "seeds",
    "reset_options": "reset_options",
    "info": "infos",
}
_PER_VALUE = ("seed", "reset_options", "info")  # Python values, nulls allowed
REQUIRED = ("episode_id", "observation", "action", "reward", "next_observation")
_SUFFIXES = (".csv", ".parquet", ".pq")
_NUMBERED = re.compile(rf"^({'|'.join(COLUMNS)})_\d+$")


def import_dataframe(
    frame: Any,
    path: str | Path,
    *,
    env_id: str | None = None,
    max_episode_steps: int | None = None,
    actions_normalized: bool = False,
) -> ImportSummary:
    """Import a pandas DataFrame with named columns as a new dataset at ``path``
    (the keywords are :func:`~pipeline.importers.transitions.write_dataset`'s)."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    steps = table_to_steps(table, "DataFrame")
    return write_dataset(
        steps,
        path,
        env_id=env_id,
        max_episode_steps=max_episode_steps,
        actions_normalized=actions_normalized,
    )


def read_table(src: str | Path) -> SourceSteps:
    """A CSV or Parquet file, or a directory or glob pattern of them, as source steps.

    Raises:
        DatasetError: naming the file and the column, when the files differ in their columns.
    """
    suffix = Path(str(src)).suffix.lower()
    file_format = "csv" if suffix == ".csv" else "parquet"
    if suffix and suffix not in _SUFFIXES:
        raise DatasetError(f"{src}: expected a .csv or .parquet file, got {suffix}")
    return table_to_steps(read_files(src, file_format, _relevant), str(src))


def table_to_steps(table: pa.Table, where: str) -> SourceSteps:
    """Map named columns onto :class:`SourceSteps`, gathering numbered vector columns."""
    columns: dict[str, np.ndarray] = {}
    for name, field in COLUMNS.items():
        values = _gather(table, name, where)
        if values is not None:
            columns[field] = values
    missing = [name for name in REQUIRED if COLUMNS[name] not in columns]
    if missing:
        raise DatasetError(
            f"{where}: missing columns {missing}; found {table.column_names} (a vector may also "
            "be spread over numbered columns such as observation_0, observation_1, ...)"
        )
    return SourceSteps(**columns)


def _relevant(column: str) -> bool:
    """A column :func:`table_to_steps` reads: one it names, or a numbered part of one."""
    return column in COLUMNS or _NUMBERED.match(column) is not None


def _gather(table: pa.Table, name: str, where: str) -> np.ndarray | None:
    if name in _PER_VALUE:
        if name not in table.column_names:
            return None
        column = table.column(name)
        values = np.empty(len(column), dtype=object)
        values[:] = column.to_pylist()  # exact: a uint64 seed becomes a Python int
        return values if not pa.types.is_floating(column.type) else column.to_numpy()
    if name in table.column_names:
        return arrow_to_numpy(table.column(name), f"{where}: '{name}'")
    pattern = re.compile(rf"^{name}_(\d+)$")
    numbered = sorted(
        (int(match[1]), column)
        for column in table.column_names
        if (match := pattern.match(column)) is not None
    )
    if not numbered:
        return None
    indices = [index for index, _ in numbered]
    if indices != list(range(len(indices))):
        raise DatasetError(
            f"{where}: columns {name}_* must be numbered 0..{len(indices) - 1}, got {indices}"
        )
    parts = [arrow_to_numpy(table.column(column), f"{where}: '{column}'") for _, column in numbered]
    return np.stack(parts, axis=1)
