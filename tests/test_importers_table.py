"""Table and D4RL importers, on files built here from each format's documented layout (Minari:
tests/test_importers_minari.py, on datasets Minari itself writes)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from conftest import play

from pipeline import InputReader, read_manifest
from pipeline.commands.cli import main
from pipeline.errors import DatasetError
from pipeline.importers.table import import_dataframe

h5py = pytest.importorskip("h5py")


def rollouts(episodes: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    """Real CartPole episodes from a random policy, with their known returns and end flags, in
    the layout of a table of episodes (N + 1 observations)."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    out = []
    for index in range(episodes):
        rows = play(env, lambda _: int(rng.integers(2)), f"e{index}", seed + index)
        out.append(
            {
                "obs": np.asarray([*rows["observation"], rows["next_observation"][-1]]),
                "act": np.asarray(rows["action"]),
                "rew": np.asarray(rows["reward"]),
                "term": np.asarray(rows["terminated"]),
                "trunc": np.asarray(rows["truncated"]),
            }
        )
    env.close()
    return out


def frame(episodes: list[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for index, episode in enumerate(episodes):
        for t in range(len(episode["act"])):
            rows.append(
                {
                    "episode_id": f"e{index}",
                    "observation": episode["obs"][t].tolist(),
                    "action": int(episode["act"][t]),
                    "reward": float(episode["rew"][t]),
                    "next_observation": episode["obs"][t + 1].tolist(),
                    "terminated": bool(episode["term"][t]),
                    "truncated": bool(episode["trunc"][t]),
                }
            )
    return pd.DataFrame(rows)


def check(path: Path, episodes: list[dict[str, Any]], env_id: str | None) -> None:
    read = list(InputReader(path, episodes=True))
    assert [len(e.rewards) for e in read] == [len(e["act"]) for e in episodes]
    assert [math.fsum(e.rewards.tolist()) for e in read] == [
        math.fsum(e["rew"].tolist()) for e in episodes
    ]
    for got, want in zip(read, episodes, strict=True):
        np.testing.assert_array_equal(got.actions, want["act"])
        np.testing.assert_allclose(got.observations, want["obs"][:-1], rtol=1e-6)
        np.testing.assert_allclose(got.next_observations, want["obs"][1:], rtol=1e-6)
        assert got.terminateds.tolist() == want["term"].tolist()
    table = ds.dataset(path / "episodes", format="parquet", partitioning="hive").to_table()
    assert sorted(table.column("length").to_pylist()) == sorted(len(e["act"]) for e in episodes)
    assert set(table.column("end_reason").to_pylist()) == {"terminated"}
    assert read_manifest(path).env_id == env_id


def test_dataframe_import(tmp_path: Path) -> None:
    episodes = rollouts()
    summary = import_dataframe(frame(episodes), tmp_path / "ds", env_id="CartPole-v1")
    assert (summary.episodes, summary.terminated) == (3, 3)
    check(tmp_path / "ds", episodes, "CartPole-v1")


def test_csv_with_numbered_vector_columns(tmp_path: Path) -> None:
    episodes = rollouts()
    table = frame(episodes)
    for name in ("observation", "next_observation"):
        spread = pd.DataFrame(table.pop(name).tolist()).add_prefix(f"{name}_")
        table = pd.concat([table, spread], axis=1)
    table.to_csv(tmp_path / "steps.csv", index=False)
    argv = ["import", "table", str(tmp_path / "steps.csv"), str(tmp_path / "ds")]
    assert main([*argv, "--env", "CartPole-v1"]) == 0
    check(tmp_path / "ds", episodes, "CartPole-v1")


def test_parquet_with_list_columns_and_a_done_flag(tmp_path: Path) -> None:
    episodes = rollouts()
    table = frame(episodes)
    table["done"] = table.pop("terminated") | table.pop("truncated")
    table.to_parquet(tmp_path / "steps.parquet")
    assert main(["import", "table", str(tmp_path / "steps.parquet"), str(tmp_path / "ds")]) == 0
    check(tmp_path / "ds", episodes, None)
    assert read_manifest(tmp_path / "ds").action_space == gym.spaces.Discrete(2)


def test_table_without_required_columns_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=re.escape("DataFrame: missing columns ['reward', 'ne")):
        import_dataframe(
            pd.DataFrame({"episode_id": ["a"], "observation": [[0.0]], "action": [0]}),
            tmp_path / "ds",
        )


def test_an_empty_table_is_refused(tmp_path: Path) -> None:
    empty = pd.DataFrame(
        {
            "episode_id": pd.Series([], dtype=str),
            "observation": [],
            "action": [],
            "reward": [],
            "next_observation": [],
        }
    )
    with pytest.raises(DatasetError, match="the source holds no steps; nothing to import"):
        import_dataframe(empty, tmp_path / "ds")


def test_d4rl_hdf5(tmp_path: Path) -> None:
    episodes = rollouts()
    src = tmp_path / "cartpole.hdf5"
    with h5py.File(src, "w") as handle:
        for name, key in (
            ("actions", "act"),
            ("rewards", "rew"),
            ("terminals", "term"),
            ("timeouts", "trunc"),
        ):
            handle.create_dataset(name, data=np.concatenate([e[key] for e in episodes]))
        handle.create_dataset(
            "observations", data=np.concatenate([e["obs"][:-1] for e in episodes])
        )
        handle.create_dataset(
            "next_observations", data=np.concatenate([e["obs"][1:] for e in episodes])
        )
    argv = ["import", "d4rl", str(src), str(tmp_path / "ds"), "--env", "CartPole-v1"]
    assert main(argv) == 0
    check(tmp_path / "ds", episodes, "CartPole-v1")


def test_d4rl_timeouts_are_truncations(tmp_path: Path) -> None:
    src = tmp_path / "d.hdf5"
    with h5py.File(src, "w") as handle:
        handle.create_dataset("observations", data=np.zeros((4, 2)))
        handle.create_dataset("actions", data=np.zeros((4, 1)))
        handle.create_dataset("rewards", data=np.ones(4))
        handle.create_dataset("terminals", data=np.array([0, 1, 0, 0]))
        handle.create_dataset("timeouts", data=np.array([0, 0, 0, 1]))
    assert main(["import", "d4rl", str(src), str(tmp_path / "ds")]) == 0
    table = ds.dataset(tmp_path / "ds/episodes", format="parquet", partitioning="hive").to_table()
    rows = sorted(
        table.select(["episode_id", "length", "end_reason"]).to_pylist(),
        key=lambda row: row["episode_id"],
    )
    assert rows == [
        {"episode_id": "0", "length": 2, "end_reason": "terminated"},
        {"episode_id": "1", "length": 2, "end_reason": "truncated"},
    ]


def test_d4rl_missing_datasets_are_named(tmp_path: Path) -> None:
    src = tmp_path / "d.hdf5"
    with h5py.File(src, "w") as handle:
        handle.create_dataset("observations", data=np.zeros((2, 2)))
    from pipeline.importers.d4rl import read_d4rl

    with pytest.raises(
        DatasetError, match=re.escape("missing D4RL datasets ['actions', 'rewards', 'terminals']")
    ):
        read_d4rl(src)


def test_table_files_with_different_columns_name_the_file_and_the_column(tmp_path: Path) -> None:
    from pipeline.importers.table import read_table

    src = tmp_path.resolve() / "steps"
    src.mkdir()
    table = frame(rollouts(2))
    first, second = table[table.episode_id == "e0"], table[table.episode_id == "e1"]
    first.to_parquet(src / "0.parquet")
    second.drop(columns=["truncated"]).assign(notes="ignored").to_parquet(src / "1.parquet")
    message = (
        f"{src}/1.parquet: its columns differ from those of {src}/0.parquet: missing "
        "['truncated'] (every file of a source must hold the same columns)"
    )
    with pytest.raises(DatasetError, match=re.escape(message)):
        read_table(src)


def test_table_glob_of_csv_files(tmp_path: Path) -> None:
    episodes = rollouts()
    table = frame(episodes)
    for name in ("observation", "next_observation"):
        spread = pd.DataFrame(table.pop(name).tolist()).add_prefix(f"{name}_")
        table = pd.concat([table, spread], axis=1)
    for index, (_, rows) in enumerate(table.groupby("episode_id", sort=True)):
        rows.to_csv(tmp_path / f"steps-{index}.csv", index=False)
    (tmp_path / "README.md").write_text("not a table\n")
    argv = ["import", "table", f"{tmp_path}/steps-*.csv", str(tmp_path / "ds")]
    assert main([*argv, "--env", "CartPole-v1"]) == 0
    check(tmp_path / "ds", episodes, "CartPole-v1")


def test_a_tables_seeds_past_int64_replay_exactly(tmp_path: Path) -> None:
    """Seeds up to 2**64 - 1 in a uint64 column come across exactly, and replay; a float64
    seed column (pandas' choice for ints with gaps) is refused rather than rounded."""
    from pipeline.commands.replay import replay_episode
    from pipeline.format.seeds import from_storage

    first = 2**64 - 3
    episodes = rollouts(seed=first)  # reset with seeds 2**64 - 3, - 2, - 1
    table = frame(episodes)
    table["seed"] = pd.array([first + int(key[1:]) for key in table["episode_id"]], "UInt64")
    table["reset_options"] = '{"note": 1}'
    import_dataframe(table, tmp_path / "ds", env_id="CartPole-v1")
    rows = ds.dataset(tmp_path / "ds/episodes", format="parquet", partitioning="hive").to_table()
    seeds = {r["episode_id"]: from_storage(r["seed"]) for r in rows.to_pylist()}
    assert seeds == {"e0": first, "e1": first + 1, "e2": first + 2}
    assert set(rows.column("reset_options").to_pylist()) == {'{"note": 1}'}
    assert replay_episode(tmp_path / "ds", "e2").exact
    table["seed"] = table["seed"].astype("float64")
    with pytest.raises(DatasetError, match=re.escape("seeds: expected integers, got float64")):
        import_dataframe(table, tmp_path / "other", env_id="CartPole-v1")


def test_d4rl_nested_groups_are_refused_naming_them(tmp_path: Path) -> None:
    from pipeline.importers.d4rl import read_d4rl

    src = tmp_path / "d.hdf5"
    with h5py.File(src, "w") as handle:
        handle.create_group("observations").create_dataset("position", data=np.zeros((2, 2)))
        for name in ("actions", "rewards", "terminals"):
            handle.create_dataset(name, data=np.zeros(2))
    with pytest.raises(DatasetError, match=re.escape("['observations'] are HDF5 groups")):
        read_d4rl(src)
