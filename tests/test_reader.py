"""InputReader: sequential, shuffled and episode reads; filters; follow; splits; other readers."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import cartpole_rollout, cartpole_spaces

from pipeline import (
    Batch,
    ConfigError,
    DatasetError,
    DatasetWriter,
    FormatVersionError,
    InputReader,
    WriterConfig,
)


def _keys(batches: list[Any]) -> list[tuple[str, int]]:
    return [(str(e), int(t)) for b in batches for e, t in zip(b.episode_ids, b.ts, strict=True)]


def test_sequential_batches_in_commit_order(make_dataset: Any) -> None:
    path = make_dataset(steps=1000, per_append=300)
    batches = list(InputReader(path, batch_size=128))
    assert [len(b) for b in batches] == [128] * 7 + [104]
    rows = cartpole_rollout(1000)
    np.testing.assert_array_equal(
        np.concatenate([b.observations for b in batches]), rows["observation"]
    )
    assert len(list(InputReader(path, batch_size=128, drop_last=True))) == 7


def test_shuffle_is_seeded_and_complete(make_dataset: Any) -> None:
    path = make_dataset(steps=1000, per_append=100, config=WriterConfig(max_rows=200))
    first = _keys(list(InputReader(path, batch_size=64, shuffle=True, seed=3, shuffle_buffer=300)))
    again = _keys(list(InputReader(path, batch_size=64, shuffle=True, seed=3, shuffle_buffer=300)))
    other = _keys(list(InputReader(path, batch_size=64, shuffle=True, seed=4, shuffle_buffer=300)))
    sequential = _keys(list(InputReader(path, batch_size=64)))
    assert first == again and first != other and first != sequential
    assert sorted(first) == sorted(sequential) and len(set(first)) == 1000


def test_epochs_reshuffle(make_dataset: Any) -> None:
    reader = InputReader(make_dataset(steps=300), batch_size=300, shuffle=True)
    assert _keys(list(reader)) != _keys(list(reader))


def test_whole_episodes_in_order(make_dataset: Any) -> None:
    path = make_dataset(steps=1000, per_append=37, config=WriterConfig(max_rows=100))
    episodes = list(InputReader(path, episodes=True))
    rows = cartpole_rollout(1000)
    assert sum(len(e) for e in episodes) == 1000
    for episode in episodes:
        assert len(set(episode.episode_ids)) == 1
        np.testing.assert_array_equal(episode.ts, np.arange(len(episode)))
    complete = [e for e in episodes if e.terminateds[-1] or e.truncateds[-1]]
    assert len(complete) == len(set(rows["episode_id"])) - 1  # the rollout ends mid-episode
    assert not (episodes[-1].terminateds[-1] or episodes[-1].truncateds[-1])


def test_projection_reads_only_what_is_asked(make_dataset: Any) -> None:
    batch = next(iter(InputReader(make_dataset(steps=10), columns=["observations", "reward"])))
    assert batch.observations.shape == (10, 4) and batch.rewards.shape == (10,)
    assert batch.actions is None and batch.episode_ids is None
    with pytest.raises(ConfigError, match=re.escape("ReaderConfig.columns: expected names from")):
        InputReader(make_dataset(steps=10, name="b"), columns=["velocity"])


def test_filters_push_down(tmp_path: Path) -> None:
    rows = cartpole_rollout(100)
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        for version in range(4):
            writer.append(rows | {"policy_version": np.full(100, version),
                                  "client_id": np.full(100, f"c{version % 2}"),
                                  "training_enabled": np.full(100, version != 3)})  # fmt: skip

    def count(**filters: Any) -> int:
        return sum(len(b) for b in InputReader(tmp_path, columns=["t"], **filters))

    assert count() == 400
    assert count(min_policy_version=2) == 200
    assert count(min_policy_version=1, max_policy_version=1) == 100
    assert count(training_enabled=True) == 300
    assert count(client_ids=["c1"]) == 200
    assert count(agent_ids=["nobody"]) == 0
    now = datetime.now(UTC)
    assert count(since=now - timedelta(hours=1)) == 400
    assert count(until=now - timedelta(hours=1)) == 0
    assert count(since=(now + timedelta(hours=1)).isoformat()) == 0


def test_follow_yields_every_row_exactly_once(tmp_path: Path) -> None:
    config = WriterConfig(max_age_s=0.05)
    writer = DatasetWriter(tmp_path, *cartpole_spaces(), config=config)
    rows = cartpole_rollout(100)

    def produce() -> None:
        for number in range(30):
            writer.append(rows | {"episode_id": np.full(100, f"b{number}"), "t": np.arange(100)})
            time.sleep(0.01)
        writer.close()

    producer = threading.Thread(target=produce)
    producer.start()
    seen = _keys(
        list(InputReader(tmp_path, batch_size=64, follow=True, timeout_s=1.0, poll_interval_s=0.02))
    )
    producer.join()
    assert len(seen) == 3000 and len(set(seen)) == 3000


def test_follow_reads_shards_that_came_while_the_consumer_worked_at_once(tmp_path: Path) -> None:
    """A trainer reads, updates, reads: what was committed during its update is read without
    waiting out a poll interval (online PPO would lose that wait on every update)."""
    rows = cartpole_rollout(10)
    with DatasetWriter(tmp_path, *cartpole_spaces()) as writer:
        writer.append(rows | {"episode_id": np.full(10, "b0")})
        writer.flush()
        reader = iter(InputReader(tmp_path, batch_size=10, follow=True, timeout_s=30,
                                  poll_interval_s=5.0))  # fmt: skip
        assert set(next(reader).episode_ids) == {"b0"}
        writer.append(rows | {"episode_id": np.full(10, "b1")})  # while the consumer works
        writer.flush()
        started = time.monotonic()
        assert set(next(reader).episode_ids) == {"b1"}
        assert time.monotonic() - started < 2.5


def test_follow_stops_after_timeout(make_dataset: Any) -> None:
    started = time.monotonic()
    batches = list(
        InputReader(make_dataset(steps=50), follow=True, timeout_s=0.3, poll_interval_s=0.05)
    )
    assert sum(len(b) for b in batches) == 50
    assert 0.3 <= time.monotonic() - started < 5


@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_split_without_overlap(make_dataset: Any, shuffle: bool) -> None:
    path = make_dataset(
        steps=2000, per_append=100, config=WriterConfig(max_rows=100, row_group_rows=50)
    )
    shares = [
        _keys(list(InputReader(path, batch_size=32, shuffle=shuffle, rank=rank, world_size=3)))
        for rank in range(3)
    ]
    assert all(shares)
    together = [key for share in shares for key in share]
    assert len(together) == len(set(together)) == 2000


def test_ranks_split_whole_episodes(make_dataset: Any) -> None:
    """Row groups cut episodes apart; in episode mode each rank still gets whole episodes."""
    path = make_dataset(
        steps=2000, per_append=100, config=WriterConfig(max_rows=100, row_group_rows=50)
    )
    everything = {str(e.episode_ids[0]): len(e) for e in InputReader(path, episodes=True)}
    shares = [list(InputReader(path, episodes=True, rank=rank, world_size=3)) for rank in range(3)]
    assert all(shares)
    together = {str(e.episode_ids[0]): len(e) for share in shares for e in share}
    assert together == everything
    assert sum(len(share) for share in shares) == len(everything)


def test_dataloader_workers_split_without_overlap(make_dataset: Any) -> None:
    import torch.utils.data

    path = make_dataset(steps=1000, per_append=100, config=WriterConfig(max_rows=100))
    reader = InputReader(path, batch_size=50, columns=["episode_id", "t", "observation"])
    loader = torch.utils.data.DataLoader(
        reader.as_torch_dataset(), batch_size=None, num_workers=2, collate_fn=lambda b: b
    )
    keys = _keys(list(loader))
    assert len(keys) == len(set(keys)) == 1000


def test_next_cycles_like_rllib(make_dataset: Any) -> None:
    reader = InputReader(make_dataset(steps=100), batch_size=60)
    assert [len(reader.next()) for _ in range(4)] == [60, 40, 60, 40]


def test_to_torch_types_and_memory(make_dataset: Any) -> None:
    import torch

    path = make_dataset(steps=10)
    batch = next(iter(InputReader(path)))
    tensors = batch.to_torch()
    assert tensors.observations.dtype == torch.float32 and tensors.observations.shape == (10, 4)
    assert tensors.terminateds.dtype == torch.bool
    assert isinstance(tensors.episode_ids, np.ndarray)
    # a decoded chunk's buffers are the reader's own: writable, and shared with torch, not copied
    assert batch.observations.flags.writeable and batch.rewards.flags.writeable
    tensors.observations.add_(1.0)
    assert np.array_equal(batch.observations, tensors.observations.numpy())
    # Arrow memory the reader does not own (here: an IPC body) stays read-only and torch copies it
    table = pq.read_table(next((path / "steps").rglob("*.parquet")))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    foreign = InputReader(path).to_batch(pa.ipc.open_stream(sink.getvalue()).read_all())
    assert not foreign.observations.flags.writeable and not foreign.rewards.flags.writeable
    before = foreign.observations.copy()
    foreign.to_torch().observations.add_(1.0)
    assert np.array_equal(foreign.observations, before)


def test_writing_one_batch_leaves_the_others_alone(make_dataset: Any) -> None:
    path = make_dataset(steps=300)
    for shuffle in (False, True):
        reader = InputReader(path, batch_size=64, shuffle=shuffle, shuffle_buffer=100, seed=3)
        expected = [b.rewards.copy() for b in reader]
        batches = list(InputReader(path, batch_size=64, shuffle=shuffle, shuffle_buffer=100, seed=3,
                                   device="cpu"))  # fmt: skip
        for batch in batches:
            batch.rewards.mul_(-1.0)
            batch.observations.zero_()
        assert [b.rewards.neg().tolist() for b in batches] == [e.tolist() for e in expected]


def test_pandas_reads_the_files_unchanged(make_dataset: Any) -> None:
    path = make_dataset(steps=500)
    frame = pd.read_parquet(path / "steps")
    assert len(frame) == 500 and {"episode_id", "reward", "date"} <= set(frame.columns)
    assert frame["observation"].iloc[0].shape == (4,)


def test_duckdb_reads_the_files_unchanged(make_dataset: Any) -> None:
    duckdb = pytest.importorskip("duckdb")
    path = make_dataset(steps=500)
    files = f"{path}/steps/date=*/*.parquet"
    query = f"SELECT count(*), sum(reward), max(len(observation)) FROM read_parquet('{files}')"
    assert duckdb.execute(query).fetchall() == [(500, 500.0, 4)]


def test_newer_format_says_upgrade(make_dataset: Any) -> None:
    path = make_dataset(steps=10)
    manifest = path / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"format_version": 2', '"format_version": 99'))
    with pytest.raises(
        FormatVersionError, match="newer than the 2 this rlpipe reads; upgrade rlpipe"
    ):
        InputReader(path)


def test_not_a_dataset(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not an rlpipe dataset"):
        InputReader(tmp_path)


@pytest.mark.parametrize("mode", ["sequential", "shuffle", "episodes"])
def test_device_yields_torch_batches_with_the_same_rows(make_dataset: Any, mode: str) -> None:
    import torch

    path = make_dataset(steps=700, per_append=300)
    options = {"shuffle": mode == "shuffle", "episodes": mode == "episodes", "seed": 1}
    plain = list(InputReader(path, batch_size=128, shuffle_buffer=256, **options))
    tensors = list(InputReader(path, batch_size=128, shuffle_buffer=256, device="cpu", **options))
    assert [len(b) for b in tensors] == [len(b) for b in plain]
    for numpy_batch, torch_batch in zip(plain, tensors, strict=True):
        assert isinstance(torch_batch.observations, torch.Tensor)
        assert np.array_equal(torch_batch.observations.numpy(), numpy_batch.observations)
        assert np.array_equal(torch_batch.actions.numpy(), numpy_batch.actions)
        assert list(torch_batch.episode_ids) == list(numpy_batch.episode_ids)


def test_reads_a_dataset_that_rlpipe_did_not_write(tmp_path: Path) -> None:
    """A Delta table made by another Delta writer from the documented layout (vectors as plain
    lists, no rlpipe metadata), as a writer in another language would make it."""
    from deltalake import write_deltalake

    manifest = {
        "format": "rlpipe", "format_version": 2, "created_at": "2026-11-22T00:00:00+00:00",
        "env_id": None,
        "observation_space": {"type": "Box", "shape": [2], "dtype": "float32",
                              "low": ["-inf", "-inf"], "high": ["inf", "inf"]},
        "action_space": {"type": "Discrete", "n": 3, "start": 0},
    }  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    vector = pa.list_(pa.float32())
    n = 5
    table = pa.table(
        {
            "episode_id": pa.array(["e"] * n),
            "agent_id": pa.array(["agent0"] * n),
            "t": pa.array(range(n), pa.int64()),
            "observation": pa.array([[float(i), 0.0] for i in range(n)], vector),
            "action": pa.array([i % 3 for i in range(n)], pa.int64()),
            "reward": pa.array([1.0] * n),
            "next_observation": pa.array([[float(i + 1), 0.0] for i in range(n)], vector),
            "terminated": pa.array([False] * (n - 1) + [True]),
            "truncated": pa.array([False] * n),
            "action_logp": pa.array([None] * n, pa.float64()),
            "policy_version": pa.array([None] * n, pa.int64()),
            "training_enabled": pa.array([True] * n),
            "info": pa.array([None] * n, pa.string()),
            "client_id": pa.array(["sim"] * n),
            "logged_at": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
            "date": pa.array(["1970-01-01"] * n),
        }
    )
    write_deltalake(tmp_path / "steps", table, partition_by=["date"])
    (episode,) = list(InputReader(tmp_path, episodes=True))
    assert episode.ts.tolist() == list(range(n))
    assert episode.observations[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert episode.actions.tolist() == [0, 1, 2, 0, 1]
    assert np.isnan(episode.action_logps).all() and (episode.policy_versions == -1).all()


def test_missing_logp_and_version_read_as_nan_and_minus_one(tmp_path: Path) -> None:
    """Rows logged with and without a policy in one chunk, and a chunk with none at all."""
    path = tmp_path / "ds"
    rows = cartpole_rollout(30, seed=4)
    logps = pa.array([None if i % 3 else -0.5 for i in range(30)], pa.float64())
    versions = pa.array([None if i % 3 else 7 for i in range(30)], pa.int64())
    with DatasetWriter(path, *cartpole_spaces()) as writer:
        writer.append(rows | {"action_logp": logps, "policy_version": versions})
        writer.flush()
        writer.append(cartpole_rollout(10, seed=5))
    for device in (None, "cpu"):
        batches = list(InputReader(path, batch_size=30, device=device))
        mixed, none = (np.asarray(b.action_logps) for b in batches)
        assert np.array_equal(mixed, [-0.5 if i % 3 == 0 else np.nan for i in range(30)],
                              equal_nan=True)  # fmt: skip
        assert np.asarray(batches[0].policy_versions).tolist() == [
            7 if i % 3 == 0 else -1 for i in range(30)
        ]
        assert np.isnan(none).all() and (np.asarray(batches[1].policy_versions) == -1).all()
    # shuffled through buffers that hold both shards, or only the one without a policy
    for buffer in (40, 10):
        rows = Batch.concat(InputReader(path, batch_size=7, shuffle=True, shuffle_buffer=buffer))
        order = np.lexsort((rows.ts, rows.episode_ids))
        expected = Batch.concat(InputReader(path, batch_size=40))
        for name in ("observations", "actions", "rewards", "action_logps", "policy_versions"):
            np.testing.assert_array_equal(getattr(rows, name)[order],
                                          getattr(expected, name), err_msg=name)  # fmt: skip
