"""``rlpipe import rlpipe-v1``: format-1 datasets (shards in directories) into Delta tables.

The format-1 datasets are made here from the shipped ones, the way format 1 stored them (the
step table's own types, fixed-size lists included, in ``steps/date=.../part-*.parquet`` and a
manifest saying version 1), so the conversion is checked on the shipped data itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipeline import InputReader, read_manifest
from pipeline.commands.cli import main
from pipeline.dataset import discovery
from pipeline.dataset.location import locate
from pipeline.errors import FormatVersionError
from pipeline.format import layout, manifest, schema
from pipeline.importers.rlpipe_v1 import convert

DATASETS = Path(__file__).resolve().parents[1] / "datasets"
SHIPPED = ("cartpole-expert", "cartpole-medium", "pendulum-expert", "pendulum-medium")


def as_version_1(name: str, out: Path) -> Path:
    """The shipped dataset ``name`` in format 1's layout, at ``out``."""
    source = locate(DATASETS / name)
    found = read_manifest(source)
    step_schema = schema.step_schema(found.observation_space, found.action_space)
    for table, table_schema in (
        (layout.STEPS, step_schema),
        (layout.EPISODES, schema.EPISODE_SCHEMA),
    ):
        for number, path in enumerate(discovery.list_shards(source, table)):
            rows = ds.dataset(path, schema=table_schema, format="parquet").to_table()
            date = Path(path).parent.name
            (out / table / date).mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, out / table / date / f"part-old-{number:08d}.parquet")
    doc = json.loads((DATASETS / name / layout.MANIFEST).read_text())
    doc = {**doc, "format_version": 1}
    doc["checksum"] = manifest.checksum(doc)
    (out / layout.MANIFEST).write_text(json.dumps(doc))
    shutil.copytree(DATASETS / name / "checkpoints", out / "checkpoints")
    return out


def rows_of(path: Path) -> tuple[int, float, list[str]]:
    """Step count, reward sum and sorted episode ids, as InputReader reads them."""
    batches = list(InputReader(path, batch_size=100_000))
    rewards = float(np.sum([b.rewards.sum() for b in batches]))
    ids = sorted({str(i) for b in batches for i in b.episode_ids})
    return sum(len(b) for b in batches), rewards, ids


@pytest.mark.parametrize("name", SHIPPED)
def test_a_format_1_dataset_converts_with_every_row(tmp_path: Path, name: str) -> None:
    old = as_version_1(name, tmp_path / "old")
    with pytest.raises(FormatVersionError, match=r"rlpipe import rlpipe-v1 SRC DST"):
        InputReader(old)
    assert main(["import", "rlpipe-v1", str(old), str(tmp_path / "new")]) == 0
    new = tmp_path / "new"
    assert rows_of(new) == rows_of(DATASETS / name)
    before, after = read_manifest(DATASETS / name), read_manifest(new)
    assert (after.observation_space, after.action_space, after.env_id, after.created_at) == (
        before.observation_space,
        before.action_space,
        before.env_id,
        before.created_at,
    )
    episodes = ds.dataset(new / "episodes", format="parquet", partitioning="hive").to_table()
    shipped = ds.dataset(DATASETS / name / "episodes", format="parquet", partitioning="hive")
    assert sorted(episodes.column("return").to_pylist()) == sorted(
        shipped.to_table().column("return").to_pylist()
    )
    assert [p.name for p in (new / "checkpoints").iterdir()] == [
        p.name for p in (DATASETS / name / "checkpoints").iterdir()
    ]


def test_conversion_never_writes_into_a_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = as_version_1("pendulum-medium", tmp_path / "old")
    assert main(["import", "rlpipe-v1", str(old), str(tmp_path / "new")]) == 0
    assert main(["import", "rlpipe-v1", str(old), str(tmp_path / "new")]) == 2
    assert "already holds a dataset; convert into a new one" in capsys.readouterr().err
    with pytest.raises(FormatVersionError, match="format version 2; expected 1"):
        convert(tmp_path / "new", tmp_path / "newer")  # already converted
