"""Frames (uint8 Boxes of >= 256 values) stored as one binary value a row (docs/format.md 7)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline import DatasetWriter, InputReader
from pipeline.dataset import discovery, upkeep
from pipeline.dataset.location import locate
from pipeline.errors import DatasetError
from pipeline.format import frames

FRAME = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)


def _column(rows: int) -> pa.Array:
    values = pa.array(np.arange(rows * 768, dtype=np.int64).astype(np.uint8))
    return pa.FixedSizeListArray.from_arrays(values, 768)


@pytest.mark.parametrize("rows", [0, 1, 5])
def test_frames_go_to_bytes_and_back_sliced_and_with_nulls(rows: int) -> None:
    column = _column(rows + 2).slice(1, rows)
    holed = pc.if_else(
        pa.array([i % 2 == 0 for i in range(rows)], pa.bool_()), pa.nulls(rows, column.type), column
    )
    for array in (column, holed):
        stored = frames.to_binary(array)
        stored.validate(full=True)
        assert stored.null_count == array.null_count
        assert frames.from_binary(stored, column.type, "observation").to_pylist() == (
            array.to_pylist()
        )


def test_a_stored_frame_of_the_wrong_length_is_refused() -> None:
    stored = pa.array([bytes(768), bytes(767)], pa.binary())
    with pytest.raises(DatasetError, match="a stored frame of 768 bytes expected in row 1"):
        frames.from_binary(stored, _column(1).type, "observation")


def _shard_codec(path: Path, observations: np.ndarray) -> str:
    n = len(observations) - 1
    with DatasetWriter(path, FRAME, gym.spaces.Discrete(2)) as writer:
        writer.append(
            {
                "episode_id": ["e"] * n,
                "t": np.arange(n),
                "observation": observations[:-1],
                "action": np.zeros(n, np.int64),
                "reward": np.zeros(n),
                "next_observation": observations[1:],
                "terminated": np.arange(n) == n - 1,
                "truncated": np.zeros(n, bool),
            }
        )
    batch = InputReader(path, batch_size=100).next()
    np.testing.assert_array_equal(batch.next_observations, observations[1:])
    [shard] = discovery.list_shards(locate(path))
    metadata = pq.read_metadata(shard)
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    return str(metadata.row_group(0).column(names.index("observation")).compression)


def test_frames_zstd_cannot_shrink_are_stored_uncompressed(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (9, *FRAME.shape), np.uint8)
    assert _shard_codec(tmp_path / "noise", noise) == "UNCOMPRESSED"
    flat = np.zeros((9, *FRAME.shape), np.uint8)
    flat[:, 4:8] = 200  # a rendered-like frame: mostly one colour
    assert _shard_codec(tmp_path / "flat", flat) == "ZSTD"


def test_a_compaction_keeps_frames_whole_and_without_statistics(tmp_path: Path) -> None:
    """delta-rs merges the shards: an episode's next frames still restore across the merged
    files, and the frames get no min and max (which cost 4x the bytes of rendered frames)."""
    observations = np.zeros((31, *FRAME.shape), np.uint8)
    observations[:, 2:6] = np.arange(31, dtype=np.uint8)[:, None, None, None]
    with DatasetWriter(tmp_path, FRAME, gym.spaces.Discrete(2)) as writer:
        for part in (slice(0, 10), slice(10, 20), slice(20, 30)):
            t = np.arange(30)[part]
            writer.append(
                {
                    "episode_id": ["e"] * 10,
                    "t": t,
                    "observation": observations[:-1][part],
                    "action": np.zeros(10, np.int64),
                    "reward": np.zeros(10),
                    "next_observation": observations[1:][part],
                    "terminated": t == 29,
                    "truncated": np.zeros(10, bool),
                }
            )
            writer.flush()
    upkeep.upkeep(locate(tmp_path), vacuum=False)
    [shard] = discovery.list_shards(locate(tmp_path))
    metadata = pq.read_metadata(shard)
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    assert metadata.row_group(0).column(names.index("observation")).statistics is None
    batch = InputReader(tmp_path, batch_size=100).next()
    np.testing.assert_array_equal(batch.next_observations[np.argsort(batch.ts)], observations[1:])
