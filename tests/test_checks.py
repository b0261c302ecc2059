"""Arrow batches of the step schema are validated as fully as any other append."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import cartpole_rollout, cartpole_spaces

from pipeline import DatasetWriter, InputReader, SchemaError
from pipeline.format.schema import step_schema, steps_from_columns


def _good_batch(n: int = 6) -> pa.RecordBatch:
    observation_space, action_space = cartpole_spaces()
    schema = step_schema(observation_space, action_space)
    return steps_from_columns(schema, cartpole_rollout(n), observation_space, action_space)


def _replace(batch: pa.RecordBatch, name: str, values: pa.Array) -> pa.RecordBatch:
    index = batch.schema.get_field_index(name)
    return batch.set_column(index, batch.schema.field(index), values)


def test_a_valid_batch_passes_unchanged() -> None:
    batch = _good_batch()
    assert steps_from_columns(batch.schema, _columns(batch), *cartpole_spaces()).equals(batch)


def _columns(batch: pa.RecordBatch) -> dict[str, pa.Array]:
    return {name: batch.column(name) for name in batch.schema.names}


BAD = [
    ("reward", lambda b: _replace(b, "reward", pa.array([1.0, np.nan, 1, 1, 1, 1])),
     "row 1, field 'reward': expected finite values, got nan"),
    ("t", lambda b: _replace(b, "t", pa.array([0, 1, -2, 3, 4, 5])),
     "row 2, field 't': expected a step index >= 0, got -2"),
    ("episode_id", lambda b: _replace(b, "episode_id", pa.array(["", "e", "e", "e", "e", "e"])),
     "row 0, field 'episode_id': expected a non-empty string, got ''"),
    ("info", lambda b: _replace(b, "info", pa.array([None, "{x", None, None, None, None])),
     "row 1, field 'info': expected JSON text, got '{x'"),
    ("action", lambda b: _replace(b, "action", pc.add(b.column("action"), 5)),
     "field 'action': expected an integer in [0, 2)"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "spoil", "message"), BAD, ids=[case for case, _, _ in BAD])
def test_bad_arrow_batches_are_refused_naming_row_and_field(
    tmp_path: Path, case: str, spoil: Any, message: str
) -> None:
    batch = spoil(_good_batch())
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        with pytest.raises(SchemaError, match=re.escape(message)):
            writer.append(batch)
        writer.append(_good_batch())
    assert sum(len(b) for b in InputReader(tmp_path)) == 6, "only the good batch landed"
