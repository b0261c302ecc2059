"""The tables' columns (pipeline/format/schema.py): named once, in the schema's order; seeds
kept exactly."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pytest
from conftest import cartpole_spaces

from pipeline import DatasetWriter, SchemaError
from pipeline.format import schema, seeds


def test_the_column_names_are_the_schemas() -> None:
    assert schema.step_schema(*cartpole_spaces()).names == list(schema.STEP_COLUMNS)
    assert schema.STEP_COLUMNS[: len(schema.TRANSITION_COLUMNS)] == schema.TRANSITION_COLUMNS


SEEDS = [2**64 - 1, 5272104914398938230, 2**63, 2**63 - 1, 0, None]


def summaries(seeds: list[Any], prefix: str = "ep") -> dict[str, list[Any]]:
    now = datetime.now(UTC)
    return schema.rows_to_columns(
        [
            {
                "episode_id": f"{prefix}{i}",
                "started_at": now,
                "ended_at": now,
                "length": 1,
                "return": 0.0,
                "seed": seed,
                "end_reason": "truncated",
            }
            for i, seed in enumerate(seeds)
        ]
    )


@pytest.mark.parametrize("form", ["columns", "batch"])
def test_seeds_up_to_2_64_round_trip_exactly(tmp_path: Path, form: str) -> None:
    """A seed past 2**63 - 1 is stored as the int64 of its 64 bits, and read back exactly;
    none passes through float64 (which made 5272104914398938230 into ...8112)."""
    columns = summaries(SEEDS)
    with DatasetWriter(tmp_path / "ds", *cartpole_spaces()) as writer:
        writer.append_episodes(
            columns if form == "columns" else schema.episodes_from_columns(columns)
        )
        writer.append_episodes(summaries([7], "small"))  # small enough for the log's line form
    table = ds.dataset(tmp_path / "ds/episodes", format="parquet", partitioning="hive").to_table()
    stored = dict(zip(table["episode_id"].to_pylist(), table["seed"].to_pylist(), strict=True))
    assert stored["ep0"] == -1 and stored["ep2"] == -(2**63)  # the same 64 bits as uint64
    assert [seeds.from_storage(stored[f"ep{i}"]) for i in range(len(SEEDS))] == SEEDS
    assert stored["small0"] == 7


@pytest.mark.parametrize(
    ("seed", "got"),
    [
        (-1, "-1"),
        (2**64, str(2**64)),
        (1.0, "1.0"),
        (True, "True"),
        (np.float64(3), "np.float64(3.0)"),
    ],
)
def test_seeds_gymnasium_would_refuse_are_refused(tmp_path: Path, seed: Any, got: str) -> None:
    expected = "an integer seed in [0, 2**64) or null"
    error = pytest.raises(SchemaError, match=re.escape(f"expected {expected}, got {got}"))
    with DatasetWriter(tmp_path / "ds", *cartpole_spaces()) as writer, error:
        writer.append_episodes(summaries([seed]))
