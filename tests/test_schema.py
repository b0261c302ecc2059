"""The step table's columns (pipeline/format/schema.py): named once, in the schema's order."""

from __future__ import annotations

from conftest import cartpole_spaces

from pipeline.format import schema


def test_the_column_names_are_the_schemas() -> None:
    assert schema.step_schema(*cartpole_spaces()).names == list(schema.STEP_COLUMNS)
    assert schema.STEP_COLUMNS[: len(schema.TRANSITION_COLUMNS)] == schema.TRANSITION_COLUMNS
