"""SAC learns a Box-action bandit from random logged actions; terminated rows do not bootstrap."""

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
from pipeline.trainers.sac import SAC, SACConfig

SMALL = {"hidden": (32, 32), "lr": 3e-3}


def _trainer(path: Path, **config: Any) -> SAC:
    manifest = read_manifest(path)
    return SAC(manifest.observation_space, manifest.action_space, SACConfig(**config))


def test_sac_learns_the_best_action_from_random_logs(tmp_path: Path) -> None:
    path = bandit(tmp_path / "ds", steps=2000, discrete=False)
    trainer = _trainer(path, **SMALL, tau=0.05)
    buffer = ReplayBuffer(seed=0)
    buffer.add(read_all(path))
    losses = [trainer.update(buffer.sample(128))["critic_loss"] for _ in range(250)]
    assert np.mean(losses[-20:]) < 0.2 * np.mean(losses[:5])
    s = np.linspace(-1, 1, 101, dtype=np.float32)[:, None]
    policy = NumpyPolicy(trainer.checkpoint(1))
    actions, _ = policy.act(s, np.random.default_rng(0), explore=False)
    # random actions score about -0.67, the best action 0
    assert bandit_reward(actions, s, discrete=False) > -0.1


def test_sac_target_ignores_next_observation_only_when_terminated(tmp_path: Path) -> None:
    path = bandit(tmp_path / "ds", steps=4, discrete=False)
    data = read_all(path)
    trainer = _trainer(path, hidden=(8,), gamma=0.5)
    t = trainer.tensors(data)
    with torch.no_grad():
        for p in trainer.q1_target.parameters():
            p.zero_()
        for p in trainer.q2_target.parameters():
            p.zero_()
        trainer.q1_target.layers[-1].bias.fill_(10.0)
        trainer.q2_target.layers[-1].bias.fill_(10.0)
        trainer.log_alpha.fill_(-30.0)  # no entropy term: the target is r + gamma * 10 or r
    q = trainer.q1(torch.cat([t["x"], t["a"]], -1)).squeeze(-1).detach()
    loss, _ = trainer.critic_loss(t)  # all four rows terminated: target = r
    q2 = trainer.q2(torch.cat([t["x"], t["a"]], -1)).squeeze(-1).detach()
    expected = 0.5 * ((q - t["r"]).pow(2).mean() + (q2 - t["r"]).pow(2).mean())
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    t["terminated"] = torch.zeros(4)  # as if truncated: bootstraps from the target critics
    loss, _ = trainer.critic_loss(t)
    target = t["r"] + 0.5 * 10.0
    expected = 0.5 * ((q - target).pow(2).mean() + (q2 - target).pow(2).mean())
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)


def test_sac_resumes_from_state_dict(tmp_path: Path) -> None:
    path = bandit(tmp_path / "ds", steps=64, discrete=False)
    data = read_all(path)
    first = _trainer(path, hidden=(16,))
    first.update(data)
    second = _trainer(path, hidden=(16,), seed=3)
    second.load_state_dict(first.state_dict())
    torch.manual_seed(7)
    expected = first.update(data)
    torch.manual_seed(7)
    assert second.update(data) == expected


def test_sac_rejects_discrete_actions() -> None:
    with pytest.raises(ConfigError, match=re.escape("SAC.action_space: expected a Box space")):
        SAC(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tau": 1.5}, "SACConfig.tau: expected a number in [0, 1], got 1.5"),
        ({"alpha": 0}, "SACConfig.alpha: expected a number > 0, got 0"),
        ({"target_entropy": True}, "SACConfig.target_entropy: expected a number or None"),
    ],
)
def test_sac_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        SACConfig(**kwargs)
