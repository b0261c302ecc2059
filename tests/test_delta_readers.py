"""Delta readers that are not rlpipe's read a dataset on S3 as rlpipe does: Ray Data
(``ray.data.read_delta``) and Polars (``read_delta``, ``scan_delta``) find the same rows as
``InputReader``: their count, the sum of their rewards and the set of episode ids. The
dataset is written by a real DatasetWriter to moto's S3 endpoint (``s3_fixtures``), in several
commits of CartPole episodes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from s3_fixtures import Bucket

from pipeline import DatasetWriter, InputReader, WriterConfig
from pipeline.dataset.location import Location, locate
from pipeline.format import layout


@dataclass(frozen=True)
class Expected:
    """What InputReader reads: the rows, their rewards' sum, their episode ids."""

    rows: int
    reward: float
    episode_ids: frozenset[str]


def cartpole_episodes(count: int, seed: int) -> Iterator[dict[str, Any]]:
    """Columns of ``count`` CartPole episodes under a random policy, one episode each."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    for n in range(count):
        observation, _ = env.reset(seed=seed * 1000 + n)
        rows: dict[str, list[Any]] = {name: [] for name in ("observation", "action", "reward")}
        rows |= {"next_observation": [], "terminated": [], "truncated": []}
        while True:
            action = int(rng.integers(2))
            after, reward, terminated, truncated, _ = env.step(action)
            for name, value in zip(
                rows, (observation, action, reward, after, terminated, truncated), strict=True
            ):
                rows[name].append(value)
            observation = after
            if terminated or truncated:
                break
        length = len(rows["action"])
        yield {"episode_id": [f"s{seed}-e{n}"] * length, "t": np.arange(length), **rows}
    env.close()


@pytest.fixture
def dataset(bucket: Bucket) -> tuple[Location, Expected]:
    """40 CartPole episodes on the bucket, in 8 commits; and what InputReader reads of them."""
    location = locate(bucket.uri(), bucket.options, bucket.state_dir)
    spaces = gym.make("CartPole-v1")
    with DatasetWriter(
        location.uri,
        spaces.observation_space,
        spaces.action_space,
        config=WriterConfig(max_age_s=60.0),
        storage_options=bucket.options,
        state_dir=bucket.state_dir,
    ) as writer:
        for batch in range(8):
            for columns in cartpole_episodes(5, batch):
                writer.append(columns)
            writer.flush()
    rows, reward, ids = 0, 0.0, set()
    for read in InputReader(location.uri, storage_options=bucket.options, batch_size=4096):
        rows += len(read)
        reward += float(read.rewards.sum())
        ids.update(str(e) for e in read.episode_ids)
    assert len(ids) == 40
    return location, Expected(rows, reward, frozenset(ids))


def test_polars_reads_the_rows_input_reader_reads(dataset: tuple[Location, Expected]) -> None:
    import polars as pl

    location, expected = dataset
    uri, options = location.table_uri(layout.STEPS), dict(location.storage_options)
    frame = pl.read_delta(uri, storage_options=options)
    assert frame.height == expected.rows
    assert frame["reward"].sum() == pytest.approx(expected.reward)
    assert set(frame["episode_id"].unique().to_list()) == expected.episode_ids
    lazy = pl.scan_delta(uri, storage_options=options).select(
        pl.len().alias("rows"),
        pl.col("reward").sum(),
        pl.col("episode_id").n_unique().alias("episodes"),
    )
    found = lazy.collect().row(0, named=True)
    assert found["rows"] == expected.rows
    assert found["reward"] == pytest.approx(expected.reward)
    assert found["episodes"] == len(expected.episode_ids)


def test_ray_data_reads_the_rows_input_reader_reads(
    ray_session: Any, dataset: tuple[Location, Expected]
) -> None:
    location, expected = dataset
    steps = ray_session.data.read_delta(
        location.table_uri(layout.STEPS),
        storage_options=dict(location.storage_options),
        # moto's endpoint, rooted at the table: Ray reads the paths of deltalake's
        # to_pyarrow_dataset, which are relative to it
        filesystem=pafs.SubTreeFileSystem(location.path(layout.STEPS), location.filesystem),
        columns=["episode_id", "reward"],
    )
    whole = pa.concat_tables(ray_session.get(steps.to_arrow_refs()))
    assert whole.num_rows == expected.rows
    assert whole["reward"].to_numpy().sum() == pytest.approx(expected.reward)
    assert set(whole["episode_id"].to_pylist()) == expected.episode_ids
