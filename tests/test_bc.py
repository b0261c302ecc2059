"""BC learns the scripted controller from its logs, on CartPole and on a Box-action bandit."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trainer_factories import bandit, bandit_reward, read_all, scripted_cartpole

from pipeline.errors import ConfigError
from pipeline.policy.network import NumpyPolicy
from pipeline.trainers.bc import BC, BCConfig
from pipeline.trainers.buffer import ReplayBuffer
from pipeline.trainers.evaluation import evaluate


def _train(trainer: Any, path: Path, updates: int, size: int = 256) -> list[float]:
    buffer = ReplayBuffer(seed=0)
    buffer.add(read_all(path))
    return [trainer.update(buffer.sample(size))["loss"] for _ in range(updates)]


def test_bc_clones_a_cartpole_controller(tmp_path: Path) -> None:
    path = scripted_cartpole(tmp_path / "ds", steps=3000, epsilon=0.1)
    data = read_all(path)
    trainer = BC(*_spaces(path), BCConfig(lr=3e-3, hidden=(32, 32)))
    losses = _train(trainer, path, updates=300)
    assert np.mean(losses[-20:]) < 0.7 * np.mean(losses[:5])
    assert len(data) == 3000
    # random play lasts about 22 steps; the clone holds the pole far longer
    assert evaluate(trainer.checkpoint(1), "CartPole-v1", episodes=3) > 150


def test_bc_box_actions_on_a_bandit(tmp_path: Path) -> None:
    path = bandit(tmp_path / "ds", steps=2000, discrete=False, expert=True)
    trainer = BC(*_spaces(path), BCConfig(lr=3e-3, hidden=(32,)))
    losses = _train(trainer, path, updates=300)
    assert losses[-1] < losses[0]
    s = np.linspace(-1, 1, 101, dtype=np.float32)[:, None]
    actions, _ = NumpyPolicy(trainer.checkpoint(1)).act(s, np.random.default_rng(0), explore=False)
    # random actions score about -0.67; the expert about -0.01
    assert bandit_reward(actions, s, discrete=False) > -0.05


def test_bc_resumes_from_state_dict_exactly(tmp_path: Path) -> None:
    path = bandit(tmp_path / "ds", steps=500, discrete=True, expert=True)
    data = read_all(path)
    first = BC(*_spaces(path), BCConfig(seed=1))
    for _ in range(3):
        first.update(data)
    second = BC(*_spaces(path), BCConfig(seed=2))
    second.load_state_dict(first.state_dict())
    assert second.updates == 3
    # Adam's moments came along too, so the next step is the same step
    assert first.update(data) == second.update(data)
    for name, array in first.checkpoint(4).weights.items():
        np.testing.assert_array_equal(array, second.checkpoint(4).weights[name])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": 0}, "BCConfig.lr: expected a number > 0, got 0"),
        ({"ent_coef": -1.0}, "BCConfig.ent_coef: expected a number >= 0, got -1.0"),
        (
            {"hidden": ()},
            "BCConfig.hidden: expected a non-empty tuple of positive integers, got ()",
        ),
        (
            {"activation": "gelu"},
            "BCConfig.activation: expected one of ('tanh', 'relu'), got 'gelu'",
        ),
    ],
)
def test_bc_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        BCConfig(**kwargs)


def test_bc_rejects_multi_discrete_actions() -> None:
    import gymnasium as gym

    with pytest.raises(ConfigError, match=re.escape("BC.action_space: expected a Discrete or Box")):
        BC(gym.spaces.Box(-1, 1, (2,)), gym.spaces.MultiDiscrete([2, 3]))


def _spaces(path: Path) -> tuple[Any, Any]:
    from pipeline import read_manifest

    manifest = read_manifest(path)
    return manifest.observation_space, manifest.action_space
