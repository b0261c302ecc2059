"""Minari import and export against Minari itself.

Datasets are recorded here with Minari's own ``create_dataset_from_buffers`` (its
``DataCollector`` needs jax to step; the buffers are the same ``EpisodeBuffer``\\ s it fills), in
every storage backend, from real gymnasium envs: CartPole (Box observations, Discrete actions) and
a small env of Dict and Tuple spaces nested two deep. Seeds include 2**64 - 1 and others past
2**63 - 1, as Minari's own auto-seeds do. What rlpipe imported is compared row by row with what
``minari.load_dataset(...).iterate_episodes()`` gives, and the first episodes are replayed.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow.dataset as ds
import pytest
from gymnasium import spaces

from pipeline import InputReader, read_manifest
from pipeline.commands.cli import main
from pipeline.commands.replay import replay_episode
from pipeline.errors import DatasetError, RlpipeWarning
from pipeline.importers.minari import read_minari

minari = pytest.importorskip("minari")
from minari.data_collector import EpisodeBuffer  # noqa: E402

NESTED_ID = "RlpipeNested-v0"
# seeds past int64 (Minari's auto-seeds are 64 random bits), one small, and a float64 trap:
# 5272104914398938230 becomes ...8112 through float64
SEEDS = (2**64 - 1, 5272104914398938230, 3, 2**63 + 5)
LIMITS = {"CartPole-v1": 20, NESTED_ID: 10}  # so some episodes terminate and some are truncated
OPTIONS = {"scale": 0.5, "nested": {"k": [1, 2]}}


class NestedEnv(gym.Env[dict[str, Any], tuple[Any, ...]]):
    """A deterministic point mass with Dict/Tuple spaces two deep; it terminates when it leaves
    [-1, 1] and is truncated by its time limit (10) otherwise."""

    observation_space = spaces.Dict(
        {
            "position": spaces.Box(-5.0, 5.0, (2,), np.float32),
            "inner": spaces.Tuple((spaces.Discrete(4), spaces.Box(-1.0, 1.0, (), np.float64))),
        }
    )
    action_space = spaces.Tuple(
        (spaces.Discrete(3), spaces.Dict({"force": spaces.Box(-1.0, 1.0, (2,), np.float32)}))
    )

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        scale = float((options or {}).get("scale", 1.0))
        self._position = self.np_random.uniform(-scale, scale, 2).astype(np.float32)
        self._t = 0
        return self._observation(), {"distance": 0.0, "count": 0}

    def step(self, action: tuple[Any, ...]) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        mode, force = int(action[0]), np.asarray(action[1]["force"], np.float32)
        self._position = (self._position + 0.6 * (mode - 1) * force).astype(np.float32)
        self._t += 1
        distance = float(np.abs(self._position).max())
        info = {"distance": distance, "count": self._t}
        return self._observation(), -distance, distance > 1.0, False, info

    def _observation(self) -> dict[str, Any]:
        return {
            "position": self._position.copy(),
            "inner": (np.int64(self._t % 4), np.asarray(np.tanh(self._position.sum()), np.float64)),
        }


gym.register(NESTED_ID, entry_point=f"{__name__}:NestedEnv", max_episode_steps=10)


def stack(values: list[Any]) -> Any:
    """Per-step values (dicts and tuples of arrays) as Minari's buffers hold them."""
    if isinstance(values[0], dict):
        return {key: stack([value[key] for value in values]) for key in values[0]}
    if isinstance(values[0], tuple):
        return tuple(stack([value[i] for value in values]) for i in range(len(values[0])))
    return np.stack([np.asarray(value) for value in values])


def rollout(env: gym.Env[Any, Any], index: int, seed: int | None, options: Any) -> EpisodeBuffer:
    """One episode of seeded random actions, as Minari's DataCollector would buffer it."""
    env.action_space.seed(index)
    observation, info = env.reset(seed=seed, options=options)
    observations, infos, actions, rewards, terminations, truncations = (
        [observation],
        [info],
        [],
        [],
        [],
        [],
    )
    while True:
        action = env.action_space.sample()
        observation, reward, terminated, truncated, info = env.step(action)
        for items, item in zip(
            (observations, infos, actions, rewards, terminations, truncations),
            (observation, info, action, reward, terminated, truncated),
            strict=True,
        ):
            items.append(item)
        if terminated or truncated:
            break
    return EpisodeBuffer(
        id=index,
        seed=seed,
        options=options,
        observations=stack(observations),
        actions=stack(actions),
        rewards=rewards,
        terminations=terminations,
        truncations=truncations,
        # scalar infos as lists: Minari 0.5.4's arrow storage cannot read back arrays of scalars
        infos={key: [info[key] for info in infos] for key in infos[0]},
    )


def record(root: Path, env_id: str, data_format: str, dataset_id: str) -> Path:
    """A Minari dataset written by Minari under ``root`` (MINARI_DATASETS_PATH)."""
    env = gym.make(env_id, max_episode_steps=LIMITS[env_id])
    options = OPTIONS if env_id == NESTED_ID else None
    buffers = [rollout(env, i, seed, options) for i, seed in enumerate(SEEDS)]
    with pytest.warns(UserWarning):  # Minari asks for an author, a description...
        minari.create_dataset_from_buffers(
            dataset_id, buffers, env=env, algorithm_name="random", data_format=data_format
        )
    return root / dataset_id


@pytest.fixture
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def flat(value: Any) -> list[Any]:
    """Leaves of a nested value in order, for exact comparison."""
    if isinstance(value, dict):
        return [leaf for key in value for leaf in flat(value[key])]
    if isinstance(value, tuple | list) and value and not isinstance(value[0], int | float):
        return [leaf for item in value for leaf in flat(item)]
    return [np.asarray(value)]


def same(a: Any, b: Any) -> bool:
    left, right = flat(a), flat(b)
    return len(left) == len(right) and all(
        x.shape == y.shape and np.array_equal(x, y) for x, y in zip(left, right, strict=True)
    )


def imported_episodes(path: Path) -> dict[str, Any]:
    columns = ("observation", "action", "reward", "next_observation", "terminated", "truncated")
    return {str(b.episode_ids[0]): b for b in InputReader(path, episodes=True, columns=columns)}


def table_rows(path: Path, table: str) -> list[dict[str, Any]]:
    rows = ds.dataset(path / table, format="parquet", partitioning="hive").to_table()
    return (
        rows.drop_columns(["observation", "action", "next_observation"]).to_pylist()
        if (table == "steps")
        else rows.to_pylist()
    )


def check_against_minari(path: Path, dataset: Any) -> None:
    """Every row, return, flag, seed, options and info, as Minari itself reads them."""
    imported = imported_episodes(path)
    episodes_rows = {row["episode_id"]: row for row in table_rows(path, "episodes")}
    infos = {(r["episode_id"], r["t"]): r["info"] for r in table_rows(path, "steps")}
    minari_episodes = list(dataset.iterate_episodes())
    assert len(imported) == len(minari_episodes) == len(episodes_rows)
    metadata = {m["id"]: m for m in dataset.storage.get_episode_metadata(dataset.episode_indices)}
    for episode in minari_episodes:
        key, n = str(episode.id), len(episode.rewards)
        batch, row = imported[key], episodes_rows[key]
        assert len(batch) == n
        assert same(batch.observations, take(episode.observations, slice(0, n)))
        assert same(batch.next_observations, take(episode.observations, slice(1, n + 1)))
        assert same(batch.actions, episode.actions)
        assert batch.rewards.tolist() == np.asarray(episode.rewards, np.float64).tolist()
        assert batch.terminateds.tolist() == episode.terminations.tolist()
        assert batch.truncateds.tolist() == episode.truncations.tolist()
        assert row["length"] == n
        assert row["return"] == math.fsum(np.asarray(episode.rewards, np.float64).tolist())
        assert row["end_reason"] == ("terminated" if episode.terminations[-1] else "truncated")
        assert_seed(row["seed"], metadata[episode.id].get("seed"))
        options = metadata[episode.id].get("options")
        assert (json.loads(row["reset_options"]) if row["reset_options"] else None) == (
            plain(options) if options is not None else None
        )
        for t in range(n):  # the info step t returned is Minari's infos row t + 1
            expected = plain(take(episode.infos, slice(t + 1, t + 2))) if episode.infos else None
            assert (json.loads(infos[key, t]) if infos[key, t] else None) == expected


def assert_seed(stored: int | None, expected: int | None) -> None:
    """The episodes table keeps a seed past 2**63 - 1 as the int64 of its 64 bits."""
    assert stored is not None and expected is not None
    assert stored == (expected - 2**64 if expected >= 2**63 else expected)


def take(value: Any, rows: slice) -> Any:
    if isinstance(value, dict):
        return {key: take(item, rows) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(take(item, rows) for item in value)
    return np.asarray(value)[rows]


def plain(value: Any) -> Any:
    """A one-row slice of Minari's infos, or options, as the JSON values rlpipe stores."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return value[0].tolist() if value.ndim and len(value) == 1 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


@pytest.mark.parametrize("data_format", ["hdf5", "arrow", "parquet"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", NESTED_ID])
def test_minari_datasets_import_exactly_and_replay(
    minari_root: Path, tmp_path: Path, data_format: str, env_id: str
) -> None:
    name = f"test/{env_id.split('-')[0].lower()}-{data_format}-v0"
    src = record(minari_root, env_id, data_format, name)
    assert main(["import", "minari", str(src), str(tmp_path / "ds")]) == 0
    dataset = minari.load_dataset(name)
    check_against_minari(tmp_path / "ds", dataset)
    reasons = {row["end_reason"] for row in table_rows(tmp_path / "ds", "episodes")}
    assert reasons == {"terminated", "truncated"}  # both kinds of end came across
    manifest = read_manifest(tmp_path / "ds")  # env id and spaces from Minari's metadata
    assert manifest.env_id == env_id
    assert manifest.observation_space == dataset.observation_space
    assert manifest.action_space == dataset.action_space
    for episode_id in ("0", "1"):  # seeds 2**64 - 1 and the float64 trap, exactly
        result = replay_episode(tmp_path / "ds", episode_id)
        assert result.seed == SEEDS[int(episode_id)]
        assert result.exact, result.describe()


def test_the_time_limit_comes_from_minaris_env_spec(minari_root: Path) -> None:
    source = read_minari(record(minari_root, "CartPole-v1", "hdf5", "test/limit-v0"))
    assert (source.env_id, source.max_episode_steps) == ("CartPole-v1", 20)
    assert source.observation_space == gym.make("CartPole-v1").observation_space  # bounded


@pytest.mark.parametrize("data_format", ["hdf5", "arrow", "parquet"])
def test_minari_to_rlpipe_to_minari_gives_the_same_episodes(
    minari_root: Path, tmp_path: Path, data_format: str
) -> None:
    src = record(minari_root, NESTED_ID, data_format, f"test/nested-{data_format}-v0")
    assert main(["import", "minari", str(src), str(tmp_path / "ds")]) == 0
    out = tmp_path / "exported"
    argv = ["export", "minari", str(tmp_path / "ds"), str(out), "--dataset-id", "rt/back-v0"]
    assert main([*argv, "--format", data_format]) == 0
    original = minari.load_dataset(f"test/nested-{data_format}-v0")
    original_meta = list(original.storage.get_episode_metadata(original.episode_indices))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(out))
        back = minari.load_dataset("rt/back-v0")
        back_meta = list(back.storage.get_episode_metadata(back.episode_indices))
    assert back.total_episodes == original.total_episodes
    assert back.observation_space == original.observation_space
    assert back.action_space == original.action_space
    for a, b in zip(original.iterate_episodes(), back.iterate_episodes(), strict=True):
        assert a.id == b.id
        for field in ("observations", "actions", "rewards", "terminations", "truncations"):
            assert same(getattr(a, field), getattr(b, field)), field
    for a, b in zip(original_meta, back_meta, strict=True):
        assert a["seed"] == b["seed"]
        assert plain(a["options"]) == plain(b["options"])


def test_a_text_space_is_refused_naming_the_reason(minari_root: Path) -> None:
    src = record(minari_root, "CartPole-v1", "arrow", "test/text-v0")
    metadata_file = src / "data" / "metadata.json"
    metadata = json.loads(metadata_file.read_text())
    metadata["observation_space"] = json.dumps(
        {"type": "Text", "max_length": 4, "min_length": 1, "charset": "ab"}
    )
    metadata_file.write_text(json.dumps(metadata))
    with pytest.raises(DatasetError, match="observation_space is a Text space, which rlpipe"):
        read_minari(src)


def test_no_dataset_here_names_what_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"looked for data/metadata\.json, as Minari 0\.5"):
        read_minari(tmp_path)


def test_an_env_not_installed_here_keeps_its_id_and_minaris_spaces(
    minari_root: Path, tmp_path: Path
) -> None:
    src = record(minari_root, "CartPole-v1", "parquet", "test/robot-v0")
    metadata_file = src / "data" / "metadata.json"
    metadata = json.loads(metadata_file.read_text())
    spec = json.loads(metadata["env_spec"])
    metadata["env_spec"] = json.dumps({**spec, "id": "SomeRobot-v3"})
    metadata_file.write_text(json.dumps(metadata))
    assert main(["import", "minari", str(src), str(tmp_path / "ds")]) == 0
    manifest = read_manifest(tmp_path / "ds")
    assert manifest.env_id == "SomeRobot-v3"  # kept for the record
    assert manifest.observation_space == gym.make("CartPole-v1").observation_space


def test_an_episode_whose_arrays_disagree_is_refused(minari_root: Path) -> None:
    import h5py

    src = record(minari_root, "CartPole-v1", "hdf5", "test/cut-v0")
    with h5py.File(src / "data" / "main_data.hdf5", "a") as handle:
        rewards = handle["episode_1/rewards"][()]
        del handle["episode_1/rewards"]
        handle["episode_1/rewards"] = rewards[:-1]
    with pytest.raises(DatasetError, match=r"episode 1: \d+ rewards, but \{'observations'"):
        read_minari(src)


def test_a_recorded_dataset_exports_with_its_seeds_and_episodes_numbered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rlpipe's own episode ids ("ep0"...) are not Minari's integers: they are numbered in the
    order the step table holds them; seeds and options come along."""
    from datetime import UTC, datetime

    from conftest import play

    from pipeline import DatasetWriter

    env = gym.make("CartPole-v1")
    seeds = {"ep0": 2**64 - 1, "ep1": 11}
    with DatasetWriter(tmp_path / "ds", env.observation_space, env.action_space) as writer:
        for episode_id, seed in seeds.items():
            columns = play(env, lambda _: 0, episode_id, seed, {"k": 1})
            writer.append(columns)
            now = datetime.now(UTC)
            writer.append_episodes(
                {
                    "episode_id": [episode_id],
                    "started_at": [now],
                    "ended_at": [now],
                    "length": [len(columns["t"])],
                    "return": [float(sum(columns["reward"]))],
                    "seed": [seed],
                    "reset_options": [{"k": 1}],
                    "end_reason": ["terminated"],
                }
            )
    assert main(["export", "minari", str(tmp_path / "ds"), str(tmp_path / "out")]) == 0
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "out"))
    back = minari.load_dataset("rlpipe/ds-v0")
    meta = list(back.storage.get_episode_metadata(back.episode_indices))
    lengths = {m["id"]: int(m["total_steps"]) for m in meta}
    assert sorted(m["seed"] for m in meta) == sorted(seeds.values())
    assert [plain(m["options"]) for m in meta] == [{"k": 1}, {"k": 1}]
    assert [len(e.rewards) for e in back.iterate_episodes()] == [lengths[0], lengths[1]]


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_jpeg_encoded_images_decode_as_minari_decodes_them(
    minari_root: Path, tmp_path: Path, data_format: str
) -> None:
    """Minari stores uint8 image spaces as JPEG (lossy); rlpipe reads what Minari reads."""
    frames = spaces.Box(0, 255, (32, 32, 3), np.uint8)
    rng = np.random.default_rng(0)
    buffers = [
        EpisodeBuffer(
            id=i,
            seed=i,
            observations=rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8),
            actions=np.array([0, 1, 0]),
            rewards=[1.0, 1.0, 1.0],
            terminations=[False, False, True],
            truncations=[False, False, False],
        )
        for i in range(2)
    ]
    name = f"test/frames-{data_format}-v0"
    with pytest.warns(UserWarning):
        minari.create_dataset_from_buffers(
            name,
            buffers,
            observation_space=frames,
            action_space=spaces.Discrete(2),
            algorithm_name="random",
            data_format=data_format,
        )
    assert main(["import", "minari", str(minari_root / name), str(tmp_path / "ds")]) == 0
    check_against_minari(tmp_path / "ds", minari.load_dataset(name))


def test_env_kwargs_that_rlpipe_cannot_keep_are_warned_about(
    minari_root: Path, tmp_path: Path
) -> None:
    env = gym.make("CartPole-v1", max_episode_steps=20, sutton_barto_reward=True)
    name = "test/kwargs-v0"
    with pytest.warns(UserWarning):
        minari.create_dataset_from_buffers(
            name, [rollout(env, 0, 5, None)], env=env, algorithm_name="random"
        )
    message = "made with {'kwargs': {'sutton_barto_reward': True}}, which an rlpipe dataset"
    with pytest.warns(RlpipeWarning, match=re.escape(message)):
        main(["import", "minari", str(minari_root / name), str(tmp_path / "ds")])
