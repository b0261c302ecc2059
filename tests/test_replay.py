"""``rlpipe replay``: a freshly recorded CartPole dataset replays exactly; tampering is caught."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import play
from PIL import Image

from pipeline import DatasetWriter, InputReader
from pipeline.commands.cli import main
from pipeline.commands.replay import replay_episode
from pipeline.format.schema import rows_to_columns

# (seed, reset options) per episode; CartPole takes the bounds of its initial state as options.
EPISODES = [(10, None), (11, None), (12, {"low": -0.01, "high": 0.01}), (13, None)]


def record(
    path: Path,
    env_id: str = "CartPole-v1",
    tamper: Callable[[str, dict[str, list[Any]]], None] | None = None,
) -> list[str]:
    """Record EPISODES with a seeded random policy, as a client of DatasetWriter would."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    ids = []
    with DatasetWriter(path, env.observation_space, env.action_space, env_id=env_id) as writer:
        for index, (seed, options) in enumerate(EPISODES):
            episode_id = f"ep{index}"
            started = datetime.now(UTC)
            columns = play(env, lambda _: int(rng.integers(2)), episode_id, seed, options)
            t, terminated = len(columns["t"]), columns["terminated"][-1]
            if tamper is not None:
                tamper(episode_id, columns)
            writer.append(columns)
            writer.append_episodes(
                rows_to_columns(
                    [
                        {
                            "episode_id": episode_id,
                            "started_at": started,
                            "ended_at": datetime.now(UTC),
                            "length": t,
                            "return": math.fsum(columns["reward"]),
                            "env_id": env_id,
                            "seed": seed,
                            "reset_options": options,
                            "end_reason": "terminated" if terminated else "truncated",
                        }
                    ]
                )
            )
            ids.append(episode_id)
    env.close()
    return ids


def test_every_episode_of_a_fresh_recording_replays_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = record(tmp_path / "ds")
    for episode_id in ids:
        result = replay_episode(tmp_path / "ds", episode_id)
        assert result.divergence is None, result.describe()
        assert result.exact and result.replayed_steps == result.steps > 0
    assert replay_episode(tmp_path / "ds", "ep2").seed == 12
    assert main(["replay", str(tmp_path / "ds"), "--episode", "ep0"]) == 0
    assert "with zero divergence" in capsys.readouterr().out


def tamper_reward(episode_id: str, columns: dict[str, list[Any]]) -> None:
    if episode_id == "ep1":
        columns["reward"][5] = 0.5


def tamper_observation(episode_id: str, columns: dict[str, list[Any]]) -> None:
    if episode_id == "ep2":
        columns["observation"][7] = columns["observation"][7] + np.float32(0.25)


@pytest.mark.parametrize(
    ("tamper", "episode_id", "t", "field"),
    [(tamper_reward, "ep1", 5, "reward"), (tamper_observation, "ep2", 7, "observation")],
)
def test_a_tampered_episode_reports_the_first_step_that_differs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tamper: Callable[..., None],
    episode_id: str,
    t: int,
    field: str,
) -> None:
    record(tmp_path / "ds", tamper=tamper)
    argv = ["replay", str(tmp_path / "ds"), "--episode", episode_id, "--json"]
    assert main(argv) == 1
    result = json.loads(capsys.readouterr().out)
    assert (result["divergence"]["t"], result["divergence"]["field"]) == (t, field)
    if field == "reward":
        assert (result["divergence"]["recorded"], result["divergence"]["replayed"]) == (0.5, 1.0)
    assert main(["replay", str(tmp_path / "ds"), "--episode", "ep0"]) == 0  # others untouched


def test_render_writes_an_animated_gif(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record(tmp_path / "ds")
    out = tmp_path / "ep3.gif"
    assert main(["replay", str(tmp_path / "ds"), "--episode", "ep3", "--render", str(out)]) == 0
    steps = replay_episode(tmp_path / "ds", "ep3").steps
    with Image.open(out) as image:
        assert image.format == "GIF"
        assert image.size == (600, 400)
        durations = []
        for index in range(image.n_frames):
            image.seek(index)
            durations.append(image.info["duration"])
    # the reset frame and one per step, at CartPole's 50 fps (Pillow merges identical frames)
    assert sum(durations) == (steps + 1) * 20
    assert len(durations) > steps // 2
    assert f"wrote {out.resolve()}" in capsys.readouterr().out


def test_an_env_that_cannot_be_rebuilt_draws_the_trajectory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record(tmp_path / "ds", env_id="ExternalSimulator-v0")
    argv = ["replay", str(tmp_path / "ds"), "--episode", "ep0"]
    assert main(argv) == 2
    assert "cannot rebuild the env ('ExternalSimulator-v0'" in capsys.readouterr().err
    assert main([*argv, "--render", str(tmp_path / "ep0.gif")]) == 0
    with Image.open(tmp_path / "ep0.png") as image:
        assert image.format == "PNG"


def test_unknown_episode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record(tmp_path / "ds")
    assert main(["replay", str(tmp_path / "ds"), "--episode", "nope"]) == 2
    assert "no steps of episode 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["local", "remote"])
def test_resend_to_a_server_reingests_episodes_that_still_replay_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    from server_fixtures import cartpole_config, running_server

    ids = record(tmp_path / "ds")
    received = tmp_path / "received"
    with running_server(cartpole_config(received)) as server:
        argv = ["replay", str(tmp_path / "ds"), "--to", server.url, "--inference-mode", mode]
        assert main(argv) == 0
    sent = {str(e.episode_ids[0]): e for e in InputReader(tmp_path / "ds", episodes=True)}
    got = {str(e.episode_ids[0]): e for e in InputReader(received, episodes=True)}
    assert sorted(got) == sorted(ids)
    steps = sum(len(e.rewards) for e in sent.values())
    assert f"re-sent {len(ids)} episodes ({steps} steps) to {server.url}" in capsys.readouterr().out
    for episode_id, episode in sent.items():
        np.testing.assert_array_equal(got[episode_id].rewards, episode.rewards)
        np.testing.assert_array_equal(got[episode_id].actions, episode.actions)
        np.testing.assert_array_equal(got[episode_id].observations, episode.observations)
        assert got[episode_id].terminateds[-1] == episode.terminateds[-1]
        assert replay_episode(received, episode_id).exact  # seed and options came along
