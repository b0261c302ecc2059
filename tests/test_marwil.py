"""MARWIL: returns over whole episodes, the BC limit at beta = 0, and learning on CartPole."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trainer_factories import read_all, scripted_cartpole

from pipeline import read_manifest
from pipeline.errors import ConfigError
from pipeline.trainers.evaluation import evaluate
from pipeline.trainers.marwil import MARWIL, MARWILConfig


def _trainer(path: Path, **config: Any) -> MARWIL:
    manifest = read_manifest(path)
    return MARWIL(manifest.observation_space, manifest.action_space, MARWILConfig(**config))


def test_marwil_learns_from_noisy_cartpole_logs(tmp_path: Path) -> None:
    path = scripted_cartpole(tmp_path / "ds", steps=3000, epsilon=0.3)
    trainer = _trainer(path, lr=3e-3, hidden=(32, 32))
    data = read_all(path)
    rng, losses = np.random.default_rng(0), []
    for step in range(300):
        if step % 100 == 0:  # returns bootstrap truncations from V, so refresh them as V learns
            rows = trainer.with_targets(data)
        losses.append(trainer.update(rows[rng.integers(len(rows), size=256)])["value_loss"])
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:5])
    assert evaluate(trainer.checkpoint(1), "CartPole-v1", episodes=3) > 150


def test_marwil_returns_restart_at_each_episode(tmp_path: Path) -> None:
    path = scripted_cartpole(tmp_path / "ds", steps=250, epsilon=0.0)
    data = read_all(path)
    trainer = _trainer(path, gamma=0.5)
    returns = trainer.returns(data)
    # the first episode is truncated at t = 199 by the time limit and bootstraps from
    # V(next_observation): G_199 = 1 + 0.5 * V
    first = data.episode_ids == data.episode_ids[0]
    assert first.sum() == 200 and data.truncateds[first][-1]
    v = trainer.value(_flat(trainer, data.next_observations[first][-1:])).item()
    assert returns[first][-1] == pytest.approx(1 + 0.5 * v, rel=1e-5)
    # far from the end, G = 1 + 0.5 + 0.25 + ... = 2
    assert returns[first][0] == pytest.approx(2.0, abs=1e-6)


def test_marwil_beta_zero_is_behaviour_cloning(tmp_path: Path) -> None:
    path = scripted_cartpole(tmp_path / "ds", steps=300, epsilon=0.5)
    trainer = _trainer(path, beta=0.0)
    metrics = trainer.update(read_all(path))
    assert metrics["mean_weight"] == 1.0
    assert metrics["policy_loss"] == pytest.approx(-metrics["logp"])


def test_marwil_resumes_from_state_dict(tmp_path: Path) -> None:
    path = scripted_cartpole(tmp_path / "ds", steps=300, epsilon=0.5)
    data = read_all(path)
    first = _trainer(path)
    first.update(data)
    second = _trainer(path, seed=5)
    second.load_state_dict(first.state_dict())
    assert first.update(data) == second.update(data)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beta": -1.0}, "MARWILConfig.beta: expected a number >= 0, got -1.0"),
        ({"gamma": 2}, "MARWILConfig.gamma: expected a number in [0, 1], got 2"),
        ({"max_weight": 0}, "MARWILConfig.max_weight: expected a number > 0, got 0"),
    ],
)
def test_marwil_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        MARWILConfig(**kwargs)


def _flat(trainer: MARWIL, observations: Any) -> Any:
    from pipeline.trainers.networks import observations_tensor

    return observations_tensor(trainer.policy.observation_space, observations)
