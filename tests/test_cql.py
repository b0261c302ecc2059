"""CQL learns bandits from random logged actions (Discrete and Box), keeps Q conservative and
exports its twin critics in the checkpoint's layout."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from trainer_factories import bandit, bandit_reward, read_all

from pipeline import read_manifest
from pipeline.errors import ConfigError
from pipeline.policy.network import NumpyPolicy
from pipeline.trainers.buffer import ReplayBuffer
from pipeline.trainers.cql import CQL, CQLConfig
from pipeline.trainers.networks import MLP

SMALL = {"hidden": (32, 32), "lr": 3e-3, "policy_lr": 3e-3, "tau": 0.05}


def _train(path: Path, updates: int, **config: Any) -> tuple[CQL, list[dict[str, float]]]:
    manifest = read_manifest(path)
    trainer = CQL(manifest.observation_space, manifest.action_space, CQLConfig(**config))
    buffer = ReplayBuffer(seed=0)
    buffer.add(read_all(path))
    return trainer, [trainer.update(buffer.sample(128)) for _ in range(updates)]


@pytest.mark.parametrize("discrete", [True, False])
def test_cql_learns_the_best_action_from_random_logs(tmp_path: Path, discrete: bool) -> None:
    path = bandit(tmp_path / "ds", steps=2000, discrete=discrete)
    # bc_iters: the warm-up runs too; a temperature for rewards of this scale
    extra = {} if discrete else {"num_actions": 4, "bc_iters": 50, "alpha": 0.1, "cql_alpha": 1.0}
    trainer, metrics = _train(path, 300 if discrete else 150, **SMALL, **extra)
    losses = [m["td_loss"] for m in metrics]
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:5])
    s = np.linspace(-1, 1, 100, dtype=np.float32)[:, None]
    actions, _ = NumpyPolicy(trainer.checkpoint(1)).act(s, np.random.default_rng(0), False)
    # random actions score 0.5 (Discrete) and about -0.67 (Box)
    assert bandit_reward(actions, s, discrete) > (0.9 if discrete else -0.15)


def test_cql_discrete_q_is_conservative(tmp_path: Path) -> None:
    # the logs only ever try action 0; CQL must not value the untried action 1 above it
    path = bandit(tmp_path / "ds", steps=500, discrete=True, expert=True)
    data = read_all(path)
    keep = data.actions == 0
    buffer = ReplayBuffer(seed=0)
    buffer.add(data[keep])
    manifest = read_manifest(path)
    trainer = CQL(manifest.observation_space, manifest.action_space, CQLConfig(**SMALL))
    for _ in range(100):
        trainer.update(buffer.sample(64))
    with torch.no_grad():
        q = trainer.q(torch.as_tensor(data.observations[keep]))
    assert (q[:, 1] < q[:, 0]).all()


@pytest.mark.parametrize("discrete", [True, False])
def test_cql_resumes_from_state_dict(tmp_path: Path, discrete: bool) -> None:
    path = bandit(tmp_path / "ds", steps=64, discrete=discrete)
    data = read_all(path)
    manifest = read_manifest(path)
    spaces = (manifest.observation_space, manifest.action_space)
    first = CQL(*spaces, CQLConfig(hidden=(8,), bc_iters=1))
    first.update(data)
    second = CQL(*spaces, CQLConfig(hidden=(8,), bc_iters=1, seed=4))
    second.load_state_dict(first.state_dict())
    torch.manual_seed(1)  # Box updates draw actions: the same draws for both
    expected = first.update(data)
    torch.manual_seed(1)
    assert second.update(data) == expected


def test_cql_box_checkpoint_carries_both_critics_in_mlp_layout(tmp_path: Path) -> None:
    # the twin critics train as one batched network; exported, each is a plain MLP's weights
    path = bandit(tmp_path / "ds", steps=64, discrete=False)
    manifest = read_manifest(path)
    trainer = CQL(manifest.observation_space, manifest.action_space, CQLConfig(hidden=(8, 4)))
    trainer.update(read_all(path))
    weights = trainer.checkpoint(1).weights
    x, a = torch.randn(5, 1), torch.rand(5, 1)
    with torch.no_grad():
        q = trainer.critics(x, a)
    for index, prefix in enumerate(("q1", "q2")):
        mlp = MLP(2, (8, 4), 1, "relu")
        mine = {k[3:]: torch.as_tensor(v) for k, v in weights.items() if k[:3] == f"{prefix}."}
        mlp.load_state_dict({f"layers.{key}": value for key, value in mine.items()})
        with torch.no_grad():
            expected = mlp(torch.cat([x, a], dim=-1)).squeeze(-1)
        torch.testing.assert_close(q[index], expected)


@pytest.mark.parametrize(("discrete", "alpha"), [(True, 1.0), (False, 20.0)])
def test_cql_alpha_defaults_by_action_space(discrete: bool, alpha: float) -> None:
    action_space = gym.spaces.Discrete(2) if discrete else gym.spaces.Box(-1.0, 1.0, (1,))
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,))
    assert CQL(observation_space, action_space, CQLConfig(hidden=(4,))).cql_alpha == alpha
    assert (
        CQL(observation_space, action_space, CQLConfig(hidden=(4,), cql_alpha=3.0)).cql_alpha == 3.0
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cql_alpha": -1}, "CQLConfig.cql_alpha: expected a number >= 0, got -1"),
        ({"num_actions": 0}, "CQLConfig.num_actions: expected an integer >= 1, got 0"),
        ({"policy_lr": 0}, "CQLConfig.policy_lr: expected a number > 0, got 0"),
        (
            {"target_entropy": "auto"},
            "CQLConfig.target_entropy: expected a number or None, got 'auto'",
        ),
    ],
)
def test_cql_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        CQLConfig(**kwargs)
