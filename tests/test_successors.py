"""Each observation stored once (docs/format.md 4.3) and frames stored as their bytes (section 7):
what the files hold, and that every reader gets the transitions that were appended."""

from __future__ import annotations

from pathlib import Path

import duckdb
import gymnasium as gym
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline import DatasetWriter, InputReader
from pipeline.dataset import discovery
from pipeline.dataset.location import locate
from pipeline.errors import DatasetError

FRAME = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
VECTOR = gym.spaces.Box(-np.inf, np.inf, (64,), np.float32)  # 256 bytes: stored once


def _episode(space: gym.Space, episode_id: str, length: int, seed: int) -> dict:
    """``length`` steps whose next observation is the next step's observation, and a last one
    of its own; a vector episode has a -0.0 where its successor holds 0.0 (not the same bytes)."""
    rng = np.random.default_rng(seed)
    if space is FRAME:
        observations = rng.integers(0, 256, (length + 1, *FRAME.shape), np.uint8)
    else:
        observations = rng.standard_normal((length + 1, 64)).astype(np.float32)
        observations[2] = 0.0
    following = observations[1:].copy()
    if space is VECTOR:
        following[1, 0] = -0.0  # equal as a number, not as bytes: must come back as -0.0
    return {
        "episode_id": [episode_id] * length,
        "t": np.arange(length),
        "observation": observations[:-1],
        "action": np.zeros(length, np.int64),
        "reward": np.ones(length),
        "next_observation": following,
        "terminated": np.arange(length) == length - 1,
        "truncated": np.zeros(length, bool),
        "training_enabled": np.arange(length) % 2 == 0,  # a filter that drops successors
    }


def _write(path: Path, space: gym.Space, episodes: list[dict]) -> None:
    with DatasetWriter(path, space, gym.spaces.Discrete(2)) as writer:
        for episode in episodes:
            writer.append(episode)


@pytest.mark.parametrize("space", [FRAME, VECTOR], ids=["frames", "vector"])
def test_next_observations_are_stored_once_and_read_back_exactly(
    tmp_path: Path, space: gym.Space
) -> None:
    episodes = [_episode(space, "a", 5, 0), _episode(space, "b", 3, 1)]
    _write(tmp_path, space, episodes)
    [shard] = discovery.list_shards(locate(tmp_path))
    stored = pq.read_table(shard).column("next_observation")
    carried = 2 if space is FRAME else 4  # each episode's last row (and its -0.0 row)
    assert len(stored) - stored.null_count == carried
    for training in (None, True):  # a filter leaves successors out: restored before it applies
        reader = InputReader(tmp_path, batch_size=100, training_enabled=training)
        batch = reader.next()
        order = np.lexsort((batch.ts, batch.episode_ids))
        expected = [
            e["next_observation"][e["training_enabled"] | (training is None)] for e in episodes
        ]
        got = batch.next_observations[order]
        np.testing.assert_array_equal(got.view(np.uint8), np.concatenate(expected).view(np.uint8))


def test_frames_are_their_bytes_for_readers_in_other_languages(tmp_path: Path) -> None:
    """A frame is a BLOB of its raw bytes for DuckDB and Polars, and the SQL of section 4.3
    restores next observations from the table alone."""
    episode = _episode(FRAME, "a", 4, 2)
    _write(tmp_path, FRAME, [episode])
    [shard] = discovery.list_shards(locate(tmp_path))
    frames = pl.read_parquet(shard).sort("t")["observation"].to_list()
    assert np.array_equal(
        np.frombuffer(frames[1], np.uint8).reshape(84, 84, 3), episode["observation"][1]
    )
    rows = duckdb.sql(
        f"SELECT coalesce(next_observation, lead(observation) OVER "
        f"(PARTITION BY episode_id, agent_id ORDER BY t)) FROM read_parquet('{shard}') ORDER BY t"
    ).fetchall()
    restored = np.stack([np.frombuffer(row[0], np.uint8) for row in rows])
    np.testing.assert_array_equal(restored, episode["next_observation"].reshape(4, -1))


def test_a_null_next_observation_without_its_successor_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, VECTOR, [_episode(VECTOR, "a", 4, 3)])
    [shard] = discovery.list_shards(locate(tmp_path))
    table = pq.read_table(shard)
    pq.write_table(table.filter(table.column("t").to_numpy() != 3), shard)  # a successor lost
    with pytest.raises(DatasetError, match="row 2 has no next_observation"):
        InputReader(tmp_path, batch_size=100).next()


def test_a_successor_appended_later_into_the_same_file_still_holds_the_frame(
    tmp_path: Path,
) -> None:
    """Appends are the file's chunks; an episode split over three appends stores its frames once."""
    episode = _episode(FRAME, "a", 6, 4)
    with DatasetWriter(tmp_path, FRAME, gym.spaces.Discrete(2)) as writer:
        for part in (slice(0, 2), slice(2, 3), slice(3, 6)):
            writer.append({key: value[part] for key, value in episode.items()})
    [shard] = discovery.list_shards(locate(tmp_path))
    stored = pq.read_table(shard).column("next_observation")
    assert stored.null_count == 5  # only the last row carries its next frame
    batch = InputReader(tmp_path, batch_size=100).next()
    np.testing.assert_array_equal(
        batch.next_observations[np.argsort(batch.ts)], episode["next_observation"]
    )
