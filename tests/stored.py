"""The step table's rows as tests compare them: every file read whole, its columns in the table's
own types and each ``next_observation`` restored (docs/format.md, section 4.3), as a DataFrame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.dataset import discovery, successors
from pipeline.dataset.location import locate
from pipeline.dataset.storage_types import restore
from pipeline.format import schema
from pipeline.format.manifest import read_manifest


def read_steps(data: Path | str, columns: list[str] | None = None) -> pd.DataFrame:
    """Every committed row of the step table at ``data`` (what ``pd.read_parquet`` gave before
    next observations were stored once)."""
    location = locate(data)
    manifest = read_manifest(location)
    table_schema = schema.step_schema(manifest.observation_space, manifest.action_space)
    parts: list[Any] = []
    for path in discovery.list_shards(location):
        part = restore(pq.read_table(path), table_schema)
        parts.append(successors.fill(part, path))
    if not parts:
        return table_schema.empty_table().to_pandas()
    table = pa.concat_tables(parts, promote_options="permissive")
    return table.to_pandas() if columns is None else table.select(columns).to_pandas()
